"""A rerun of a committed study set beside its first verdict file: verdict by verdict, the same or not; a record only
one file holds is missing; a rerun on other seeds is refused with one line (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from p3o.experiments.stats.replication import compare_files, main


def _rec(claim: str, verdict: str, diff: float, role: str = "primary") -> dict:
    key = {"claim": claim, "regime": "stale-32", "a": "p3o", "b": "grpo", "metric": "pass@1", "role": role}
    return {
        **key,
        "mean_a": 0.5 + diff,
        "mean_b": 0.5,
        "diff": diff,
        "ci": [diff - 0.05, diff + 0.05],
        "verdict": verdict,
    }


def _file(path: Path, records: list[dict], seeds: list[int]) -> Path:
    pre = {"sha256": "ab" * 32, "commit": None, "committed_at": None, "seeds": seeds, "exploratory": False}
    path.write_text(json.dumps({"preregistration": pre, "verdicts": records}))
    return path


def test_verdicts_are_paired_by_key_and_compared(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first = [
        _rec("win", "supported", 0.4),
        _rec("win", "supported", 0.3, "secondary"),
        _rec("lose", "contradicted", -0.3),
    ]
    again = [_rec("win", "supported", 0.35), _rec("lose", "inconclusive", -0.02), _rec("new", "negligible", 0.0)]
    orig = _file(tmp_path / "s.verdicts.json", first, [1, 2, 3])
    (tmp_path / "rerun").mkdir()
    rerun = _file(tmp_path / "rerun" / "s.verdicts.json", again, [3, 2, 1])
    rows = compare_files(orig, rerun)
    assert [r.key[0] for r in rows] == ["win", "lose", "new"]  # secondaries left out; the rerun's extra one last
    assert [r.same for r in rows] == [True, False, False]
    assert rows[2].original is None
    out = tmp_path / "page.md"
    assert main([str(orig), str(rerun), "--out", str(out)]) == 0  # a verdict that does not reproduce is a finding
    page = out.read_text()
    assert page.startswith("### `s` rerun: 1 of 3 primary verdicts the same")
    assert "[s.verdicts.json](rerun/s.verdicts.json)" in page  # links relative to the page
    assert (
        "| lose | stale-32 | p3o | grpo | pass@1 | 0.200 vs 0.500, -0.300 [-0.350, -0.250] **contradicted** |" in page
    )
    assert "**inconclusive** | **no** |" in page and "| missing | 0.500 vs 0.500" in page


def test_other_seeds_or_bad_input_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    orig = _file(tmp_path / "a.verdicts.json", [_rec("win", "supported", 0.4)], [1, 2, 3])
    other = _file(tmp_path / "b.verdicts.json", [_rec("win", "supported", 0.4)], [4, 5, 6])
    assert main([str(orig), str(other)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not a rerun of its study" in err
    assert main([str(orig), str(tmp_path / "nope.json")]) == 2
    assert "cannot read verdicts" in capsys.readouterr().err
    assert main([str(orig)]) == 2 and "usage" in capsys.readouterr().err
