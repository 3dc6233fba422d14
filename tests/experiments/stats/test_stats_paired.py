"""Paired statistics against known values: t quantiles, paired t, TOST, Holm, verdicts."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import scipy.stats

from p3o.experiments.stats.paired import (
    decide_family,
    decision_p,
    holm,
    paired,
    paired_bootstrap_ci,
    t_cdf,
    t_ppf,
    verdict,
)


@pytest.mark.parametrize(
    ("q", "df", "expected"),
    [(0.975, 1, 12.7062), (0.975, 5, 2.5706), (0.975, 10, 2.2281), (0.95, 3, 2.3534), (0.995, 20, 2.8453)],
)
def test_t_ppf_matches_tables(q: float, df: int, expected: float) -> None:
    assert t_ppf(q, df) == pytest.approx(expected, abs=1e-4)
    assert t_cdf(expected, df) == pytest.approx(q, abs=1e-5)
    assert t_cdf(-expected, df) == pytest.approx(1 - q, abs=1e-5)


def test_t_cdf_large_df_is_normal() -> None:
    assert t_cdf(1.959964, 1e7) == pytest.approx(0.975, abs=1e-6)
    assert t_cdf(0.0, 4) == 0.5


def test_paired_t_hand_computed() -> None:
    a = [0.5, 0.6, 0.7, 0.4, 0.55]
    b = [0.4, 0.45, 0.6, 0.35, 0.5]
    d = np.array(a) - np.array(b)  # 0.1, 0.15, 0.1, 0.05, 0.05
    res = paired(a, b, margin=0.2)
    se = d.std(ddof=1) / math.sqrt(5)
    assert res.diff == pytest.approx(0.09)
    assert res.ci[0] == pytest.approx(0.09 - 2.776445 * se, abs=1e-6)
    assert res.ci[1] == pytest.approx(0.09 + 2.776445 * se, abs=1e-6)
    t = 0.09 / se  # 4.811
    assert res.p_diff == pytest.approx(2 * (1 - t_cdf(t, 4)))
    assert res.p_diff == pytest.approx(0.00858, abs=2e-4)  # R: t.test(a, b, paired=TRUE)$p.value
    # TOST with margin 0.2: the upper one-sided test decides
    assert res.p_equiv == pytest.approx(t_cdf((0.09 - 0.2) / se, 4))
    assert res.p_equiv < 0.01
    assert not res.identical


def test_paired_identical_and_degenerate() -> None:
    res = paired([0.3, 0.4, 0.5], [0.3, 0.4, 0.5], margin=0.01)
    assert res.identical and res.diff == 0 and res.p_diff == 1.0 and res.p_equiv == 0.0
    assert verdict("identical", res, math.nan) == "supported"
    one = paired([0.3], [0.2])
    assert one.n == 1 and math.isnan(one.p_diff)
    assert verdict("better", one, math.nan) == "inconclusive"
    nan_pair = paired([0.3, math.nan, 0.5], [0.2, 0.1, 0.1])
    assert nan_pair.n == 2


def test_holm_known_values() -> None:
    # p = (0.01, 0.04, 0.03, 0.005), m = 4 → sorted 0.005·4, 0.01·3, 0.03·2, 0.04·1 with running max
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, math.nan]) == pytest.approx([0.5, math.nan], nan_ok=True)
    assert holm([0.9, 0.8]) == [1.0, 1.0]  # 2 · 0.8 caps at 1


def test_verdicts() -> None:
    res = paired([0.5, 0.6, 0.7, 0.4, 0.55], [0.4, 0.45, 0.6, 0.35, 0.5], margin=0.02)
    assert verdict("better", res, res.p_diff) == "supported"
    assert verdict("worse", res, res.p_diff) == "contradicted"
    assert verdict("better", res, 0.2) == "inconclusive"
    assert verdict("tracks", res, res.p_equiv, m=1) == "contradicted"  # 0.09 apart, margin 0.02
    wide = paired([0.5, 0.6, 0.7, 0.4, 0.55], [0.4, 0.45, 0.6, 0.35, 0.5], margin=0.3)
    assert verdict("tracks", wide, wide.p_equiv) == "supported"
    noisy = paired([0.1, 0.9, 0.2, 0.8], [0.8, 0.2, 0.7, 0.3], margin=0.05)
    assert verdict("tracks", noisy, noisy.p_equiv, m=1) == "inconclusive"


def test_bootstrap_ci_covers_mean() -> None:
    rng = np.random.default_rng(0)
    d = rng.normal(0.1, 0.05, size=30)
    lo, hi = paired_bootstrap_ci(d, resamples=4000)
    assert lo < d.mean() < hi
    t_lo, t_hi = paired(d, np.zeros_like(d)).ci
    assert abs(lo - t_lo) < 0.01 and abs(hi - t_hi) < 0.01


def test_a_tracks_verdict_is_contradicted_only_when_the_interval_clears_the_margin() -> None:
    base = [0.5, 0.6, 0.7, 0.4, 0.55]
    # d̄ = 0.05 > δ = 0.03 and significant, but the 95 % interval [+0.018, +0.082] reaches inside [−δ, δ].
    straddles = paired([b + d for b, d in zip(base, [0.02, 0.08, 0.05, 0.03, 0.07])], base, margin=0.03)
    assert straddles.p_diff < 0.05 and straddles.ci[0] < 0.03 < straddles.diff
    assert verdict("tracks", straddles, straddles.p_equiv) == "inconclusive"
    # The same mean with less spread: the interval [+0.042, +0.058] lies entirely above δ.
    clears = paired([b + d for b, d in zip(base, [0.05, 0.06, 0.04, 0.05, 0.05])], base, margin=0.03)
    assert clears.ci[0] > 0.03
    assert verdict("tracks", clears, clears.p_equiv) == "contradicted"
    # ... unless the family is so large that Bonferroni leaves the difference not significant.
    assert verdict("tracks", clears, clears.p_equiv, m=10**9) == "inconclusive"


def test_effects_below_the_margin_are_negligible_only_by_the_adjusted_tost() -> None:
    """Amendment negligible-holm-tost (issue 46): an estimate inside the margin enters its Holm family with its TOST
    p-value, and is negligible only when that adjusted p is below α; else inconclusive, never negligible on an
    unadjusted interval."""
    base = [0.5, 0.6, 0.7, 0.4, 0.55, 0.65]
    tiny = paired([b + d for b, d in zip(base, [0.002, 0.003, 0.002, 0.001, 0.002, 0.002])], base, margin=0.01)
    assert tiny.p_diff < 1e-3 and tiny.p_equiv < 1e-3  # significant, yet 0.002 < δ, and shown inside ±δ
    assert decision_p("better", tiny) == tiny.p_equiv
    assert verdict("better", tiny, tiny.p_equiv) == "negligible"
    assert verdict("worse", tiny, tiny.p_equiv) == "negligible"  # the wrong sign below δ is negligible too
    inside = paired([b + d for b, d in zip(base, [0.008, -0.006, 0.004, -0.004, 0.006, -0.002])], base, margin=0.01)
    assert inside.p_diff > 0.05 and inside.ci[0] > -0.01 and inside.ci[1] < 0.01
    assert verdict("better", inside, inside.p_equiv) == "negligible"  # TOST p alone, m = 1
    # The same interval in a family of 20: Holm multiplies the TOST p, and the verdict is inconclusive.
    assert inside.p_equiv * 20 > 0.05
    decided = decide_family(["better"] * 20, [inside] * 20)
    assert decided[0][1] == "inconclusive" and decided[0][0] == pytest.approx(min(1.0, 20 * inside.p_equiv))
    big = paired([b + 0.05 + d for b, d in zip(base, [0.002, 0.003, 0.002, 0.001, 0.002, 0.002])], base, margin=0.01)
    assert decision_p("better", big) == big.p_diff
    assert verdict("better", big, big.p_diff) == "supported" and verdict("worse", big, big.p_diff) == "contradicted"
    # Without a margin nothing is negligible (the old behaviour of a bare paired test).
    assert verdict("better", paired(tiny_a := [b + 0.002 for b in base], base), 1e-4) == "supported"
    assert len(tiny_a) == 6


ROOT = Path(__file__).resolve().parents[3]


def test_the_shipped_verdict_files_agree_with_scipy_stats() -> None:
    """Every stored paired-t interval, p-value and TOST p-value (written by the earlier, hand-written t
    distribution) is what scipy.stats gives from the record's n, mean difference and sd: the reference
    implementation kept in agreement with the results already published."""
    checked = 0
    for path in sorted((ROOT / "docs" / "results").glob("*.verdicts.json")):
        doc = json.loads(path.read_text())
        for r in doc["verdicts"] if isinstance(doc, dict) else doc:
            n, sd, d = r["n"], r["sd"], r["diff"]
            if n < 2 or sd is None or not sd > 0:
                continue
            se, df = sd / math.sqrt(n), n - 1
            half = scipy.stats.t.ppf(1 - r.get("alpha", 0.05) / 2, df) * se
            assert r["ci"] == pytest.approx([d - half, d + half], abs=1e-9), path.name
            assert r["p_diff"] == pytest.approx(2 * scipy.stats.t.sf(abs(d) / se, df), abs=1e-9), path.name
            if r.get("margin") is not None and r.get("p_equiv") is not None and not math.isnan(r["p_equiv"]):
                m = r["margin"]
                p_equiv = max(scipy.stats.t.sf((d + m) / se, df), scipy.stats.t.cdf((d - m) / se, df))
                assert r["p_equiv"] == pytest.approx(p_equiv, abs=1e-9), path.name
            checked += 1
    assert checked > 300


def test_paired_is_scipy_ttest() -> None:
    rng = np.random.default_rng(3)
    a, b = rng.normal(0.5, 0.1, 8), rng.normal(0.45, 0.1, 8)
    res = paired(a, b, margin=0.05)
    ref = scipy.stats.ttest_rel(a, b)
    assert res.p_diff == pytest.approx(ref.pvalue, rel=1e-12)
    assert res.ci == pytest.approx(tuple(ref.confidence_interval(0.95)), rel=1e-12)
