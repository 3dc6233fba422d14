"""`p3o train` end to end: a few steps of the real entry point on the tiny model (offline), and bad options."""

from __future__ import annotations

import contextlib
import io
import json
import os
import runpy
import subprocess
import sys
import warnings
from typing import Any

import pytest

from p3o.cli import main as p3o_main


def test_train_smoke_offline(tmp_path):
    run_dir = tmp_path / "run"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable, "-m", "p3o", "train", "--model.name", "tiny-random", "--steps", "2",
        "--rollout.prompts_per_step", "2", "--rollout.group_size", "2", "--rollout.max_new_tokens", "8",
        "--run_dir", str(run_dir), "--log.tensorboard", "false", "--log.progress", "false", "--ckpt.every", "1",
        "--task.n_eval", "16",  # 16 held-out problems, not 512: the evaluation's plumbing, in a fraction of the time
    ]  # fmt: skip
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]  # step 0: the starting policy's held-out evaluation
    assert "eval_accuracy" in rows[0] and "reward_mean" not in rows[0]
    assert all(0.0 <= r["reward_mean"] <= 1.0 for r in rows[1:])
    assert (run_dir / "config.yaml").is_file() and (run_dir / "plot.png").is_file()
    assert (run_dir / "final" / "config.json").is_file() and (run_dir / "final" / "tokenizer.json").is_file()
    assert (run_dir / "checkpoints" / "step_000001").is_dir()
    assert "reward_mean" in out.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--optim.lr", "-1"], "optim.lr"),
        (["--optim.lrr", "1e-3"], "did you mean 'optim.lr'"),
        (["--loop.mode", "turbo"], "loop.mode"),
        (["--objective.name", "p3oo"], "objective.name"),
        (["--objective.clip_epss", "0.2", "--objective.name", "grpo"], "objective.clip_epss"),
        (["--rollout.group_size", "many"], "rollout.group_size"),
    ],
)
def test_bad_config_exits_2_with_one_line(args, needle, capsys, tmp_path):
    code = p3o_main(["train", "--run_dir", str(tmp_path / "never"), *args])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and needle in err, err
    assert not (tmp_path / "never").exists()


