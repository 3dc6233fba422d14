"""Issue 53, item 4: the ledger refuses the unknown — a confirmatory verdict file the record file does not list is a
one-line error in ``p3o compare --check`` and in the page build (it was pooled silently) — and the label of a study
from a per-CPU base says what its file keeps: "per-CPU base, per-seed values kept" or "summary statistics only"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from p3o.experiments.stats.check import main as check_main
from p3o.experiments.stats.ledger import PER_CPU_BASE, PER_CPU_KEPT, base_label, study_instrument
from p3o.experiments.summary.cli import main as summary_main

ROOT = Path(__file__).resolve().parents[3]
PRE = {"sha256": "ab" * 32, "commit": "c0" * 20, "committed_at": "t", "seeds": [1, 2], "exploratory": False}


def _record(values: bool) -> dict:
    rec = {"claim": "x", "title": "x", "kind": "better", "regime": "r", "a": "p3o", "b": "grpo", "metric": "pass@1",
           "role": "primary", "p_adj": 0.5, "verdict": "inconclusive", "exploratory": False, "alpha": 0.05, "n": 2,
           "mean_a": 0.5, "mean_b": 0.49, "diff": 0.01, "sd": 0.02, "ci": [-0.17, 0.19], "p_diff": 0.5,
           "p_equiv": 0.6, "margin": 0.02, "identical": False}  # fmt: skip
    return {**rec, **({"values_a": [0.5, 0.5], "values_b": [0.49, 0.49], "seeds": [1, 2]} if values else {})}


def _repo(tmp_path: Path, studies: list[dict]) -> Path:
    """A repository whose record file lists ``studies`` and one confirmatory verdict file, ``new``."""
    (tmp_path / "configs" / "experiments" / "records").mkdir(parents=True)
    (tmp_path / "configs" / "experiments" / "records" / "ledger.yaml").write_text(json.dumps({"studies": studies}))
    results = tmp_path / "docs" / "results"
    results.mkdir(parents=True)
    path = results / "new.verdicts.json"
    path.write_text(json.dumps({"preregistration": PRE, "values_reason": "toy", "runs": None, "runs_reason": "toy",
                                "verdicts": [_record(values=False)]}))  # fmt: skip
    return path


def test_a_confirmatory_file_missing_from_the_ledger_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _repo(tmp_path, [{"study": "other", "status": "pooled"}])
    assert check_main([str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no entry in the ledger" in err and "new.verdicts.json" in err
    assert summary_main([str(path), "--out", str(tmp_path / "verdicts.md")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no entry in the ledger" in err
    assert not (tmp_path / "verdicts.md").exists()


def test_a_recorded_confirmatory_file_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _repo(tmp_path, [{"study": "new", "status": "pooled"}])
    assert summary_main([str(path), "--out", str(tmp_path / "verdicts.md")]) == 0
    assert "Status in the ledger: **pooled**" in (tmp_path / "verdicts.md").read_text()


def test_the_label_of_a_per_cpu_base_says_whether_per_seed_values_are_kept() -> None:
    results = ROOT / "docs" / "results"
    for name in ("minpro-stale5", "minpro-stale6"):
        doc = json.loads((results / f"{name}.verdicts.json").read_text())
        assert base_label(doc, study_instrument(results / f"{name}.verdicts.json")) == PER_CPU_KEPT
    doc = json.loads((results / "lag.verdicts.json").read_text())
    assert base_label(doc, "lm") == PER_CPU_BASE and PER_CPU_BASE.startswith("summary statistics only")
    assert PER_CPU_KEPT.startswith("per-CPU base, per-seed values kept")
    index = (results / "README.md").read_text()
    row = next(line for line in index.splitlines() if line.startswith("| minpro-stale5 |"))
    assert "per-CPU base, per-seed values kept" in row and "summary statistics only" not in row
    row = next(line for line in index.splitlines() if line.startswith("| lag |"))
    assert "summary statistics only" in row
