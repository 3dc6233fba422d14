"""docs/paper-claims.md and its forest plot are rendered from the verdict files through the declared mapping, byte
for byte the same on every run; the README's front page separates the instruments (LM testbed, simulator), shows
every claim (decided on the LM, in the simulator only, or cannot be tested here), counts per instrument, and every
row whose regime is not the claim's says how it differs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from p3o.experiments.summary.blocks import END, START
from p3o.experiments.summary.claims import (
    claim_row_keys,
    front_page,
    load_caveats,
    load_instruments,
    load_mapping,
    render_claims,
    row_instrument,
    rows_of,
)
from p3o.experiments.summary.cli import main
from p3o.experiments.summary.pages import load, render_block
from p3o.experiments.summary.words import closing_words, lm_only_flips

ROOT = Path(__file__).resolve().parents[3]


def _record(claim: str, regime: str, b: str, diff: float, p: float, **over: object) -> dict:
    rec = {"claim": claim, "title": claim, "kind": "better", "regime": regime, "a": "p3o", "b": b,
           "metric": "pass@1", "role": "primary", "p_adj": p, "verdict": "supported", "exploratory": False,
           "alpha": 0.05, "n": 6, "mean_a": 0.8, "mean_b": 0.8 - diff, "diff": diff, "sd": 0.01,
           "ci": [diff - 0.01, diff + 0.01], "p_diff": p, "p_equiv": float("nan"), "margin": 0.02,
           "identical": False}  # fmt: skip
    return {**rec, **over}


def _setup(tmp_path: Path) -> tuple[list[str], Path]:
    results = tmp_path / "docs" / "results"
    results.mkdir(parents=True)
    pre = {"sha256": "ab" * 32, "commit": "c0" * 20, "committed_at": "t", "seeds": [1, 2], "exploratory": False}
    doc = {"preregistration": pre, "verdicts": [
        _record("stale", "stale-64", "grpo", -0.3, 1e-5), _record("stale", "stale-64", "cispo", -0.05, 0.03),
        _record("lag", "lag-4", "grpo", 0.001, 0.9, p_equiv=0.9)]}  # fmt: skip
    (results / "toy.verdicts.json").write_text(json.dumps(doc))
    mapping = {"instruments": {"lm": "a tiny model", "synthetic": "a toy"},
               "caveats": {"small": {"mark": "†", "text": "a small model"}}, "claims": [
        {"id": "s", "paper": "P3O", "claim": "P3O holds on stale data", "number": "0.55 vs 0.1",
         "rows": [{"regime": "LM: stale-64", "verdicts": [{"study": "toy", "claim": "stale"}], "instrument": "lm",
                   "label": "stale-64", "differs": "64 versions, not 8", "caveat": "small"},
                  {"regime": "LM: lag 10", "status": "testbed cannot bite", "note": "ESS 0.994", "ess": 0.994,
                   "instrument": "lm"}]},
        {"id": "t", "paper": "MinPRO", "claim": "Untested", "rows": [{"regime": "any", "status": "not yet run"}]},
    ]}  # fmt: skip
    path = tmp_path / "map.yaml"
    path.write_text(yaml.safe_dump(mapping, allow_unicode=True))
    readme = tmp_path / "README.md"
    readme.write_text(f"top\n{START}\n{END}\n")
    claims = str(tmp_path / "docs" / "paper-claims.md")
    argv = [str(results / "toy.verdicts.json"), "--out", str(results / "verdicts.md"), "--claims", claims,
            "--claims-map", str(path), "--readme", str(readme)]  # fmt: skip
    return argv, tmp_path


def test_claims_table_and_plot_regenerate_byte_identically(tmp_path: Path) -> None:
    argv, root = _setup(tmp_path)
    assert main(argv) == 0
    page = root / "docs" / "paper-claims.md"
    png = root / "docs" / "results" / "figures" / "paper-claims-forest.png"
    first = (page.read_bytes(), png.read_bytes(), (root / "README.md").read_bytes())
    assert png.stat().st_size > 5000 and b"Software" not in first[1] and b"Date" not in first[1]
    assert main(argv) == 0
    assert (page.read_bytes(), png.read_bytes(), (root / "README.md").read_bytes()) == first
    text = page.read_text()
    # the pooled family of 3: Holm p 3e-5 (contradicted: A is below B), 0.06 (inconclusive), 0.9 (not mapped)
    assert (
        '| P3O | <a id="s"></a>P3O holds on stale data | 0.55 vs 0.1 | LM: stale-64 — *differs from the claim\'s '
        "regime: 64 versions, not 8* † | **contradicted** p3o > grpo (stale-64)" in text
    )
    assert text.rstrip().endswith("† a small model")
    assert "**inconclusive** p3o > cispo (stale-64): -0.050 [-0.060, -0.040] (pass@1)" in text
    assert "*testbed cannot bite*: ESS 0.994 | – | – |" in text and "*not yet run* | – | – |" in text
    assert "[toy](results/toy.md)" in text and "![every verdict" in text
    block = (root / "README.md").read_text()
    assert "Testbeds — **LM testbed**: a tiny model" in block and " **simulator**: a toy" in block
    # three lists: the stale claim decided (contradicted) on the LM testbed, with its effect; the untested one not
    assert (
        "- [P3O holds on stale data](docs/paper-claims.md#s) (P3O): **contradicted 1** (stale-64 ≠ †), p3o − grpo "
        "-0.300 [-0.310, -0.290]" in block
    )
    assert "- [Untested](docs/paper-claims.md#t) (MinPRO): LM testbed not yet run; simulator not run" in block
    heads = ("**Decided on the LM testbed**", "**Decided only in the simulator**", "**Not tested here**")
    assert all(h in block for h in heads)
    # the dense per-claim table moved to the claims page
    assert (
        "| [P3O holds on stale data](#s) (P3O) | contradicted 1, inconclusive 1 (stale-64; ≠ 64 versions, not 8)"
        in text
    )
    # one count line of the pooled family, per instrument, saying how many verdicts of each label a claim row shows
    flat = " ".join(block.split())
    assert (
        "3 verdicts from 1 study — **LM testbed** 3: 0 supported, 1 contradicted (1 in a claim row), 0 negligible, "
        "2 inconclusive (1 in a claim row)" in flat
    )
    assert "lag-4" not in block


def _summary_files() -> list[Path]:
    """The verdict files of the summary command that renders the README (docs/results/README.md's "Generated by"
    line): the pooled family. A study that failed its bite condition keeps its verdict file but is not in it."""
    for line in (ROOT / "docs" / "results" / "README.md").read_text().splitlines():
        if line.startswith("Generated by `python -m p3o.experiments.summary "):
            words = line.split("`")[1].split()
            return [ROOT / w for w in words if w.endswith(".verdicts.json")]
    raise AssertionError("docs/results/README.md: no 'Generated by' line")


MAP = ROOT / "configs" / "experiments" / "records" / "paper-claims.yaml"


def _generated_by(page: Path) -> str:
    for line in page.read_text().splitlines():
        if line.startswith("Generated by `python -m p3o.experiments.summary "):
            return line.split("`")[1]
    raise AssertionError(f"{page}: no 'Generated by' line")


def test_the_front_page_and_claims_table_are_what_the_verdict_files_give(monkeypatch) -> None:
    """The README's results block and docs/paper-claims.md regenerate byte for byte from the summary's verdict files
    and the mapping (the forest plot is checked on the toy above); the results section fits one screen."""
    monkeypatch.chdir(ROOT)  # the study files (instrument) are found relative to the repository
    studies = load(_summary_files())
    claims, instruments, caveats = load_mapping(MAP), load_instruments(MAP), load_caveats(MAP)
    readme, page = ROOT / "README.md", ROOT / "docs" / "paper-claims.md"
    results = ROOT / "docs" / "results"
    lines = front_page(claims, studies, readme, page, instruments, caveats)
    pages = {"the papers' claims": page, "results": results / "README.md", "every verdict": results / "verdicts.md"}
    lead = closing_words(claims, studies, caveats)
    block = render_block(studies, readme, pages, lines, claim_row_keys(claims, studies), lead)
    text = readme.read_text()
    assert block in text
    command = _generated_by(page)
    forest = results / "figures" / "paper-claims-forest.png"
    assert render_claims(claims, studies, page, forest, command, caveats, instruments) == page.read_text()
    # issue 46: the results section is at most 25 lines (three lists and one count line), after the main job
    section = text.split("## What the runs show", 1)[1].split("\n## ", 1)[0]
    content = [line for line in section.splitlines() if line.strip() and not line.startswith("<!-- verdicts:")]
    assert len(content) <= 24  # + its heading: 25
    assert text.index("## The main job") < text.index("## What the runs show") < text.index("## Using it")
    assert text.index("## Set-up: two commands") < text.index("## The main job")


def test_the_front_page_separates_instruments_and_says_where_a_regime_differs(monkeypatch) -> None:
    """Issue 39: the block names both instruments, shows every claim (a claim with no LM verdict says "cannot be
    tested here" with the measured ESS, or "not run"), counts per instrument, and the rows the issue found
    mis-attributed say how their regime differs from the claim's."""
    monkeypatch.chdir(ROOT)
    studies = load(_summary_files())
    claims = load_mapping(MAP)
    block = render_block(studies, ROOT / "README.md", {}, front_page(claims, studies, ROOT / "README.md",
                         ROOT / "docs" / "paper-claims.md", load_instruments(MAP), load_caveats(MAP)))  # fmt: skip
    assert "Testbeds — **LM testbed**: a 0.85M-parameter" in block and "≤ 48 tokens" in block
    assert " **simulator**:" in block
    assert all(f"(docs/paper-claims.md#{c['id']})" in block for c in claims)
    flat = " ".join(block.split())
    assert "Pooled family" in flat and "**LM testbed** " in flat and "**simulator** " in flat
    assert not any(line.startswith(("187 confirmatory", "Confirmatory verdicts: ")) for line in block.splitlines())
    n0 = next(line for line in block.splitlines() if "#minpro-n0" in line)
    assert "LM testbed: cannot bite (ESS 0.9886)" in n0
    multi = next(line for line in block.splitlines() if "#multi-step" in line)
    assert "LM testbed: cannot bite (ESS 0.9577–0.9997)" in multi
    # issue 46: which claims were decided where (the pooled verdicts)
    lm, sim, none = (block.split(h, 1)[1] for h in ("on the LM testbed**", "only in the simulator**", "tested here**"))
    lm, sim = lm.split("**Decided only", 1)[0], sim.split("**Not tested", 1)[0]
    decided = ("#p3o-stale", "#k3-is", "#agent-offpolicy")  # issue 53: the agent study's in-flight row
    assert {c for c in decided if c in lm} == set(decided) and lm.count("\n- ") == 3
    for cid in ("p3o-on-policy", "p3o-clip-sensitivity", "multi-step", "minpro-n0", "minpro-grpo", "minpro-gspo",
                "minpro-cispo-m2po", "p3o-minpro"):  # fmt: skip
        assert f"#{cid})" in sim, cid
    for cid in ("p3o-fp8", "p3o-temperature", "p3o-async", "p4o", "minpro-asymre", "minpro-prefix", "moonshot"):
        assert f"#{cid})" in none, cid
    rows = {(c["id"], row["regime"]): row for c in claims for row in c["rows"]}
    # every simulator cell the issue named says how its regime differs (P4O, async, FP8)
    for cid in ("p4o", "p3o-async", "p3o-fp8"):
        sims = [row for (c, _), row in rows.items() if c == cid and row_instrument(row) == "synthetic"]
        assert sims and all(row.get("differs") for row in sims), cid
    assert all(row.get("differs") for (c, _), row in rows.items() if c == "p4o")
    # engine mismatch with one step: its only LM verdict is at async lag 10 with two steps
    lag10x2 = "LM: lag 10, 2 steps / iteration (ESS 0.939), P3O against GRPO at its best ε (lag10x2-eps)"
    assert "not an engine mismatch" in rows["p3o-clip-sensitivity", lag10x2]["differs"]
    # the n = 4 claims backed by the n = 2 study
    for cid in ("minpro-gspo", "minpro-cispo-m2po", "minpro-prefix"):
        lm = [row for c in claims if c["id"] == cid for row in c["rows"] if row_instrument(row) == "lm"]
        n2 = [row for row in lm if "n = 2" in row["regime"]]  # minpro-stale5's rows are at n = 4
        assert n2 and all("n = 2 (the claim: n = 4)" in row.get("differs", "") for row in n2), cid
    # the temperature claim's "supported" is at T = 0.6, where the paper says both collapse
    assert (
        "both collapse"
        in rows["p3o-temperature", "synthetic: T = 0.6 sampling, raw T = 1 log-probs, engine noise 0.4"]["differs"]
    )


def test_every_row_of_the_mapping_names_its_instrument_and_matches_its_studies(monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    studies = load(_summary_files())
    claims = load_mapping(MAP)
    for _claim, row, found in rows_of(claims, studies):
        assert row.get("instrument") in ("lm", "synthetic"), row["regime"]
        assert all(f.study.instrument == row["instrument"] for f in found), row["regime"]
        if row.get("status") == "testbed cannot bite" and row["instrument"] == "lm":
            assert row.get("ess") is not None, row["regime"]


def test_the_front_page_renders_as_three_lists_and_says_what_the_lm_verdicts_say(monkeypatch) -> None:
    """Issue 53: a blank line before each heading (CommonMark renders the instruments and three lists, not one list),
    at most 25 lines, the LM testbed's verdicts in words with the pooled family's simulator share and the verdict an
    LM-only family flips (computed), the testbed's exceptions named, caveat marks carried, the tested ε named and
    no number typed in the mapping's sentences."""
    markdown_it = pytest.importorskip("markdown_it")
    monkeypatch.chdir(ROOT)
    text = (ROOT / "README.md").read_text()
    block = text.split("<!-- verdicts:start -->\n", 1)[1].split("<!-- verdicts:end -->", 1)[0]
    lines = block.splitlines()
    assert len(lines) <= 25  # between the markers, blank lines included
    tokens = markdown_it.MarkdownIt("commonmark").parse(block)
    lists = [t for t in tokens if t.type == "bullet_list_open" and t.level == 0]
    assert len(lists) == 3  # the three lists (the instruments: the paragraph's last sentence)
    heads = [i for i, line in enumerate(lines) if line.startswith("**Decided") or line.startswith("**Not tested")]
    assert len(heads) == 3 and all(lines[i - 1] == "" for i in heads)
    studies = load(_summary_files())
    flips = lm_only_flips(studies)
    assert [(s.name, r["claim"], r["b"], r["verdict_pool"], lm["verdict_pool"]) for s, r, lm in flips] == [
        ("vllm", "vllm-kvfp8", "grpo-tm-0.2", "inconclusive", "supported")
    ]
    words = lines[0]
    assert words.startswith("**In words**: on the LM testbed the pooled verdicts support **no claim of either paper**")
    assert (
        "also holds the simulator's 106 verdicts" in words and "LM-only family of its 94 verdicts 1 verdict" in words
    )
    assert "+0.069 [+0.045, +0.093]: inconclusive (Holm p 0.0549) → supported" in words
    assert "(except minpro-stale5 (n = 4); vllm (8 prompts × 8 samples))" in block
    stale = next(line for line in lines if "#p3o-stale)" in line)
    assert "n = 2 (minpro-stale2) †" in stale and "† every arm ends below the base it started from" in words
    multi = next(line for line in lines if "#multi-step)" in line)
    assert "the ε tested is 0.2" in multi and "GRPO ε 0.2 − ε 0.6 is -0.007 [-0.008, -0.006] (negligible)" in multi
    mapping = MAP.read_text()
    assert "+0.038" not in mapping and "{-diff:synthetic/b-eps-mismatch}" in mapping
    assert "ε 0.6 − ε 0.2: +0.038)" in block
