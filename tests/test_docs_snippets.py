"""The documentation's snippets run as written.

* Every ```python block of README.md and docs/*.md is executed on its own, twice (a fresh namespace each time, no
  state shared with the blocks before it; the second run finds the first one's files) in a scratch working directory
  that sees the repository's `tests/` and `configs/` folders, so a snippet may read `tests/data/...` and write
  `runs/...` freely. Models come from the usual cache
  (`tiny-random` costs seconds; the warm-started `tiny` is trained once, then cached).
* A block that imports an optional extra (trl, verl, vllm) is skipped with that reason when the extra is missing.
* A block may opt out with a comment line `# docs-test: skip (why)` — keep that rare (e.g. a Hub download, or a
  file the reader is expected to provide).
* Every `p3o train ...` command line in a ```bash block is parsed with `p3o.config.load_config`, so documented
  keys and values are valid (nothing is trained).
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest
import venv_checks

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SKIP_MARK = "docs-test: skip"
EXTRAS = {"trl": "trl", "verl": "verl", "vllm": "vllm", "p3o.integrations.trl": "trl", "p3o.integrations.verl": "verl"}
_BLOCK = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.S | re.M)
_IMPORT = re.compile(r"^\s*(?:from|import)\s+([\w.]+)", re.M)


def _blocks(lang: str) -> list:
    out = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for m in _BLOCK.finditer(text):
            if m.group(1) == lang:
                line = text.count("\n", 0, m.start()) + 2  # the first line of code
                out.append(pytest.param(m.group(2), id=f"{path.relative_to(ROOT)}:{line}"))
    return out


def test_the_docs_have_python_snippets():
    ids = [p.id for p in _blocks("python")]
    assert any(i.startswith("README.md:") for i in ids) and any(i.startswith("docs/training.md:") for i in ids)


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """A working directory with the repository's tests/ and configs/ linked in; offline; single-threaded torch."""
    import torch

    for name in ("tests", "configs"):
        (tmp_path / name).symlink_to(ROOT / name, target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    monkeypatch.setenv("WANDB_MODE", "disabled")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield tmp_path
    torch.set_num_threads(threads)


@pytest.mark.parametrize("code", _blocks("python"))
def test_python_snippet_runs(code, scratch, request, capsys):
    if SKIP_MARK in code:
        reason = code.split(SKIP_MARK, 1)[1].splitlines()[0].strip(" :—-()") or "marked in the docs"
        pytest.skip(f"opted out: {reason}")
    for module in _IMPORT.findall(code):
        for prefix, extra in EXTRAS.items():
            if module == prefix or module.startswith(prefix + "."):
                pytest.importorskip(extra, reason=f"needs the optional extra '{extra}' (pip install 'p3o[{extra}]')")
    where = request.node.callspec.id
    for attempt in ("", " when run a second time"):  # a reader reruns a snippet: it must not trip over its own outputs
        namespace = {"__name__": "__docs_snippet__"}
        try:
            exec(compile(code, where, "exec"), namespace)
        except BaseException as err:
            if isinstance(err, pytest.skip.Exception):
                raise
            numbered = "\n".join(f"{i:3d}  {line}" for i, line in enumerate(code.splitlines(), 1))
            pytest.fail(f"{where}: the snippet raised {type(err).__name__}{attempt}: {err}\n{numbered}", pytrace=True)


def _train_commands() -> list:
    out = []
    for param in _blocks("bash"):
        (code,) = param.values
        for line in code.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if "train" not in words or not any(w == "p3o" or w.endswith("/p3o") for w in words):
                continue
            args = words[words.index("train") + 1 :]
            out.append(pytest.param(args, id=f"{param.id}: {' '.join(words)[:80]}"))
    return out


def test_train_command_lines_are_found():
    assert len(_train_commands()) >= 5


@pytest.mark.parametrize("args", _train_commands())
def test_documented_train_command_is_valid(args, monkeypatch, tmp_path):
    from p3o.config import list_presets, load_config

    if {"-h", "--help"} & set(args):
        return
    for i, a in enumerate(args[:-1]):
        if a == "--config" and args[i + 1] not in list_presets():
            pytest.skip(f"--config {args[i + 1]}: a file the reader's earlier run writes")
    monkeypatch.setitem(os.environ, "WORLD_SIZE", "1")
    load_config([a for a in args if a not in ("--allow-changes", "--allow_changes")])  # a flag of p3o train, not a key


# ----------------------------------------------------------------------------------- figures their command gives

# Commands whose tables the docs quote and that run here in a minute or two (an untrained random model, the tiny
# base): (pattern of the command in the text, how to run it). A table is the first markdown table within a few lines
# after the line naming the command; each of its rows the command produces (same engine and precision) must match.
_FIGURE_COMMANDS = [
    (re.compile(r"benchmarks/precision\.py((?: --[\w-]+ [\w.,+-]+)*)"), "precision"),
    (re.compile(r"\bp3o mismatch((?: --[\w-]+ [\w./,+-]+)*)"), "mismatch"),
]
_PRECISIONS = ("bf16+kv-fp8", "fp32", "bf16", "fp16", "int8", "fp8")


def _cells(line: str) -> list[str]:
    """The cells of a markdown table line (an escaped pipe ``\\|`` stays inside its cell, unescaped)."""
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip()[1:-1])]


