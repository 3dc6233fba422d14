"""Pre-registration enforced by `p3o compare`: a dirty or uncommitted experiment file, another decision rule in the
out_dir or reused exploratory seeds refuse a confirmatory report (exit 2, one line); --exploratory lifts that and
marks every verdict; the verdict file records sha256, commit, its time, seeds and the mode."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from p3o.cli import main as p3o_main
from p3o.experiments.grid.spec import parse_experiment
from p3o.experiments.stats.prereg import LEDGER, decision_digest

FAKE = " ".join([sys.executable, str(Path(__file__).parents[1] / "fake_train.py")])


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def _study(tmp_path: Path, seeds: list[int], margin: float = 0.01) -> dict:
    return {
        "name": "pre",
        "base": {"steps": 10},
        "objectives": ["p3o", {"label": "better", "overrides": {"objective.name": "grpo", "fake.bonus": 0.05}}],
        "regimes": ["on-policy"],
        "seeds": seeds,
        "out_dir": str(tmp_path / "out"),
        "eval": {"n_samples": 0},
        "primary": {"metric": "final_reward", "margin": margin},
        "claims": [
            {
                "id": "x",
                "title": "GRPO+bonus beats P3O",
                "kind": "better",
                "regimes": ["on-policy"],
                "objectives": ["better", "p3o"],
            }
        ],
    }


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "t@example.com")
    _git(repo, "config", "user.name", "t")
    return repo


def _commit(repo: Path, raw: dict) -> Path:
    path = repo / "exp.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    _git(repo, "add", "exp.yaml")
    _git(repo, "commit", "-q", "-m", "declare the study")
    return path


def _compare(path: Path, *extra: str) -> int:
    return p3o_main(["compare", str(path), "--train-cmd", FAKE, "--report", str(path.parent / "r.md"), *extra])


def _verdicts(path: Path) -> dict:
    return json.loads((path.parent / "r.verdicts.json").read_text())


def test_dirty_file_exits_2_with_one_line_and_exploratory_marks_every_verdict(repo, tmp_path, capsys) -> None:
    path = _commit(repo, _study(tmp_path, [0, 1, 2]))
    path.write_text(path.read_text() + "# an edit after the commit\n")
    assert _compare(path) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "exp.yaml has uncommitted changes" in err and "--exploratory" in err
    assert not (tmp_path / "out" / "runs").exists()  # refused before any run
    assert _compare(path, "--exploratory") == 0
    doc = _verdicts(path)
    pre = doc["preregistration"]
    assert pre["exploratory"] is True and pre["seeds"] == [0, 1, 2]
    assert pre["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert doc["verdicts"] and all(v["exploratory"] for v in doc["verdicts"])
    report = (path.parent / "r.md").read_text()
    assert "- Mode: **exploratory**" in report and "(exploratory) |" in report
    untracked = repo / "draft.yaml"
    untracked.write_text(path.read_text())
    assert _compare(untracked) == 2
    assert "draft.yaml is not committed" in capsys.readouterr().err


def test_confirmatory_report_records_the_commit_and_refuses_another_decision_rule(repo, tmp_path, capsys) -> None:
    path = _commit(repo, _study(tmp_path, [0, 1, 2]))
    assert _compare(path) == 0
    pre = _verdicts(path)["preregistration"]
    assert pre["exploratory"] is False and pre["commit"] == _git(repo, "rev-parse", "HEAD")
    assert pre["committed_at"] == _git(repo, "log", "-1", "--format=%cI")
    assert [v["verdict"] for v in _verdicts(path)["verdicts"]] == ["supported"]
    assert "- Mode: confirmatory" in (path.parent / "r.md").read_text()
    ledger = [json.loads(x) for x in (tmp_path / "out" / LEDGER).read_text().splitlines()]
    assert ledger[0]["digest"] == decision_digest(parse_experiment(_study(tmp_path, [0, 1, 2])).decision_rule())
    # A new margin is a new decision rule: the runs in out_dir were not made under it.
    _commit(repo, _study(tmp_path, [0, 1, 2], margin=0.02))
    assert _compare(path, "--report-only") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "another version of the claims, primary metric or margins" in err
    assert _compare(path, "--report-only", "--exploratory") == 0


def test_confirmatory_seeds_must_be_disjoint_from_exploratory_ones(repo, tmp_path, capsys) -> None:
    path = _commit(repo, _study(tmp_path, [0, 1, 2]))
    assert _compare(path, "--exploratory") == 0
    _commit(repo, _study(tmp_path, [2, 3, 4]))
    assert _compare(path) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "seeds [2] were used by an exploratory run" in err
    _commit(repo, _study(tmp_path, [3, 4, 5]))
    assert _compare(path) == 0
    assert _verdicts(path)["preregistration"]["seeds"] == [3, 4, 5]


def test_runs_without_a_ledger_are_not_confirmatory(repo, tmp_path, capsys) -> None:
    path = _commit(repo, _study(tmp_path, [0, 1]))
    (tmp_path / "out" / "runs" / "on-policy").mkdir(parents=True)
    assert _compare(path, "--report-only") == 2
    assert "no pre-registration record" in capsys.readouterr().err


def test_synthetic_study_is_preregistered_too(repo, tmp_path, capsys) -> None:
    raw = {
        "name": "syn",
        "instrument": "synthetic",
        "out_dir": str(tmp_path / "syn"),
        "base": {"steps": 4},
        "seeds": [7, 9, 11],
        "primary": {"metric": "mean_reward", "margin": 0.5},
        "cells": [{"regime": "on-policy", "objectives": ["p3o", "grpo-tm-0.2"]}],
        "claims": [
            {
                "id": "t",
                "title": "P3O tracks GRPO",
                "kind": "tracks",
                "regimes": ["on-policy"],
                "objectives": ["p3o", "grpo-tm-0.2"],
            }
        ],
    }
    path = _commit(repo, raw)
    path.write_text(path.read_text() + "# dirty\n")
    assert p3o_main(["compare", str(path), "--report", str(repo / "r.md")]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    _git(repo, "checkout", "exp.yaml")
    assert p3o_main(["compare", str(path), "--report", str(repo / "r.md")]) == 0
    doc = json.loads((repo / "r.verdicts.json").read_text())
    assert doc["preregistration"]["seeds"] == [7, 9, 11] and not doc["preregistration"]["exploratory"]
    cell = json.loads(next((tmp_path / "syn" / "cells").glob("*.json")).read_text())
    assert cell["seeds"] == [7, 9, 11]
    assert "seeds 7, 9, 11" in (repo / "r.md").read_text()


def test_a_study_needing_what_this_cpu_lacks_is_refused_before_any_run(repo, tmp_path, capsys, monkeypatch) -> None:
    """The vllm-bf16-kvfp8 regime (vLLM's FP8 KV cache) on a CPU without AVX-512/AMX: one line, exit 2, nothing run
    and nothing written to the out_dir (P3O_CPU_ISA=avx2 stands in for such a CPU)."""
    from p3o.rollout.capabilities import cpu_isa

    if cpu_isa().arch not in ("x86_64", "amd64"):
        pytest.skip("the AVX2 view exists on x86 only")
    monkeypatch.setenv("P3O_CPU_ISA", "avx2")
    raw = _study(tmp_path, [0, 1])
    raw["regimes"] = ["vllm-bf16-kvfp8"]
    raw["claims"][0]["regimes"] = ["vllm-bf16-kvfp8"]
    path = _commit(repo, raw)
    assert _compare(path, "--exploratory") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "regime 'vllm-bf16-kvfp8'" in err and "AVX-512 or AMX" in err, err
    assert not (tmp_path / "out").exists()
