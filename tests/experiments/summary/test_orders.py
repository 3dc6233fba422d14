"""Issue 53, item 2: a statements check that knows comparatives. Every sentence that orders two arms needs a decided
verdict for that pair in that direction, in the family the page cites; each ordering of a sentence needs its own;
``python -m p3o.experiments.summary.statements FILE...`` exits 1 naming each refused sentence, 0 when all pass."""

from __future__ import annotations

from pathlib import Path

import pytest

from p3o.experiments.summary.orders import Backing, orders_in, unbacked
from p3o.experiments.summary.pages import load
from p3o.experiments.summary.statements import main, summary_files

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def backing() -> Backing:
    return Backing.of(load(summary_files(ROOT)))


#: Every sentence issue 53 quotes (or, for findings.md, the sentence it points at as the page then said it).
ISSUE_53 = [
    "P3O wins / learns faster / is more stable / scores higher than decoupled PPO, +0.093 [+0.031, +0.155].",
    "P3O wins over decoupled PPO, +0.093 [+0.031, +0.155].",
    "P3O learns faster than decoupled PPO, +0.093 [+0.031, +0.155].",
    "P3O is more stable than decoupled PPO, +0.093 [+0.031, +0.155].",
    "P3O scores higher than decoupled PPO, +0.093 [+0.031, +0.155].",
    "k3_is trails GRPO.",
    "P3O beats GRPO at lag 10.",
    "P3O outperforms GRPO at lag 10.",
    "- **MinPRO's stale buffer, part 2** ([docs/results/minpro-stale2.md](results/minpro-stale2.md)): "
    "The verdicts rank the falls: MinPRO, CISPO and P3O end below the MinPRO paper's GRPO (−0.148 [−0.205, −0.092], "
    "−0.139 [−0.175, −0.103], −0.162 [−0.191, −0.134]; all three *contradicted* in the study's family; pooled, CISPO's"
    " and P3O's stay *contradicted* and MinPRO's is *inconclusive*), k3_is above P3O (+0.110 [+0.064, +0.156], "
    "*supported* in the study's family, *inconclusive* pooled) and below GRPO (−0.052 [−0.089, −0.016], inconclusive "
    "pooled).",
    "The two that fell least are the two that change the update most: GSPO's sequence clip at 2e-3 leaves a stale "
    "sequence no gradient, and AsymRE's lowered baseline makes most advantages positive.",
    "In the simulator, GPG, which uses no ratio at all, is among the best in every cell.",
    "- **MinPRO's stale buffer, part 3: the paper's other baselines and its ablation; AsymRE (p3o's form, superseded) "
    "has the highest mean**",
    "- **MinPRO's stale buffer, part 4: the paper's n = 4, and MinPRO has the lowest mean again**",
    "No verdict for P3O survives pooling under the mismatched engine.",
]


@pytest.mark.parametrize("text", ISSUE_53)
def test_each_sentence_issue_53_quotes_is_refused(backing: Backing, text: str) -> None:
    assert unbacked(text, backing), text


def test_a_sentence_with_several_comparisons_needs_each_backed(backing: Backing) -> None:
    backed = "At stale-64 every member of the GRPO family ends above P3O."
    assert unbacked(backed, backing) == []
    both = "At stale-64 GRPO ends above P3O, and P3O ends above MinPRO."
    found = unbacked(both, backing)
    assert len(found) == 1 and "P3O above MinPRO" in found[0] and "GRPO above" not in found[0]


def test_the_lexicon_reads_direction_negation_and_the_papers_claims() -> None:
    (o,) = orders_in("MinPRO scores lower than GRPO.")
    assert o.x == ("minpro-1-4",) and o.sign == -1 and "grpo-tm-0.2" in o.y
    assert orders_in("P3O does not beat GRPO.") == []
    assert [o.sign for o in orders_in("P3O holds up better than GRPO.")] == [1]
    assert [(o.x, o.sign) for o in orders_in("P3O trails MinPRO.")] == [(("p3o",), -1)]
    assert orders_in("P3O ends above the base, MinPRO below it.") == []
    assert orders_in("GRPO at its best ε against P3O.") == []
    (sup,) = orders_in("GPG is the best arm.")
    assert sup.y == () and sup.sign == 1


def test_the_command_refuses_a_page_and_passes_the_shipped_ones(tmp_path: Path, capsys, monkeypatch) -> None:
    page = tmp_path / "page.md"
    page.write_text("# A page\n\nP3O beats GRPO at lag 10. P3O − GRPO at lag 2 is inconclusive.\n")
    monkeypatch.chdir(ROOT)  # outside a repository the pages are checked against the working directory's
    assert main([str(page)]) == 1
    out = capsys.readouterr().out
    assert "P3O beats GRPO at lag 10" in out and "1 sentence(s) refused" in out and "inconclusive" not in out
    docs = ("findings", "paper-claims", "metrics", "synthetic")
    pages = [ROOT / "README.md", *(ROOT / "docs" / f"{n}.md" for n in docs)]
    assert main([str(p) for p in pages]) == 0, capsys.readouterr().out
    assert "every sentence backed" in capsys.readouterr().out
    monkeypatch.chdir(tmp_path)
    assert main([str(page)]) == 2  # no results index to read the verdict files from: bad input