def test_help_lists_options(capsys):
    assert p3o_main(["train", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--loop.max_lag" in out and "--objective.name" in out


def test_no_arguments_prints_the_commands_and_trains_nothing(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert p3o_main([]) == 2
    err = capsys.readouterr().err
    for name in ("train", "eval", "compare", "plot", "sft"):
        assert f"  {name} " in err
    assert not (tmp_path / "runs").exists()  # no silent training run
    assert p3o_main(["--help"]) == 0 and "train" in capsys.readouterr().out


def test_p3o_warns_when_micro_batch_is_smaller_than_the_step(capsys, monkeypatch, tmp_path):
    import p3o.train.loop as loop_mod
    from p3o.config import load_config
    from p3o.train.cli import ess_scope_warning

    # 16 prompts x 4 samples = 64 sequences per optimizer step, micro-batches of 16
    small = ["--update.micro_batch_size", "16"]
    assert "part of the objective" in ess_scope_warning(load_config(small))
    assert ess_scope_warning(load_config(small), world_size=4) is None  # the ESS is all-reduced over the 4 ranks
    assert ess_scope_warning(load_config([])) is None  # the default job: one micro-batch of 64 per step
    assert ess_scope_warning(load_config([*small, "--update.num_mini_batches", "4"])) is None  # 16 rows per step
    assert ess_scope_warning(load_config(["--objective.scope", "step"])) is None
    assert ess_scope_warning(load_config(["--objective.scope", "micro-batch"])) is None  # a knowing choice
    assert ess_scope_warning(load_config(["--objective.name", "grpo"])) is None
    assert "no step scope" in ess_scope_warning(load_config([*small, "--objective.name", "p3o_two_anchor"]))
    # a token budget cuts the ESS set by tokens: said even for an explicit micro-batch scope, silent for step scope
    budget = ["--update.max_tokens_per_micro_batch", "512"]
    assert "depends on that budget" in ess_scope_warning(load_config(budget))
    assert "depends on that budget" in ess_scope_warning(load_config([*budget, "--objective.scope", "micro-batch"]))
    assert ess_scope_warning(load_config([*budget, "--objective.scope", "step"])) is None
    assert ess_scope_warning(load_config([*budget, "--objective.name", "grpo"])) is None

    monkeypatch.setattr(loop_mod, "run", lambda cfg, **kw: tmp_path)
    assert p3o_main(["train", "--run_dir", str(tmp_path / "r"), *small]) == 0
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "update.micro_batch_size is part of the objective" in err


def test_train_summary_gives_held_out_pass1_and_repeats_the_findings(tmp_path):
    from p3o.train.cli import _summary

    rows = [
        {"step": 0, "eval_accuracy": 0.5},
        {"step": 1, "reward_mean": 0.2, "offpolicy/finding_ratio_tails": 1, "offpolicy/cause_ratio_tails": 2},
        {"step": 2, "reward_mean": 0.4, "offpolicy/finding_ratio_tails": 1, "offpolicy/cause_ratio_tails": 2},
        {"step": 3, "reward_mean": 0.6, "offpolicy/finding_ratio_tails": 0, "eval_accuracy": 0.75},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = _summary(str(tmp_path), 1.0)
    assert "held-out pass@1: 0.500 at step 0 -> 0.750 at step 3 (2 evaluations)" in text
    assert "finding ratio_tails: first at step 1, on 2 steps (cause: engine mismatch)" in text


# One CLI style: every command parses through p3o.options (typed options, one line with the nearest option, exit 2,
# no abbreviations) and its --help has the same layout as `p3o train --help`.
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["doctor", "RUN", "--windw", "3"], "p3o doctor: error: unknown key 'windw' (did you mean 'window'?)"),
        (["eval", "--mod", "x"], "p3o eval: error: unknown key 'mod' (did you mean 'model'?)"),
        (["mismatch", "--precisio", "fp8"], "p3o mismatch: error: unknown key 'precisio' (did you mean 'precision'?)"),
        (["plot", "RUN", "--ou", "x.png"], "p3o plot: error: unknown key 'ou' (did you mean 'out'?)"),
        (["convert-smollm2", "--forc"], "p3o convert-smollm2: error: unknown key 'forc' (did you mean 'force'?)"),
        (["probe", "--objective", "p3o"], "p3o probe: error: unknown key 'objective' (did you mean 'objectives'?)"),
        (["doctor", "RUN", "--window", "0"], "p3o doctor: error: window: must be >= 1, got 0"),
        (
            ["eval", "--model", "tiny", "--n_samples", "x"],
            "p3o eval: error: n_samples: expected an int or null, got 'x'",
        ),
        (["mismatch", "--engine", "trt"], "p3o mismatch: error: engine: expected one of hf, vllm, got 'trt'"),
        (["plot", "A", "B"], "p3o plot: error: unexpected argument 'B' (the command takes 1 argument; options look"),
        (["doctor"], "p3o doctor: error: expected a run directory or metrics file (p3o doctor PATH)"),
    ],
)
def test_every_command_gives_one_line_with_the_nearest_option(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert p3o_main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(message), err
    assert list(tmp_path.iterdir()) == []  # nothing written


@pytest.mark.parametrize("name", ["train", "eval", "mismatch", "doctor", "plot", "convert-smollm2", "probe", "sft"])
def test_every_command_help_has_the_same_layout(name, capsys):
    assert p3o_main([name, "--help"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"usage: p3o {name}"), lines[0]
    assert "options (--key value or --key=value; values are YAML scalars):" in lines
    assert "general:" in lines and any(line.startswith("  --config ") for line in lines)
    assert all("[default: " in line for line in lines if line.startswith("  --") and " INT " in line + " ")


def test_documented_options_of_every_command_exist():
    """Every `--key` a doc line gives `p3o eval | doctor | mismatch | plot | probe | convert-smollm2` is an option."""
    import dataclasses
    import re
    from pathlib import Path

    from p3o.eval.cli import EvalOptions
    from p3o.eval.mismatch_cli import MismatchOptions
    from p3o.experiments.probe.cli import ProbeOptions
    from p3o.metrics.doctor import DoctorOptions
    from p3o.metrics.plot import PlotOptions
    from p3o.models.smollm2 import ConvertOptions

    schemas = {
        "eval": EvalOptions, "doctor": DoctorOptions, "mismatch": MismatchOptions, "plot": PlotOptions,
        "probe": ProbeOptions, "convert-smollm2": ConvertOptions,
    }  # fmt: skip
    root = Path(__file__).resolve().parents[1]
    pattern = re.compile(
        r"\bp3o (eval|doctor|mismatch|plot|probe|convert-smollm2)\b(?!:)([^`#|]*)"
    )  # not "p3o eval: error"
    # the option errors benchmarks/cli_startup.py times (docs/benchmarks.md shows them) are misspelt on purpose
    bench = runpy.run_path(str(root / "benchmarks" / "cli_startup.py"))
    deliberate = {" ".join(["p3o", *case]) for case in bench["CASES"]}
    checked = 0
    for path in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for m in pattern.finditer(line):
                if m.group(0).strip() in deliberate:
                    continue
                keys = {f.name for f in dataclasses.fields(schemas[m.group(1)])} | {"config", "help"}
                for opt in re.findall(r"(?<![\w-])--([A-Za-z][\w-]*)", m.group(2)):
                    assert opt.replace("-", "_") in keys, f"{path.name}:{n}: p3o {m.group(1)} has no option --{opt}"
                    checked += 1
    assert checked >= 10


# ---------------------------------------------------------------------------- a newcomer's first hour (issue 47)

_NO_TORCH = """
import contextlib, io, sys
from p3o.cli import main
codes = []
for argv in {argvs!r}:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        codes.append(main(argv))
heavy = [m for m in ("torch", "transformers") if m in sys.modules]
print(codes, heavy)
"""


#: An option error of each command (a misspelt option, or a bad value), answered without torch (exit 2).
OPTION_ERRORS: dict[str, list[list[str]]] = {
    "train": [
        ["--step", "3"], ["--optim.lrr", "1"], ["--objective.name", "grpoo"], ["--clip_eps", "0.2"],
        ["--objective.name", "p3o", "--objective.clip_epz", "0.2"],
        ["--objective.name", "p3o", "--objective.clip_eps", "0.2"],
        ["--objective.name", "grpo", "--objective.clip_eps", "x"],
        ["--objective.name", "cispo", "--objective.clip_eps_low", "0.1", "--objective.trunc_eps_low", "0.2"],
    ],
    "eval": [["--model", "x", "--n_samples", "y"]],
    "compare": [["study.yaml", "--jobz", "2"], ["study.yaml", "--jobs", "0"]],
    "probe": [["--pointz", "3"], ["--points", "x"]],
    "synthetic": [["--seedz", "3"], ["--optimizer", "adamw"]],
    "plot": [["--windoww", "3"]],
    "sft": [["--stepz", "3"], ["--out", "d", "--lr", "0"]],
    "mismatch": [["--top-p", "2"], ["--precison", "bf16"]],
    "doctor": [["--windoww", "3"]],
    "serve": [["--prot", "8000"], ["--port", "x"], ["--tool_format", "hermes9"]],
    "convert-smollm2": [["--forse"], ["--force", "maybe"]],
    "docs": [["no-such-page"]],
    "examples": [["no-such-example"]],
}  # fmt: skip


def test_help_version_and_option_errors_answer_before_torch_loads():
    """`p3o --help`, `--version`, every command's `--help` and its option errors import neither torch nor
    transformers (they took 2-16 s; benchmarks/cli_startup.py measures the start-up, docs/benchmarks.md has the
    figures)."""
    from p3o.cli import COMMANDS

    assert set(OPTION_ERRORS) == set(COMMANDS), "give the new command an option error here"
    helps = [[name, "--help"] for name in COMMANDS]
    errors = [[name, *args] for name, cases in OPTION_ERRORS.items() for args in cases]
    argvs = [["--help"], ["--version"], *helps, ["docs", "metrics"], ["examples"], *errors]
    out = subprocess.run(
        [sys.executable, "-c", _NO_TORCH.format(argvs=argvs)], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    codes = [0] * (4 + len(helps)) + [2] * len(errors)
    assert out.stdout.strip() == f"{codes} []", (argvs, out.stdout)


def test_the_commands_help_snapshot_is_the_commands():
    """The `--help` text and option schema that p3o.cli answers from, without importing a `HELP_SNAPSHOT` command's
    module, are that command's own; each option error it gives is the command's own line (a misspelt option, a
    value of the wrong type or out of bounds, beside the options the command parses itself or a positional)."""
    import importlib

    from p3o.cli import COMMANDS, HELP_SNAPSHOT, _snapshot_answer, command_snapshot
    from p3o.errors import ConfigError

    snap = command_snapshot()
    assert snap == command_snapshot(fresh=True), (
        "regenerate: python -m p3o.cli --help-snapshot > src/p3o/configs/commands-help.json"
    )
    assert set(snap) == set(HELP_SNAPSHOT)
    checked = 0
    for name, entry in snap.items():
        module = importlib.import_module(COMMANDS[name][0])
        first = entry["fields"][0][0]
        cases = [[f"--{first}zz", "1"], [f"--{first.replace('_', '-')}", "1", "--nozz"]]
        for key, tp, _, bounds in entry["fields"]:
            if "str" not in tp:  # a word is not a number, a boolean or one of a set
                cases.append([f"--{key}", "zz"])
            off = {"ge": -1, "gt": 0, "le": 1, "lt": 0}
            cases += [[f"--{key}={value + off[b]}"] for b, value in bounds.items()]
        cases += {"sft": [["--out", "x", "--stepz", "1"], ["--force", "--lr", "0"]],
                  "compare": [["study.yaml", "--jobz", "2"]]}.get(name, [])  # fmt: skip
        for argv in cases:
            with pytest.raises(ConfigError) as err:
                module.main(list(argv))
            with contextlib.redirect_stderr(io.StringIO()) as fast:
                assert _snapshot_answer(name, list(argv)) == 2, (name, argv)
            assert fast.getvalue().strip() == f"p3o {name}: error: {err.value}", (name, argv)
            checked += 1
        assert _snapshot_answer(name, [f"--{first}={entry['fields'][0][2]}"]) is None  # valid: the command runs
    assert checked > 60


def test_version_docs_and_examples(capsys, tmp_path, monkeypatch):
    import importlib.metadata

    assert p3o_main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"p3o {importlib.metadata.version('p3o')}"
    assert p3o_main(["docs", "docs/metrics.md"]) == 0  # the name a message gives works as it is written
    assert capsys.readouterr().out.startswith("# Reading a run")
    assert p3o_main(["docs", "metric"]) == 2
    assert "did you mean 'metrics'" in capsys.readouterr().err
    monkeypatch.chdir(tmp_path)
    assert p3o_main(["examples", "own-task"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["own_reward.py", "own_task.jsonl"]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for name in ("own_reward.py", "own_task.jsonl"):  # the packaged copies are the tests' files
        with open(os.path.join(root, "tests", "data", name), encoding="utf-8") as fh:
            assert (tmp_path / name).read_text(encoding="utf-8") == fh.read(), name
    assert p3o_main(["examples", "own-task"]) == 2  # never overwrites
    assert "exist(s) already" in capsys.readouterr().err
    assert p3o_main(["examples", "study"]) == 0  # a valid study: tests/test_wheel.py runs its grid (dry)
    assert (tmp_path / "study.yaml").read_text(encoding="utf-8").startswith("# p3o compare study.yaml --exploratory")


def test_the_objectives_help_snapshot_is_the_registrys():
    from p3o.config import objective_rows

    assert objective_rows() == objective_rows(fresh=True), (
        "regenerate: python -m p3o.config --objectives > src/p3o/configs/objectives-help.json"
    )


def test_objective_keyword_errors_are_the_registrys_before_torch_loads():
    """The objective keywords `p3o train` checks before torch loads (p3o/configs/objectives-keys.json) are the
    registry's, and every error they give is the registry's own line: an unknown or misspelt keyword, one that
    belongs to another objective, both spellings of one, a value of the wrong type."""
    from p3o import options
    from p3o.config import ObjectiveConfig, _check_objective_keys, objective_keys, parse_type, type_text
    from p3o.errors import ConfigError
    from p3o.objectives import OBJECTIVES

    assert objective_keys() == objective_keys(fresh=True), (
        "regenerate: python -m p3o.config --objective-keys > src/p3o/configs/objectives-keys.json"
    )
    for rec in OBJECTIVES.values():
        for h in rec.hypers.values():
            assert parse_type(type_text(h.type)) == h.type, (rec.name, h.name)

    def message(fn: Any, *args: Any, **kwargs: Any) -> str | None:
        try:
            fn(*args, **kwargs)
        except ConfigError as err:
            return str(err)
        return None

    others = {k for rec in OBJECTIVES.values() for k in rec.hypers}
    checked = 0
    for name, rec in OBJECTIVES.items():
        first = next(iter(rec.hypers))
        cases = [{"zz": 1}, {first + "x": 1}, {first: rec.hypers[first].default}]
        cases += [{k: 1} for k in sorted(others - set(rec.hypers))[:3]]
        cases += [{k: "not-a-value"} for k in rec.hypers]
        cases += [{old: 0.1, new: 0.1} for old, new in rec.aliases.items()]
        cases += [{old: "x"} for old in rec.aliases]
        for hyper in cases:
            fast = message(_check_objective_keys, ObjectiveConfig(name=name, hyper=dict(hyper)))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                slow = message(rec.resolve, hyper, key_prefix="objective.", check=options.check_value, given_only=True)
            assert fast == slow, (name, hyper)
            checked += slow is not None
    assert checked > 100


#: Strings of src/p3o that may name a repository page: (file, page) -> why it is not a message to an installed user.
REPO_PAGES_ALLOWED: dict[tuple[str, str], str] = {
    ("p3o/cli.py", "docs/NAME.md"): "`p3o docs` says which page it prints",
    **{
        ("p3o/experiments/summary/cli.py", page): "the maintainers' summary tool: the repository page it writes"
        for page in ("docs/results/verdicts.md", "docs/results/README.md", "docs/paper-claims.md")
    },
}


#: Messages naming docs/NAME.md that remain in files owned by other work (each one line to change to `p3o docs NAME`
#: there); the test fails once one is gone, so the entry goes with it.
REPO_PAGES_KNOWN: dict[tuple[str, str], str] = {}


def _strings_of(path: Any) -> list[tuple[int, str]]:
    """(line, text) of every string constant of a module that is not a docstring (f-strings' literal parts too)."""
    import ast

    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def test_no_message_names_a_page_an_installed_user_does_not_have(capsys):
    """A message (any string of src/p3o but a docstring) names a page as `p3o docs NAME`, which prints it wherever
    p3o is installed, never as docs/NAME.md (a checkout's file); and every `p3o docs NAME` that src/p3o, the
    packaged examples and presets name is a page `p3o docs` has."""
    import re
    from pathlib import Path

    src = Path(__file__).resolve().parents[1] / "src"
    found = []
    for path in sorted((src / "p3o").rglob("*.py")):
        rel = str(path.relative_to(src))
        for line, text in _strings_of(path):
            found += [
                (rel, line, m) for m in re.findall(r"docs/[\w./-]+\.md", text) if (rel, m) not in REPO_PAGES_ALLOWED
            ]
    known = {(rel, m) for rel, _, m in found if (rel, m) in REPO_PAGES_KNOWN}
    assert known == set(REPO_PAGES_KNOWN), f"fixed, drop from REPO_PAGES_KNOWN: {set(REPO_PAGES_KNOWN) - known}"
    found = [f"{rel}:{line}: {m}" for rel, line, m in found if (rel, m) not in known]
    assert found == [], "name the page as `p3o docs NAME` (or give its text):\n" + "\n".join(found)
    shipped = [
        *(src / "p3o").rglob("*.py"),
        *(src / "p3o" / "examples").iterdir(),
        *(src / "p3o" / "configs").iterdir(),
    ]
    texts = [path.read_text(encoding="utf-8") for path in shipped if path.is_file()]
    named = {m for text in texts for m in re.findall(r"p3o docs ([\w.#/-]+)", text)}
    named -= {"NAME", "docs/NAME.md"}
    assert len(named) >= 8, named
    for name in sorted(named):
        assert p3o_main(["docs", name.rstrip(".,;:)")]) == 0, f"p3o docs {name}: no such page"
    capsys.readouterr()


def test_readme_and_integrations_show_one_trl_snippet():
    import re

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def trl_snippet(name: str) -> str:
        with open(os.path.join(root, name), encoding="utf-8") as fh:
            blocks = re.findall(r"```python\n(.*?)```", fh.read(), flags=re.S)
        (block,) = [b for b in blocks if "P3OGRPOTrainer(" in b and "from datasets import Dataset" in b]
        return block

    readme = trl_snippet("README.md")
    assert readme == trl_snippet("docs/integrations.md")
    assert "logging_steps=1" in readme  # without it trainer_state.json has no per-step rows for p3o doctor


def test_summary_names_the_held_out_count(tmp_path):
    from p3o.train.cli import _summary

    rows = [{"step": 0, "eval_accuracy": 0.5, "eval_problems": 4}, {"step": 1, "reward_mean": 0.2}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert "held-out pass@1 on 4 problems: 0.500 at step 0 (1 evaluation)" in _summary(str(tmp_path), 1.0)


def test_model_loads_are_quiet_unless_asked(monkeypatch):
    """Once per `p3o` process: the libraries' progress bars and advisory lines off (a value the user set is kept),
    their own FutureWarnings filtered; P3O_VERBOSE=1 changes nothing."""
    import warnings

    from p3o.cli import QUIET_ENV, quiet_dependencies

    for key in QUIET_ENV:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("P3O_VERBOSE", "1")
    quiet_dependencies()
    assert not any(key in os.environ for key in QUIET_ENV)
    monkeypatch.delenv("P3O_VERBOSE")
    monkeypatch.setenv("TRANSFORMERS_VERBOSITY", "info")  # the user's own choice stays
    with warnings.catch_warnings():
        quiet_dependencies()
        assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1" and os.environ["TRANSFORMERS_VERBOSITY"] == "info"
        with warnings.catch_warnings(record=True) as seen:
            warnings.warn_explicit("internal", FutureWarning, "x.py", 1, module="transformers.modeling_utils")
            warnings.warn_explicit("mine", FutureWarning, "x.py", 1, module="p3o.config")
        assert [str(w.message) for w in seen] == ["mine"]
