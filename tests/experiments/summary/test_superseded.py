"""A verdict that a later study re-decided is superseded by a recorded amendment (configs/experiments/records/
ledger.yaml, ``superseded:``): it stays in its verdict file, marked, leaves the pooled Holm family, and every page
shows it as superseded, not as evidence; ``p3o compare --check`` holds the file's marks to the record file (issue 39
item 6)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from p3o.errors import ConfigError
from p3o.experiments.stats.check import check_file
from p3o.experiments.stats.ledger import load_records, mark_superseded
from p3o.experiments.summary.blocks import END, START
from p3o.experiments.summary.cli import main
from p3o.experiments.summary.pages import load, pool
from p3o.experiments.summary.statements import problems, verdict_index

ROOT = Path(__file__).resolve().parents[3]
WHY = "its AsymRE was mean − 0.5·std, not the paper's"


def _record(claim: str, b: str, diff: float, p: float, verdict: str, **over: object) -> dict:
    rec = {"claim": claim, "title": claim, "kind": "better", "regime": "r", "a": "minpro", "b": b,
           "metric": "pass@1", "role": "primary", "p_adj": p, "verdict": verdict, "exploratory": False,
           "alpha": 0.05, "n": 6, "mean_a": 0.5, "mean_b": 0.5 - diff, "diff": diff, "sd": 0.02,
           "ci": [diff - 0.08, diff + 0.08], "p_diff": p, "p_equiv": float("nan"), "margin": 0.02,
           "identical": False}  # fmt: skip
    return {**rec, **over}


def _repo(tmp_path: Path, entry: dict | None) -> tuple[Path, Path, Path]:
    """A repository: old.verdicts.json (vs grpo p 0.01, vs asymre p 0.2 + its secondary), new.verdicts.json (one
    verdict p 0.3), and a record file superseding old's asymre comparison by ``new`` (when ``entry``)."""
    (tmp_path / "configs" / "experiments" / "records").mkdir(parents=True)
    records = {"superseded": [entry]} if entry else {}
    records["studies"] = [{"study": "old", "status": "pooled"}, {"study": "new", "status": "pooled"}]
    (tmp_path / "configs" / "experiments" / "records" / "ledger.yaml").write_text(
        yaml.safe_dump(records, allow_unicode=True)
    )
    results = tmp_path / "docs" / "results"
    results.mkdir(parents=True)
    pre = {"sha256": "ab" * 32, "commit": "c0" * 20, "committed_at": "t", "seeds": [1], "exploratory": False}
    old = results / "old.verdicts.json"
    old.write_text(json.dumps({"preregistration": pre, "values_reason": "toy", "runs": None, "runs_reason": "toy",
                               "verdicts": [_record("vs", "grpo", -0.2, 0.01, "contradicted"),
                                            _record("vs", "asymre", -0.498, 0.2, "inconclusive"),
                                            _record("vs", "asymre", -0.4, 0.2, "inconclusive",
                                                    role="secondary", metric="final_reward")]}))  # fmt: skip
    new = results / "new.verdicts.json"
    new.write_text(json.dumps({"preregistration": pre, "values_reason": "toy", "runs": None, "runs_reason": "toy",
                               "verdicts": [_record("n", "asymre-paper", -0.1, 0.3, "inconclusive")]}))  # fmt: skip
    return tmp_path, old, new


ENTRY = {"study": "old", "file": "docs/results/old.verdicts.json", "verdicts": [{"claim": "vs", "b": "asymre"}],
         "by": "new", "by_commit": "abc1234", "date": "2026-12-02T09:00:00+00:00", "what": "out of the family",
         "why": WHY}  # fmt: skip


