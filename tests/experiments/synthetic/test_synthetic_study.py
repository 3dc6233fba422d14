"""A synthetic study file end to end: parse errors, resumable cells, paired verdicts, report and verdicts.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from p3o.errors import ConfigError
from p3o.experiments.grid.compare import main as compare_main
from p3o.experiments.synthetic.study import load_study


def _write(tmp_path: Path, **over: object) -> Path:
    raw = {
        "name": "tiny-study",
        "instrument": "synthetic",
        "out_dir": str(tmp_path / "out"),
        "base": {"steps": 12, "lr": 0.05},
        "seeds": 4,
        "primary": {"metric": "mean_reward", "margin": 0.5},
        "cells": [
            {"regime": "on-policy", "objectives": ["p3o", "grpo-tm-0.2"]},
            {"regime": "noise-0.6", "objectives": ["p3o", "grpo-tm-0.2"]},
        ],
        "claims": [
            {
                "id": "a",
                "title": "same",
                "kind": "identical",
                "regimes": ["on-policy"],
                "objectives": ["p3o", "grpo-tm-0.2"],
            },
            {
                "id": "t",
                "title": "close",
                "kind": "tracks",
                "regimes": ["noise-0.6"],
                "objectives": ["p3o", "grpo-tm-0.2"],
            },
        ],
    }
    raw.update(over)
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def test_study_runs_resumes_and_decides(tmp_path: Path) -> None:
    path = _write(tmp_path)
    report = tmp_path / "docs" / "r.md"
    assert (
        compare_main([str(path), "--report", str(report), "--figures", str(tmp_path / "figs"), "--exploratory"]) == 0
    )
    text = report.read_text()
    assert "synthetic instrument" in text and "| a | on-policy | p3o | grpo-tm-0.2 |" in text
    verdicts = {v["claim"]: v for v in json.loads(report.with_suffix(".verdicts.json").read_text())["verdicts"]}
    assert verdicts["a"]["verdict"] == "supported" and verdicts["a"]["identical"]
    assert verdicts["t"]["n"] == 4 and verdicts["t"]["verdict"] in ("supported", "inconclusive")
    assert (tmp_path / "figs" / "tiny-study-curves.png").stat().st_size > 1000
    cells = sorted((tmp_path / "out" / "cells").glob("*.json"))
    assert len(cells) == 4
    stamp = cells[0].stat().st_mtime_ns
    assert (
        compare_main([str(path), "--report", str(report), "--figures", str(tmp_path / "figs"), "--exploratory"]) == 0
    )
    assert cells[0].stat().st_mtime_ns == stamp  # cached cells are not recomputed


def test_study_errors_name_the_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="base: unknown key"):
        load_study(_write(tmp_path, base={"stepz": 3}))
    with pytest.raises(ConfigError, match="not run in regime"):
        load_study(
            _write(
                tmp_path,
                claims=[
                    {"id": "x", "title": "x", "kind": "better", "regimes": ["mb4"], "objectives": ["p3o", "grpo"]}
                ],
            )
        )
    with pytest.raises(ConfigError, match="unknown knob"):
        load_study(_write(tmp_path, cells=[{"regime": "stael-4", "objectives": ["p3o"]}]))
