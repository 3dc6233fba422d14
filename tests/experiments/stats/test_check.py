"""`p3o compare --check FILE` recomputes every verdict of a verdict file from its per-seed values: a file written by
the tool passes, one seed's value edited by hand fails, and a run that started before the study's commit fails."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import numpy as np
import pytest

from p3o.experiments.grid.compare import main as compare_main
from p3o.experiments.grid.spec import Claim, PrimarySpec
from p3o.experiments.stats.check import check_file
from p3o.experiments.stats.prereg import Preregistration, verdict_file
from p3o.experiments.stats.verdicts import decide

SEEDS = [10, 11, 12, 13, 14, 15]


def _values(regime: str, a: str, b: str, metric: str) -> tuple[list[float], list[float], list[int]]:
    """Per-seed values: p3o ahead of grpo by ~0.1 on pass@1, level on final_reward."""
    rng = np.random.default_rng(zlib.crc32(f"{regime}/{a}/{b}/{metric}".encode()))
    base = rng.uniform(0.4, 0.6, size=len(SEEDS))
    shift = {"pass@1": 0.1, "final_reward": 0.001}[metric] if a == "p3o" else 0.0
    return (base + shift + rng.normal(0, 0.01, len(SEEDS))).tolist(), base.tolist(), SEEDS


def _write(tmp_path: Path, runs: list[dict] | None = None, **kw: object) -> Path:
    claims = [
        Claim(id="win", title="P3O beats GRPO", kind="better", objectives=["p3o", "grpo"], regimes=["stale-4"]),
        Claim(id="level", title="P3O tracks MinPRO", kind="tracks", objectives=["p3o", "minpro"], regimes=["stale-4"]),
    ]
    for c in claims:
        c.metric = "pass@1"
    primary = PrimarySpec(metric="pass@1", margin=0.02, secondary=["final_reward"])
    decisions = decide(claims, primary, _values)
    pre = Preregistration("ab" * 32, "c0" * 20, "2026-12-02T01:00:00+00:00", SEEDS, False)
    path = tmp_path / "toy.verdicts.json"
    path.write_text(verdict_file(pre, [d.to_dict() for d in decisions], runs=runs, **kw))
    return path


def _run(start: str, end: str, seed: int = 10) -> dict:
    return {"regime": "stale-4", "objective": "p3o", "seed": seed, "started_at": start, "ended_at": end,
            "wall_s": 60.0, "cpu": "test cpu (avx2)", "base_key": "tiny-abc"}  # fmt: skip


def test_a_file_the_tool_wrote_recomputes_exactly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, runs=[_run("2026-12-02T01:05:00+00:00", "2026-12-02T01:07:00+00:00")])
    doc = json.loads(path.read_text())
    rec = doc["verdicts"][0]
    assert rec["seeds"] == SEEDS and len(rec["values_a"]) == len(rec["values_b"]) == 6
    assert {r["metric"] for r in doc["verdicts"]} == {"pass@1", "final_reward"}  # secondary metrics carry values too
    problems, notes = check_file(path)
    assert problems == []
    assert notes[0] == "4 of 4 verdicts recomputed from their per-seed values"
    assert "earliest run start 2026-12-02T01:05:00+00:00 (300 s later)" in notes[-1]
    assert compare_main(["--check", str(path)]) == 0
    assert ": OK;" in capsys.readouterr().out


def test_one_seed_edited_by_hand_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, runs_reason="not recorded (test)")
    doc = json.loads(path.read_text())
    doc["verdicts"][0]["values_a"][3] += 0.05  # one seed of A, the statistics left as they were
    path.write_text(json.dumps(doc))
    problems, _ = check_file(path)
    assert any("win / stale-4 / p3o vs grpo / pass@1 (primary): diff stored" in p for p in problems)
    assert compare_main(["--check", str(path)]) == 1
    assert "difference(s)" in capsys.readouterr().out


def test_a_verdict_label_edited_by_hand_fails(tmp_path: Path) -> None:
    path = _write(tmp_path, runs_reason="not recorded (test)")
    doc = json.loads(path.read_text())
    doc["verdicts"][0]["verdict"] = "contradicted"
    path.write_text(json.dumps(doc))
    problems, _ = check_file(path)
    assert problems == ["win / stale-4 / p3o vs grpo / pass@1 (primary): verdict stored 'contradicted', "
                        "recomputed 'supported'"]  # fmt: skip


def test_missing_values_need_a_reason_and_runs_before_the_commit_fail(tmp_path: Path) -> None:
    path = _write(tmp_path, runs=[_run("2026-12-02T00:59:00+00:00", "2026-12-02T01:03:00+00:00")])
    doc = json.loads(path.read_text())
    for r in doc["verdicts"]:
        r["values_a"] = r["values_b"] = r["seeds"] = None
    path.write_text(json.dumps(doc))
    problems, _ = check_file(path)
    assert sum("no per-seed values and no `values_reason`" in p for p in problems) == 4
    assert any("before the study file was committed (2026-12-02T01:00:00+00:00)" in p for p in problems)
    doc["values_reason"], doc["runs"], doc["runs_reason"] = "runs lost", None, "never recorded"
    path.write_text(json.dumps(doc))
    problems, notes = check_file(path)
    assert problems == []
    assert "0 of 4 verdicts recomputed" in notes[0] and "4 of 4 verdicts without per-seed values: runs lost" in notes
    assert notes[-1] == "run times not recorded: never recorded"


def test_an_amended_file_checks_its_runs_against_the_version_they_were_declared_under(tmp_path: Path) -> None:
    # A run at 00:59 is before the study file's (amended) commit at 01:00 but after its first registration at 00:30.
    path = _write(tmp_path, runs=[_run("2026-12-02T00:59:00+00:00", "2026-12-02T01:03:00+00:00")])
    doc = json.loads(path.read_text())
    doc["preregistration"]["amendments"] = [{"from": "aa" * 32, "to": "ab" * 32, "what": "prose", "why": "a typo"}]
    doc["preregistration"]["registered_at"] = "2026-12-02T00:30:00+00:00"
    path.write_text(json.dumps(doc))
    problems, notes = check_file(path)
    assert problems == [] and "declared (before its amendments) 2026-12-02T00:30:00+00:00" in notes[-1]
    doc["preregistration"]["registered_at"] = "2026-12-02T00:59:30+00:00"  # the run came before the declaration
    path.write_text(json.dumps(doc))
    problems, _ = check_file(path)
    assert problems == [
        "the earliest run started at 2026-12-02T00:59:00+00:00, before the study file was declared (before its "
        "amendments) (2026-12-02T00:59:30+00:00)"
    ]


def test_a_seed_outside_the_preregistration_fails(tmp_path: Path) -> None:
    path = _write(tmp_path, runs_reason="not recorded (test)")
    doc = json.loads(path.read_text())
    doc["verdicts"][1]["seeds"][0] = 99
    path.write_text(json.dumps(doc))
    assert any("seeds [99] are not in the file's pre-registration" in p for p in check_file(path)[0])


def test_bad_input_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "x.verdicts.json"
    bad.write_text("{")
    assert compare_main(["--check", str(bad)]) == 2
    assert compare_main(["--check"]) == 2