def test_a_superseded_verdict_leaves_the_pooled_family_and_is_shown_as_superseded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, old, new = _repo(tmp_path, ENTRY)
    before = pool(load([old, new]))
    # Holm over 3: 0.01·3 = 0.03, max(0.2·2, 0.3) = 0.4
    assert [r["p_pool"] for _, r in before] == pytest.approx([0.03, 0.4, 0.4])
    assert mark_superseded(old, root / "configs" / "experiments") == 2  # the primary and its secondary
    marked = json.loads(old.read_text())["verdicts"]
    mark = {"by": "new", "date": ENTRY["date"], "why": WHY}
    assert [r.get("superseded") for r in marked] == [None, mark, mark]
    family = pool(load([old, new]))
    # out of the family: Holm over 2, 0.01·2 = 0.02, then 0.3
    assert [(s.name, r["b"]) for s, r in family] == [("old", "grpo"), ("new", "asymre-paper")]
    assert [r["p_pool"] for _, r in family] == pytest.approx([0.02, 0.3])
    assert check_file(old)[0] == []

    monkeypatch.chdir(root)
    mapping = {"instruments": {"lm": "a tiny model"}, "claims": [
        {"id": "asymre", "paper": "MinPRO", "claim": "MinPRO beats AsymRE", "rows": [
            {"regime": "LM: old", "label": "old", "verdicts": [{"study": "old", "claim": "vs", "b": "asymre"}]},
            {"regime": "LM: new", "label": "new", "verdicts": [{"study": "new", "claim": "n"}]}]}]}  # fmt: skip
    (root / "map.yaml").write_text(yaml.safe_dump(mapping, allow_unicode=True))
    (root / "README.md").write_text(f"top\n{START}\n{END}\n")
    argv = ["docs/results/old.verdicts.json", "docs/results/new.verdicts.json", "--out", "docs/results/verdicts.md",
            "--index", "docs/results/README.md", "--claims", "docs/paper-claims.md", "--claims-map", "map.yaml",
            "--readme", "README.md"]  # fmt: skip
    assert main(argv) == 0
    readme = " ".join((root / "README.md").read_text().split())
    assert "2 verdicts from 2 studies, 1 superseded out of it" in readme
    claims = (root / "docs" / "paper-claims.md").read_text()
    assert "| superseded (by new) 1 (old) · inconclusive 1 (new) |" in claims
    assert "inconclusive 2" not in claims and "inconclusive 1 (new)" in claims
    assert "**superseded** (by new) (not evidence; its study's verdict was inconclusive) minpro > asymre (r)" in claims
    page = (root / "docs" / "results" / "verdicts.md").read_text()
    assert "## One family: the pooled verdicts (2)" in page
    assert (
        f"**superseded** by [new](new.md) (2026-12-02; its study's verdict: inconclusive; not evidence): {WHY}" in page
    )
    index = (root / "docs" / "results" / "README.md").read_text()
    assert "Verdicts of **old** superseded by **new**" in index and WHY in index
    assert (root / "docs" / "results" / "figures" / "paper-claims-forest.png").stat().st_size > 5000

    # the statements test: the superseded effect may carry its verdict word only where the sentence says superseded
    index_ = verdict_index(load([old, new]), load([old, new]))
    said = "MinPRO is below AsymRE, −0.498 [−0.578, −0.418] (*inconclusive* in the study's family)."
    assert any("superseded it" in p for p in problems(said, index_, 2))
    assert problems(said.replace("family)", "family; superseded by new)"), index_, 2) == []


def test_check_holds_the_files_marks_to_the_record_file(tmp_path: Path) -> None:
    root, old, _ = _repo(tmp_path, ENTRY)
    got = check_file(old)[0]
    assert len(got) == 2 and all("supersedes it by new" in p for p in got)  # recorded, not marked
    mark_superseded(old, root / "configs" / "experiments")
    assert check_file(old)[0] == []
    (root / "configs" / "experiments" / "records" / "ledger.yaml").write_text(
        "studies: [{study: old, status: pooled}]\n"
    )
    got = check_file(old)[0]
    assert len(got) == 2 and all("records no such amendment" in p for p in got)  # marked, not recorded


def test_an_amendment_needs_its_reason_and_a_verdict_it_names(tmp_path: Path) -> None:
    root, old, _ = _repo(tmp_path, {k: v for k, v in ENTRY.items() if k != "why"})
    with pytest.raises(ConfigError, match=r"superseded\[0\] needs why"):
        load_records(root / "configs" / "experiments")
    root, old, _ = _repo(tmp_path / "b", {**ENTRY, "verdicts": [{"claim": "vs", "b": "nothing"}]})
    with pytest.raises(ConfigError, match="names no verdict of old"):
        mark_superseded(old, root / "configs" / "experiments")


def test_the_shipped_minpro_stale3_ablation_and_asymre_verdicts_are_superseded_by_minpro_stale5() -> None:
    """minpro-stale3's MinPRO vs AsymRE (p3o's mean − 0.5·std) and the mean / geomean ablation (over the earlier
    ratios × ρ_t) are out of the pooled family; the product (the same weight in both forms) stays."""
    path = ROOT / "docs" / "results" / "minpro-stale3.verdicts.json"
    records = json.loads(path.read_text())["verdicts"]
    gone = {(r["claim"], r["b"]) for r in records if r.get("superseded")}
    assert gone == {
        ("minpro-stale3-minpro-vs-baselines", "asymre"),
        ("minpro-stale3-min-vs-mean", "minpro-mean"),
        ("minpro-stale3-min-vs-geomean", "minpro-geomean"),
    }
    assert {r["superseded"]["by"] for r in records if r.get("superseded")} == {"minpro-stale5"}
    assert check_file(path)[0] == []
    pooled = {(s.name, r["claim"], r["b"]) for s, r in pool(load([path]))}
    assert ("minpro-stale3", "minpro-stale3-min-vs-prod", "minpro-prod") in pooled
    assert not {("minpro-stale3", c, b) for c, b in gone} & pooled