def _table_after(lines: list[str], start: int, within: int = 14) -> list[dict[str, str]] | None:
    """The first markdown table starting within `within` lines after `start`: its rows as {header: cell}."""
    for i in range(start + 1, min(len(lines), start + 1 + within)):
        if lines[i].startswith("|") and i + 1 < len(lines) and re.match(r"^\|[-:| ]+\|$", lines[i + 1].strip()):
            head = _cells(lines[i])
            rows = []
            for line in lines[i + 2 :]:
                if not line.startswith("|"):
                    break
                rows.append(dict(zip(head, _cells(line), strict=False)))
            return rows
    return None


def _row_key(row: dict[str, str]) -> tuple[str, str] | None:
    """(engine, precision) of a table row, from its first cell ('HFEngine fp8 (simulated W8A8)', 'fp8 (e4m3)')."""
    label = next(iter(row.values())).lower()
    prec = next((p for p in _PRECISIONS if re.search(rf"(^|\s){re.escape(p)}(\s|$|\()", label)), None)
    if "kv fp8" in label and prec == "bf16":
        prec = "bf16+kv-fp8"
    return ("vllm" if "vllm" in label else "hf", prec) if prec else None


def _cell(row: dict[str, str], *names: str) -> float:
    key = next(k for k in row if k in names)
    return float(row[key])


def _figure_sites() -> list:
    """(doc:line, kind, args) of every quoted figure table whose command can be rerun here."""
    out = []
    for path in DOCS:
        lines = path.read_text(encoding="utf-8").splitlines()
        for n, line in enumerate(lines):
            for pattern, kind in _FIGURE_COMMANDS:
                m = pattern.search(line)
                if m is None or _table_after(lines, n) is None:
                    continue
                args = shlex.split(m.group(1))
                opts = dict(zip(args[::2], args[1::2], strict=False))
                if opts.get("--engine", "hf") != "hf" or opts.get("--model") not in ("tiny", "random"):
                    continue  # vLLM needs .venv-vllm; other models are not quick
                for drop in ("--plot", "--out"):
                    if drop in opts:
                        i = args.index(drop)
                        del args[i : i + 2]
                marks = _isa_skip(lines, n) if opts.get("--model") == "tiny" else ()
                out.append(pytest.param(path, n, kind, args, id=f"{path.relative_to(ROOT)}:{n + 1}", marks=marks))
    return out


_ISA_TAG = re.compile(r"measured on (?:the |an? )?(AVX-512|AVX2)(?: box| CPU)?( without AVX512-BF16)?", re.IGNORECASE)


def _isa_skip(lines: list[str], start: int, within: int = 14) -> tuple:
    """A skip mark for a tiny-model table measured on another CPU kind than this one.

    The warm-started tiny base is trained on this machine, and AVX2-only and AVX-512 CPUs build different bases from
    the same code (docs/main-job.md), so a table of `--model tiny` says which kind it was measured on ("measured on
    the AVX2 box" / "AVX-512"), and only a machine of that kind can regenerate it; an untagged table is compared."""
    from p3o.rollout.capabilities import cpu_isa

    text = " ".join(lines[start : start + within])
    m = _ISA_TAG.search(text)
    if m is None:
        return ()
    isa = cpu_isa()
    here = "AVX-512" if isa.avx512 else "AVX2"
    there = m.group(1).upper()
    if there != here:
        return (pytest.mark.skip(reason=f"a tiny-model table measured on an {there} CPU; this one is {here}"),)
    if m.group(2) and isa.avx512_bf16:  # bf16 matmuls round otherwise where the CPU has native bf16 dot products
        return (
            pytest.mark.skip(reason="a bf16 table measured on an AVX-512 CPU without AVX512-BF16; this one has it"),
        )
    return ()


