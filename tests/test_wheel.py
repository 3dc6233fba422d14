"""The built wheel, installed outside the repository, with only its required dependencies.

One module-scoped fixture builds the wheel (``pip wheel --no-deps``) from a copy of pyproject.toml, README.md and
src/ (so the checkout gets no build/ or egg-info litter), creates a fresh virtual environment, and installs the
wheel into it with ``--no-deps``. The environment sees the distributions the wheel *requires* (the closure of its
``Requires-Dist`` without extras, resolved in this interpreter's site-packages) through a folder of links, and
nothing else: no editable p3o, no extra such as ``datasets``. So the tests show, from a temporary directory:

* the wheel holds every file of the package, its package data (the presets, ``py.typed``) included;
* ``p3o --help``, every preset (``p3o train --config NAME --help``, and the preset resolves and validates inside
  the installed package) and a 2-step ``p3o train --config quick`` run and exit 0;
* without the ``data`` extra the main job runs, and data that needs it is a one-line error naming the extra.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "p3o"


def _norm(name: str) -> str:
    return canonicalize_name(name)


def required_closure(requirements: list[str]) -> set[str]:
    """Normalised names of the installed distributions that ``requirements`` (Requires-Dist strings, no extras
    asked) pull in, transitively; a requirement whose marker is false here (another platform, an extra) is left
    out, and so is one that is not installed (then the test that needs it fails, naming the import)."""
    seen: set[str] = set()
    todo = list(requirements)
    while todo:
        req = Requirement(todo.pop())
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = _norm(req.name)
        if name in seen:
            continue
        try:
            dist = md.distribution(req.name)
        except md.PackageNotFoundError:
            continue
        seen.add(name)
        todo += dist.requires or []
        for extra in req.extras:  # an asked extra of a dependency, e.g. "foo[bar]"
            todo += [
                r
                for r in dist.requires or []
                if Requirement(r).marker and Requirement(r).marker.evaluate({"extra": extra})
            ]
    return seen


def _top_level_entries(dist: md.Distribution) -> set[str]:
    """The site-packages entries (packages, modules, .libs folders, its .dist-info) a distribution installed."""
    entries = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
    return {e for e in entries if e != "__pycache__"}


def _link(target: Path, link: Path) -> None:
    """``link`` -> ``target``; a folder two distributions share (a namespace package) becomes a real folder of links
    to both distributions' entries."""
    if not link.exists() and not link.is_symlink():
        link.symlink_to(target, target_is_directory=target.is_dir())
    elif link.resolve() != target.resolve() and link.is_dir() and target.is_dir():
        if link.is_symlink():
            first = link.resolve()
            link.unlink()
            link.mkdir()
            for child in first.iterdir():
                _link(child, link / child.name)
        for child in target.iterdir():
            _link(child, link / child.name)


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """{"wheel", "python", "p3o", "env", "cwd", "site", "closure"}: the wheel installed in a fresh environment."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(PACKAGE, src / "src" / "p3o", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    dist = tmp / "dist"
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"}}
    env |= {"PIP_NO_INPUT": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    build = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "-q",
        "-w",
        str(dist),
        str(src),
    ]
    out = _run(build, tmp, env)
    assert out.returncode == 0, out.stderr[-3000:]
    (wheel,) = dist.glob("p3o-*.whl")

    venv = tmp / "venv"
    out = _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp, env)
    assert out.returncode == 0, out.stderr[-3000:]
    python = venv / "bin" / "python"
    site = Path(
        _run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], tmp, env).stdout.strip()
    )

    # the required dependencies only, as links into this interpreter's site-packages (nothing is copied)
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        requires = [
            line.split(":", 1)[1].strip()
            for line in zf.read(meta).decode().splitlines()
            if line.startswith("Requires-Dist:")
        ]
    closure = required_closure(requires)
    deps = tmp / "deps"
    deps.mkdir()
    for name in sorted(closure):
        d = md.distribution(name)
        base = Path(str(d.locate_file("")))
        for entry in _top_level_entries(d):
            if (base / entry).exists():
                _link(base / entry, deps / entry)
    (site / "p3o-wheel-test-deps.pth").write_text(f"{deps}\n")

    out = _run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q", str(wheel)],
        tmp,
        env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    cwd = tmp / "elsewhere"
    cwd.mkdir()
    run_env = env | {
        "PATH": f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    return {
        "wheel": wheel,
        "python": python,
        "p3o": venv / "bin" / "p3o",
        "env": run_env,
        "cwd": cwd,
        "site": site,
        "closure": closure,
    }


def test_the_wheel_holds_the_package_and_its_data(installed: dict) -> None:
    with zipfile.ZipFile(installed["wheel"]) as zf:
        names = set(zf.namelist())
    expected = {
        str(p.relative_to(PACKAGE.parent))
        for p in PACKAGE.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }
    assert expected - names == set(), "declare these in pyproject.toml [tool.setuptools.package-data]"
    presets = {n for n in names if n.startswith("p3o/configs/") and n.endswith(".yaml")}
    assert {"p3o/configs/quick.yaml", "p3o/configs/pad.yaml", "p3o/configs/smollm2-lora.yaml"} <= presets
    assert "p3o/py.typed" in names
    # the base install is light: `datasets` (and what only it brings: pyarrow, pandas) is the extra p3o[data]
    assert not {"datasets", "pyarrow", "pandas"} & installed["closure"], installed["closure"]


def test_p3o_help_and_every_preset_from_the_installed_wheel(installed: dict) -> None:
    out = _run([str(installed["p3o"]), "--help"], installed["cwd"], installed["env"])
    assert out.returncode == 0 and "train" in out.stdout, out.stderr
    script = """
