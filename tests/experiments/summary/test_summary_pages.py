"""The results front page and the README verdict block are rendered from verdict files, never typed; the README
shows the confirmatory verdicts of every study in one Holm family."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from p3o.experiments.summary.blocks import END, START
from p3o.experiments.summary.pages import load, main, pool


def _record(claim: str, p_diff: float, **over: object) -> dict:
    rec = {
        "claim": claim,
        "title": f"P3O beats GRPO ({claim})",
        "kind": "better",
        "regime": "stale-4",
        "a": "p3o",
        "b": "grpo",
        "metric": "final_reward",
        "role": "primary",
        "p_adj": p_diff,
        "verdict": "supported",
        "exploratory": False,
        "alpha": 0.05,
        "n": 6,
        "mean_a": 0.6,
        "mean_b": 0.55,
        "diff": 0.0421,
        "sd": 0.03,
        "ci": [0.01, 0.0742],
        "p_diff": p_diff,
        "p_equiv": float("nan"),
        "margin": 0.02,
        "identical": False,
    }
    return {**rec, **over}


def _write(path: Path, records: list[dict], exploratory: bool | None = False) -> Path:
    pre = None
    if exploratory is not None:
        pre = {"sha256": "ab" * 32, "commit": "c0ffee" * 6, "committed_at": "2026-12-01T04:00:00+00:00"}
        pre |= {"seeds": [10, 11, 12, 13, 14, 15], "exploratory": exploratory}
    path.write_text(json.dumps({"preregistration": pre, "verdicts": records}))
    return path


def test_one_holm_family_across_the_confirmatory_studies(tmp_path: Path) -> None:
    lm = _write(tmp_path / "results-lm.verdicts.json", [_record("a", 0.012), _record("s", 0.001, role="secondary")])
    syn = _write(tmp_path / "results-syn.verdicts.json", [_record("b", 0.02)])
    draft = _write(tmp_path / "results-draft.verdicts.json", [_record("c", 0.0001, exploratory=True)], True)
    legacy = tmp_path / "results-old.verdicts.json"
    legacy.write_text(json.dumps([_record("d", 0.0001)]))
    studies = load([lm, syn, draft, legacy])
    family = pool(studies)
    # Only the confirmatory primary verdicts, Holm over 2: 0.012·2 = 0.024, max(0.024, 0.02·1) = 0.024.
    assert [(s.name, r["claim"]) for s, r in family] == [("results-lm", "a"), ("results-syn", "b")]
    assert [r["p_pool"] for _, r in family] == pytest.approx([0.024, 0.024])
    assert [r["verdict_pool"] for _, r in family] == ["supported", "supported"]
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{START}\nold text\n{END}\noutro\n")
    out = tmp_path / "results.md"
    argv = [str(p) for p in (lm, syn, draft, legacy)]
    assert main([*argv, "--out", str(out), "--readme", str(readme), "--block", str(tmp_path / "block.md")]) == 0
    text = readme.read_text()
    assert text.startswith("intro\n" + START) and text.endswith(END + "\noutro\n") and "old text" not in text
    assert "2 confirmatory verdicts from 2 pre-registered studies, one Holm family" in text
    assert "- supported: P3O beats GRPO (a) — stale-4, p3o − grpo on final_reward = +0.042 [+0.010, +0.074]" in text
    assert "(c)" not in text and "(d)" not in text and "(s)" not in text
    assert "results-draft, results-old" in text
    assert (tmp_path / "block.md").read_text().startswith(START)
    page = out.read_text()
    assert "[results-lm](results-lm.md)" in page and "**exploratory**" in page and "no pre-registration" in page
    assert "**supported** (exploratory)" in page and "| secondary |" in page


def test_a_significant_pooled_family_can_undo_a_per_study_verdict(tmp_path: Path) -> None:
    """Each study alone: p 0.03 < 0.05. Pooled over 3: Holm 0.09 — inconclusive, not supported."""
    files = [_write(tmp_path / f"results-{i}.verdicts.json", [_record(str(i), 0.03)]) for i in range(3)]
    family = pool(load(files))
    assert {r["verdict_pool"] for _, r in family} == {"inconclusive"}
    assert [r["p_pool"] for _, r in family] == pytest.approx([0.09] * 3)


def test_missing_markers_or_file_exit_2(tmp_path: Path) -> None:
    v = _write(tmp_path / "x.verdicts.json", [_record("a", 0.01)])
    readme = tmp_path / "README.md"
    readme.write_text("no block\n")
    assert main([str(v), "--out", str(tmp_path / "r.md"), "--readme", str(readme)]) == 2
    assert main([str(tmp_path / "missing.json"), "--out", str(tmp_path / "r.md")]) == 2