_REGENERATED: dict[tuple, list[dict[str, str]]] = {}


def _figure_command(kind: str, args: tuple[str, ...]) -> list[dict[str, str]]:
    """Run one figure command (single-threaded, as the docs' tables were measured) and parse its summary table."""
    import sys

    cmd = [sys.executable, str(ROOT / "benchmarks" / "precision.py")] if kind == "precision" else [
        sys.executable, "-m", "p3o", "mismatch"]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    code, out, err = venv_checks.run_tracked([*cmd, *args], cwd=ROOT, env=env, timeout=1800)
    assert code in (0, 1), err[-2000:]  # p3o mismatch: 1 when a finding fires
    lines = out.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("| engine")) - 1
    return _table_after(lines, start) or []


def _regenerate(kind: str, args: list[str]) -> list[dict[str, str]]:
    """The summary table the command prints (run once per command and argument list in this session; started in
    the background by `prestart` when the suite selects the test)."""
    key = (kind, tuple(args))
    if key not in _REGENERATED:
        _REGENERATED[key] = venv_checks.collect(("figures", *key), _figure_command, kind=kind, args=tuple(args))
    return _REGENERATED[key]


def prestart(items: list[pytest.Item]) -> None:
    """Queue the figure commands of the selected `test_quoted_figures_are_what_their_command_gives` cases on the
    suite's background runner (tests/conftest.py): they are subprocesses, independent of the rest."""
    for item in items:
        spec = getattr(item, "callspec", None)
        if item.originalname == "test_quoted_figures_are_what_their_command_gives" and spec is not None:
            kind, args = spec.params["kind"], tuple(spec.params["args"])
            venv_checks.submit(("figures", kind, args), _figure_command, kind=kind, args=args)


def test_figure_tables_are_found():
    assert len(_figure_sites()) >= 2


@pytest.mark.slow
@pytest.mark.parametrize(("path", "line", "kind", "args"), _figure_sites())
def test_quoted_figures_are_what_their_command_gives(path, line, kind, args):
    """A table of mean |Δlogp| and batch ESS in the docs is what the command named above it prints (CPU, seed 0):
    mean |Δlogp| within 10% (or 1e-6), the ESS's distance to 1 within 10% (or 1e-5), the token count within 5%
    (library versions and thread counts change which tokens are sampled, not the size of the gap).

    `--model tiny` is the shipped warm-started base (`p3o/models/shipped/tiny`): a failure after it is re-shipped with
    new weights means the quoted table is from the old one; rerun the command and paste its table."""
    quoted = _table_after(path.read_text(encoding="utf-8").splitlines(), line) or []
    fresh = {_row_key(r): r for r in _regenerate(kind, args)}
    if "tiny" in args:
        from p3o.models.bases import base_id, stamp

        args = [*args, f"(base {base_id(stamp('tiny'))})"]  # named in a failure
    compared = 0
    for row in quoted:
        got = fresh.get(_row_key(row))
        if got is None:
            continue  # a row this command does not produce here (vLLM)
        compared += 1
        where = f"{path.relative_to(ROOT)}:{line + 1} {next(iter(row.values()))} vs `{kind} {' '.join(args)}`"
        dlogp, dlogp_new = _cell(row, "mean abs dlogp", "mean |Δlogp|"), _cell(got, "mean abs dlogp")
        ess, ess_new = _cell(row, "batch ESS"), _cell(got, "batch ESS")
        assert abs(dlogp - dlogp_new) <= max(1e-6, 0.1 * dlogp_new), (where, "mean |Δlogp|", dlogp, dlogp_new)
        assert abs(ess - ess_new) <= max(1e-5, 0.1 * (1 - ess_new)), (where, "batch ESS", ess, ess_new)
        tokens, tokens_new = _cell(row, "tokens"), _cell(got, "tokens")
        assert abs(tokens - tokens_new) <= 0.05 * tokens_new, (where, "tokens", tokens, tokens_new)
    assert compared, f"{path.relative_to(ROOT)}:{line + 1}: no row of the table is one the command gives"