import contextlib, io, json, sys
import p3o
from p3o.cli import main
from p3o.config import load_config
from p3o.options import list_presets, preset_path
rows = []
for name in list_presets():
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(["train", "--config", name, "--help"])
    cfg = load_config(["--config", name])
    rows.append({"name": name, "code": code, "help": "--loop.max_lag" in buf.getvalue(),
                 "path": str(preset_path(name)), "run_dir": cfg.run_dir})
print(json.dumps({"p3o": p3o.__file__, "presets": rows}))
"""
    out = _run([str(installed["python"]), "-c", script], installed["cwd"], installed["env"])
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    site = str(installed["site"])
    assert got["p3o"].startswith(site), f"p3o imported from {got['p3o']}, not from the installed wheel"
    names = {r["name"] for r in got["presets"]}
    assert names == {p.stem for p in (PACKAGE / "configs").glob("*.yaml")}
    for r in got["presets"]:
        assert r["code"] == 0 and r["help"] and r["path"].startswith(site), r
        assert r["run_dir"] == f"runs/{r['name']}", r


def test_the_main_job_runs_from_the_wheel_without_the_data_extra(installed: dict) -> None:
    env, cwd = installed["env"], installed["cwd"]
    out = _run([str(installed["python"]), "-c", "import datasets"], cwd, env)
    assert out.returncode != 0 and "No module named 'datasets'" in out.stderr, "datasets is visible to the wheel"
    run_dir = cwd / "runs" / "quick"
    cmd = [str(installed["p3o"]), "train", "--config", "quick", "--steps", "2", "--log.plot", "false"]
    out = _run(cmd, cwd, env)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    # data that needs the extra: one line naming it, exit 2
    saved = cwd / "saved"
    saved.mkdir()
    (saved / "dataset_info.json").write_text("{}")
    (saved / "state.json").write_text("{}")
    cmd = [str(installed["p3o"]), "train", "--task.name", f"gsm8k:{saved}", "--run_dir", str(cwd / "never")]
    out = _run(cmd, cwd, env)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr[-3000:]
    assert 'pip install "p3o[data]"' in out.stderr


def test_the_install_section_and_the_worked_example_from_the_wheel(installed: dict) -> None:
    """Issue 47: what the README's Install section runs, from a directory with nothing of the checkout: the version,
    a doc page, the worked example's data and reward (trained on for one step with its own options), the example
    study (its grid, dry)."""
    env, cwd = installed["env"], installed["cwd"] / "install"
    cwd.mkdir()
    p3o = str(installed["p3o"])
    out = _run([p3o, "--version"], cwd, env)
    assert out.returncode == 0 and out.stdout.strip() == "p3o 0.1.0", out.stderr
    out = _run([p3o, "docs", "tasks"], cwd, env)
    assert out.returncode == 0 and "## Your own data, model and reward: a worked example" in out.stdout
    assert _run([p3o, "examples", "own-task"], cwd, env).returncode == 0
    assert {p.name for p in cwd.iterdir()} == {"own_task.jsonl", "own_reward.py"}
    cmd = [p3o, "train", "--run_dir", "runs/mine", "--model.name", "tiny-random", "--task.name", "own_task.jsonl",
           "--task.question_key", "q", "--task.answer_key", "a", "--task.solution_key", "work",
           "--task.verifier", "own_reward.py:last_number", "--steps", "1", "--rollout.prompts_per_step", "2",
           "--rollout.group_size", "2", "--rollout.max_new_tokens", "8", "--log.plot", "false"]  # fmt: skip
    out = _run(cmd, cwd, env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "on 15 problems" in out.stdout + out.stderr and "only 15 problems" in out.stderr  # held out by hash
    assert "Loading weights" not in out.stderr  # model loads are quiet
    assert _run([p3o, "examples", "study"], cwd, env).returncode == 0
    out = _run([p3o, "compare", "study.yaml", "--exploratory", "--dry_run"], cwd, env)
    assert out.returncode == 0 and out.stdout.count("p3o train") + out.stdout.count("-m p3o") >= 4, out.stdout
