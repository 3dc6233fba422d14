"""docs/paper-claims.md and its forest plot are rendered from the verdict files through the declared mapping, byte
for byte the same on every run; the README statements say what the verdicts say (pooled family, regime by regime)
and no more."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from p3o.experiments.summary.blocks import END, START
from p3o.experiments.summary.claims import load_mapping, summary_lines
from p3o.experiments.summary.cli import main
from p3o.experiments.summary.pages import load

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
        _record("lag", "lag-4", "grpo", 0.001, 0.9)]}  # fmt: skip
    (results / "toy.verdicts.json").write_text(json.dumps(doc))
    mapping = {"claims": [
        {"id": "s", "paper": "P3O", "claim": "P3O holds on stale data", "number": "0.55 vs 0.1",
         "rows": [{"regime": "LM: stale-64", "verdicts": [{"study": "toy", "claim": "stale"}]},
                  {"regime": "LM: lag 10", "status": "testbed cannot bite", "note": "ESS 0.994"}]},
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
        "| P3O | P3O holds on stale data | 0.55 vs 0.1 | LM: stale-64 | **contradicted** p3o > grpo (stale-64)" in text
    )
    assert "**inconclusive** p3o > cispo (stale-64): -0.050 [-0.060, -0.040] (pass@1)" in text
    assert "*testbed cannot bite*: ESS 0.994 | – | – |" in text and "*not yet run* | – | – |" in text
    assert "[toy](results/toy.md)" in text and "![every verdict" in text
    block = (root / "README.md").read_text()
    assert (
        "- **P3O holds on stale data** (P3O) — LM: stale-64: contradicted 1, inconclusive 1." in block
    )
    assert "No verdict yet: Untested" in block and "lag-4" not in block


def test_the_readme_statements_on_the_shipped_verdicts_claim_no_more_than_them() -> None:
    """Issue 29's four overclaims: the generated statements give each regime's verdicts as counts (the pooled
    family's), so an inconclusive comparison is counted as one and never read as a match or a win."""
    studies = load(sorted((ROOT / "docs" / "results").glob("*.verdicts.json")))
    claims = load_mapping(ROOT / "configs" / "experiments" / "records" / "paper-claims.yaml")
    lines = summary_lines(claims, studies, ROOT / "README.md", ROOT / "docs" / "paper-claims.md")
    assert all(len(line) <= 118 for line in lines)
    text = " ".join(line.strip() for line in lines)
    # lags 1, 2, 4: MinPRO and CISPO at lag 4 are the two inconclusive ones, not matched
    assert "lags 1, 2, 4 (GRPO token-mean ε = 0.2, no decoupled arm): negligible 8, inconclusive 2" in text
    # stale-64: CISPO is inconclusive under the pooled family
    assert "stale-64, P3O against each GRPO-family baseline: contradicted 6, inconclusive 1" in text
    # stale-32: k3_is tracking GRPO is inconclusive
    assert "LM: stale-32: supported 1, inconclusive 1" in text
    # FP8 KV cache: supported on training reward against one baseline, held-out pass@1 inconclusive
    assert "FP8 KV cache (training reward): supported 1, negligible 3, inconclusive 3" in text
    assert "(held-out pass@1, secondary): negligible (secondary) 2, inconclusive (secondary) 5" in text
