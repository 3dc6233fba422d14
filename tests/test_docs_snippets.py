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
