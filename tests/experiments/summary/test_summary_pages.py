"""The results pages (every verdict, the index) and the README's short block are rendered from verdict files, never
typed; the confirmatory verdicts of every study are decided in one Holm family."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from p3o.experiments.summary.blocks import END, START
from p3o.experiments.summary.cli import main
from p3o.experiments.summary.pages import load, pool


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
    kept = {"seeds": [10, 11], "values_a": [0.6, 0.6], "values_b": [0.55, 0.56]}  # a's per-seed values; b has none
    lm = _write(
        tmp_path / "results-lm.verdicts.json", [_record("a", 0.012, **kept), _record("s", 0.001, role="secondary")]
    )
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
    out, index = tmp_path / "results" / "verdicts.md", tmp_path / "results" / "README.md"
    argv = [str(p) for p in (lm, syn, draft, legacy)]
    block = tmp_path / "block.md"
    assert main([*argv, "--out", str(out), "--index", str(index), "--readme", str(readme), "--block", str(block)]) == 0
    text = readme.read_text()
    assert text.startswith("intro\n" + START) and text.endswith(END + "\noutro\n") and "old text" not in text
    flat = " ".join(text.split())
    # counted per instrument (no study file here: both LM), one Holm family across all of them
    assert "2 verdicts from 2 studies — **LM testbed** 2: 2 supported, 0 contradicted" in flat
    assert "`p3o compare --check FILE` to recompute it" in flat
    assert "[results](results/README.md), [every verdict](results/verdicts.md)" in flat
    assert block.read_text().startswith(START)
    page = out.read_text()
    assert "[results-lm](results-lm.md)" in page and "**exploratory**" in page and "no pre-registration" in page
    assert "**supported** (exploratory)" in page and "| secondary |" in page
    assert "| p3o | grpo | final_reward | 6 | +0.042 [+0.010, +0.074] | 0.024 | **supported** |" in page
    rows = [line for line in index.read_text().splitlines() if line.startswith("| results-")]
    assert [r.split(" | ")[2] for r in rows] == [
        "confirmatory",
        "confirmatory",
        "exploratory",
        "exploratory (no pre-registration record)",
    ]
    assert "[results-lm.md](../results-lm.md)" in rows[0] and "10–15" in rows[0]


def test_a_study_without_verdicts_gets_a_line_not_an_empty_table(tmp_path: Path) -> None:
    calib = _write(tmp_path / "calib.verdicts.json", [])
    lm = _write(tmp_path / "results-lm.verdicts.json", [_record("a", 0.012)])
    out, index = tmp_path / "results" / "verdicts.md", tmp_path / "results" / "README.md"
    assert main([str(calib), str(lm), "--out", str(out), "--index", str(index)]) == 0
    section = out.read_text().split("## [calib](calib.md)")[1].split("## [")[0]
    assert "No verdicts: a descriptive study" in section and "| claim |" not in section
    assert "Primary verdicts, in-study (the study's own Holm family): 1 supported" in out.read_text()


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


def test_verdicts_are_retaken_by_todays_rule_and_each_change_is_listed() -> None:
    """Reports written under an older rule keep their labels; the verdict files hold today's (relabelled by code
    under amendment negligible-holm-tost, issue 46), and every label that moved keeps the report's as
    ``verdict_report``: results-lm's c-fp8 (decided before *negligible* existed), and the negligible verdicts that
    fail the Holm-adjusted TOST in their study's family."""
    root = Path(__file__).resolve().parents[3]
    changed = [
        (s.name, r["claim"], r["verdict_report"], r["verdict"])
        for s in load(sorted((root / "docs" / "results").glob("*.verdicts.json")))
        for r in s.records
        if "verdict_report" in r
    ]
    assert ("lm", "c-fp8", "inconclusive", "negligible") in changed
    assert ("lag-grid", "lag-p3o-vs-family", "negligible", "inconclusive") in changed
    assert len(changed) == 9
    page = (root / "docs" / "results" / "verdicts.md").read_text()
    assert "**negligible** (today's rule; inconclusive before the rule amendment, the report's appendix)" in page
    assert "**inconclusive** (today's rule; negligible before the rule amendment, the report's appendix)" in page


def test_the_index_shows_the_seed_ledger_amendments_and_looks() -> None:
    root = Path(__file__).resolve().parents[3]
    index = (root / "docs" / "results" / "README.md").read_text()
    assert "[lm-5m-calibration.md](lm-5m-calibration.md)" in index
    assert "| stale | lm | 300–305 |" in index and "| vllm-earlier-run | lm | 0–5 |" in index
    assert "- Amendment of **lag** (2026-12-01T06:09:54+00:00, commit `cb9a3c4`" in index
    assert "- Look at **stale** by stale-variants (seeds 300, 301," in index


def test_a_report_whose_verdicts_todays_rule_changes_keeps_the_old_labels_in_a_dated_appendix(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[3]
    report = (root / "docs" / "results" / "lm.md").read_text()
    head = report.split("<!-- old-labels:begin -->")[0]
    (tmp_path / "lm.md").write_text(head)
    (tmp_path / "lm.verdicts.json").write_bytes((root / "docs" / "results" / "lm.verdicts.json").read_bytes())
    for _ in range(2):  # idempotent: the appendix is replaced in place, the report above it kept byte for byte
        assert main([str(tmp_path / "lm.verdicts.json"), "--out", str(tmp_path / "v.md")]) == 0
    text = (tmp_path / "lm.md").read_text()
    assert text.startswith(head) and text.count("<!-- old-labels:begin -->") == 1
    row = "| c-fp8 | fp8-rollout | p3o | grpo-tm-0.4 | final_reward | 6 | +0.006 [-0.004, +0.016] | inconclusive |"
    assert row + " **negligible** |" in text
    assert text.endswith("<!-- old-labels:end -->\n") and text == report


def test_lm_studies_from_a_per_cpu_base_are_marked_summary_statistics_only(tmp_path: Path) -> None:
    """An LM study whose runs record no shipped base (`tiny@<sha>`) is marked on both pages; one whose every run
    started from a shipped base is not."""
    old = _write(tmp_path / "old-lm.verdicts.json", [_record("a", 0.012)])
    new = _write(tmp_path / "new-lm.verdicts.json", [_record("b", 0.012)])
    doc = json.loads(new.read_text())
    doc["runs"] = [{"name": f"r{i}", "base_key": "tiny@6550aedbf4ee"} for i in range(2)]
    new.write_text(json.dumps(doc))
    assert [s.summary_only for s in load([old, new])] == [True, False]
    out, index = tmp_path / "results" / "verdicts.md", tmp_path / "results" / "README.md"
    assert main([str(old), str(new), "--out", str(out), "--index", str(index)]) == 0
    sections = {s.split("]")[0]: s for s in out.read_text().split("## [")[1:]}
    assert "**Summary statistics only**" in sections["old-lm"] and "Summary statistics" not in sections["new-lm"]
    rows = {r.split(" | ")[0]: r for r in index.read_text().splitlines() if r.startswith("| ")}
    assert "summary statistics only" in rows["| old-lm"] and "summary statistics only" not in rows["| new-lm"]
