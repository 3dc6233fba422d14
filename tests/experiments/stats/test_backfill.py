"""A synthetic study's verdict file carries per-seed values and cell run times and rechecks; an old one is
back-filled by recomputing its cells, only where they reproduce its statistics; an LM one says why it cannot be."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from p3o.experiments.grid.compare import main as compare_main
from p3o.experiments.stats.backfill import LM_VALUES_REASON, RUNS_REASON, main
from p3o.experiments.stats.check import check_file


def _study(tmp_path: Path) -> Path:
    raw = {
        "name": "tiny-study",
        "instrument": "synthetic",
        "out_dir": str(tmp_path / "out"),
        "base": {"steps": 12, "lr": 0.05},
        "seeds": 4,
        "primary": {"metric": "mean_reward", "margin": 0.5, "secondary": ["final_reward"]},
        "cells": [{"regime": "noise-0.6", "objectives": ["p3o", "grpo-tm-0.2"]}],
        "claims": [
            {
                "id": "t",
                "title": "close",
                "kind": "tracks",
                "regimes": ["noise-0.6"],
                "objectives": ["p3o", "grpo-tm-0.2"],
            }
        ],
    }
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def test_a_synthetic_study_writes_rechecks_and_backfills(tmp_path: Path) -> None:
    study = _study(tmp_path)
    report = tmp_path / "r.md"
    assert compare_main([str(study), "--report", str(report), "--figures", str(tmp_path / "f"), "--exploratory"]) == 0
    path = report.with_suffix(".verdicts.json")
    doc = json.loads(path.read_text())
    assert [r["seeds"] for r in doc["verdicts"]] == [[0, 1, 2, 3]] * 2  # the primary and the secondary metric
    assert len(doc["runs"]) == 2 and all(r["started_at"] <= r["ended_at"] for r in doc["runs"])
    assert check_file(path)[0] == []
    # an old file: no values, no runs; the back-fill recomputes the cells and restores exactly the same values
    old = {"preregistration": doc["preregistration"], "verdicts": [dict(r) for r in doc["verdicts"]]}
    for r in old["verdicts"]:
        for k in ("seeds", "values_a", "values_b"):
            r.pop(k)
    path.write_text(json.dumps(old))
    assert main([str(path), "--study", str(study)]) == 0
    filled = json.loads(path.read_text())
    assert [r["values_a"] for r in filled["verdicts"]] == [r["values_a"] for r in doc["verdicts"]]
    assert filled["runs"] is None and filled["runs_reason"] == RUNS_REASON and "values_reason" not in filled
    assert "2 of 2" in filled["values_source"]
    assert check_file(path)[0] == []
    # a stored statistic the recomputed cells do not reproduce: that record gets no values, and the file says why
    old["verdicts"][0]["diff"] += 0.01
    path.write_text(json.dumps(old))
    assert main([str(path), "--study", str(study)]) == 0
    filled = json.loads(path.read_text())
    assert filled["verdicts"][0]["values_a"] is None and filled["verdicts"][1]["values_a"] is not None
    assert "did not reproduce" in filled["values_reason"]


def test_an_lm_file_says_why_it_has_no_values(tmp_path: Path) -> None:
    path = tmp_path / "lm.verdicts.json"
    rec = {"claim": "c", "regime": "r", "a": "p3o", "b": "grpo", "metric": "pass@1", "role": "primary", "n": 6}
    path.write_text(json.dumps({"preregistration": None, "verdicts": [rec]}))
    assert main([str(path)]) == 0
    doc = json.loads(path.read_text())
    assert list(doc) == ["preregistration", "runs", "runs_reason", "values_reason", "verdicts"]
    assert doc["values_reason"] == LM_VALUES_REASON and doc["verdicts"][0]["values_a"] is None
    problems, notes = check_file(path)
    assert problems == [] and notes[-1] == f"run times not recorded: {RUNS_REASON}"
