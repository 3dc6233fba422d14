"""Paired statistics that decide a claim: paired t and bootstrap intervals, TOST equivalence, Holm's correction.

Every comparison in an experiment is *paired by seed*: run ``seed k`` of objective A and run ``seed k`` of
objective B share the base policy, the prompt stream and the sampling seed, so the unit of analysis is the per-seed
difference ``d_k = m_A(k) − m_B(k)`` of the primary metric ``m``. With ``n`` pairs, mean ``d̄`` and sample standard
deviation ``s``:

    t = d̄ / (s / √n),   df = n − 1                                   (paired t)
    CI_{1−α} = d̄ ± t_{1−α/2, df} · s / √n
    p_diff = 2 · (1 − F_t(|t|; df))                                   (H0: E d = 0)
    p_equiv = max(p_lower, p_upper)                                   (TOST, H0: |E d| ≥ δ)
      p_lower = 1 − F_t((d̄ + δ) / (s/√n); df),  p_upper = F_t((d̄ − δ) / (s/√n); df)

Holm's step-down correction over the m decision p-values of a report: sort p_(1) ≤ … ≤ p_(m);
``p̃_(i) = max_{j ≤ i} min(1, (m − j + 1) · p_(j))``. With the declared margin δ (the claim's or the primary
block's) a verdict is then

- ``better`` (A beats B): when the estimate is inside the margin (|d̄| < δ) the verdict's decision p-value is its
  TOST p_equiv, Holm-adjusted in the same family as every other verdict, and the verdict is *negligible* when
  p̃_equiv < α, else inconclusive (amendment ``negligible-holm-tost`` of the analysis rules, recorded in
  configs/experiments/records/ledger.yaml: before it, an unadjusted (1 − α) interval inside (−δ, δ), or a
  significant |d̄| < δ, was called negligible); otherwise (|d̄| ≥ δ) the decision p-value is p_diff, and the verdict
  is supported when p̃_diff < α and d̄ ≥ δ, contradicted when p̃_diff < α and d̄ ≤ −δ (``worse``: the mirror
  image);
- ``tracks`` (A within ±δ of B): supported when p̃_equiv < α (TOST); contradicted only when the (1 − α) interval
  lies entirely outside [−δ, δ] and the difference is significant after Bonferroni (m · p_diff < α);
- ``identical``: supported when every paired difference is exactly zero (the same per-seed value), contradicted
  otherwise;
- anything else: inconclusive.

The reference implementation is ``scipy.stats``: the paired t-test and its interval are
``scipy.stats.ttest_1samp`` on the differences (H0: E d = 0, two-sided; ``confidence_interval``), and the TOST is two
one-sided ``ttest_1samp`` tests of H0: E d ≤ −δ (alternative "greater") and H0: E d ≥ δ (alternative "less"); the
t distribution itself is ``scipy.stats.t``. The stored verdict files agree with it to 1e-9 (tested), and
``p3o compare --check FILE`` recomputes every verdict of a file from its per-seed values with these functions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import t as _t
from scipy.stats import ttest_1samp

__all__ = [
    "KIND_TEXT",
    "PairedResult",
    "decide_family",
    "decision_p",
    "holm",
    "paired",
    "paired_bootstrap_ci",
    "t_cdf",
    "t_ppf",
    "verdict",
]

#: Every verdict label, in the order the reports count them.
VERDICTS = ("supported", "contradicted", "negligible", "inconclusive")


def t_cdf(t: float, df: float) -> float:
    """Student-t cumulative distribution F_t(t; df) (``scipy.stats.t.cdf``)."""
    if not df > 0:
        raise ValueError(f"df must be > 0, got {df}")
    return float(_t.cdf(t, df))


def t_ppf(q: float, df: float) -> float:
    """Quantile of the Student-t distribution (``scipy.stats.t.ppf``)."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"q must be in (0, 1), got {q}")
    return float(_t.ppf(q, df))


@dataclass
class PairedResult:
    """A paired comparison of A and B on one metric (``diff = A − B`` per seed)."""

    n: int
    mean_a: float
    mean_b: float
    diff: float
    """Mean paired difference d̄."""
    sd: float
    """Sample standard deviation of the differences (ddof = 1)."""
    ci: tuple[float, float]
    """Two-sided (1 − α) paired-t interval for E d."""
    p_diff: float
    """Two-sided paired-t p-value of H0: E d = 0 (1.0 when every difference is 0, nan with n < 2)."""
    p_equiv: float
    """TOST p-value of H0: |E d| ≥ margin (nan when no margin is given)."""
    margin: float | None
    identical: bool
    """Every paired difference is exactly 0."""
    boot_ci: tuple[float, float] | None = None
    """Percentile paired-bootstrap interval, when asked for."""

    def to_dict(self) -> dict[str, object]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @classmethod
    def from_record(cls, r: dict[str, object]) -> PairedResult:
        """The stored paired result of a verdict record (``*.verdicts.json``)."""

        def num(key: str) -> float:
            v = r.get(key)
            return math.nan if v is None else float(v)  # type: ignore[arg-type]

        lo, hi = r["ci"]  # type: ignore[misc]
        margin = r.get("margin")
        return cls(
            n=int(r["n"]),  # type: ignore[call-overload]
            mean_a=num("mean_a"),
            mean_b=num("mean_b"),
            diff=num("diff"),
            sd=num("sd"),
            ci=(math.nan if lo is None else float(lo), math.nan if hi is None else float(hi)),
            p_diff=num("p_diff"),
            p_equiv=num("p_equiv"),
            margin=None if margin is None else float(margin),  # type: ignore[arg-type]
            identical=bool(r.get("identical")),
        )


def paired(
    a: Sequence[float],
    b: Sequence[float],
    *,
    margin: float | None = None,
    alpha: float = 0.05,
    bootstrap: int = 0,
    seed: int = 0,
) -> PairedResult:
    """Paired-t comparison of per-seed values `a` and `b` (same length, same seed order).

    Args:
        a, b: (n,) metric values; pair k is seed k of both arms. NaN pairs are dropped.
        margin: equivalence margin δ > 0 for TOST (None: no equivalence test).
        alpha: the interval is (1 − alpha) two-sided.
        bootstrap: number of paired-bootstrap resamples for ``boot_ci`` (0: none).
        seed: bootstrap RNG seed.
    """
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"paired: a and b must be 1-D of the same length, got {x.shape} and {y.shape}")
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    d = x - y
    n = int(d.size)
    nan = math.nan
    if n == 0:
        return PairedResult(0, nan, nan, nan, nan, (nan, nan), nan, nan, margin, False)
    mean = float(d.mean())
    identical = bool(np.all(d == 0.0))
    sd = float(d.std(ddof=1)) if n > 1 else nan
    if n < 2:
        ci, p_diff, p_equiv = (nan, nan), nan, nan
    elif sd == 0.0:  # no spread: the difference is known exactly
        ci = (mean, mean)
        p_diff = 1.0 if mean == 0.0 else 0.0
        p_equiv = nan if margin is None else (0.0 if abs(mean) < margin else 1.0)
    else:
        test = ttest_1samp(d, 0.0)  # H0: E d = 0, two-sided paired t (df = n − 1)
        ci_low, ci_high = test.confidence_interval(1.0 - alpha)
        ci, p_diff = (float(ci_low), float(ci_high)), float(test.pvalue)
        if margin is None:
            p_equiv = nan
        else:  # TOST: both one-sided nulls E d ≤ −δ and E d ≥ δ must be rejected
            p_lower = float(ttest_1samp(d, -margin, alternative="greater").pvalue)
            p_upper = float(ttest_1samp(d, margin, alternative="less").pvalue)
            p_equiv = max(p_lower, p_upper)
    boot = paired_bootstrap_ci(d, alpha=alpha, resamples=bootstrap, seed=seed) if bootstrap and n > 1 else None
    return PairedResult(n, float(x.mean()), float(y.mean()), mean, sd, ci, p_diff, p_equiv, margin, identical, boot)


def paired_bootstrap_ci(
    diffs: Sequence[float], *, alpha: float = 0.05, resamples: int = 10_000, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of per-seed differences (resampling seeds with replacement)."""
    d = np.asarray(diffs, dtype=np.float64)
    d = d[np.isfinite(d)]
    if d.size < 2:
        return (math.nan, math.nan)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, d.size, size=(resamples, d.size))
    means = d[idx].mean(axis=1)
    return (float(np.quantile(means, alpha / 2)), float(np.quantile(means, 1 - alpha / 2)))


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm–Bonferroni adjusted p-values, in the input order (NaN stays NaN and does not count towards m)."""
    p = [float(v) for v in pvalues]
    order = sorted((i for i, v in enumerate(p) if not math.isnan(v)), key=lambda i: p[i])
    m = len(order)
    out = [math.nan] * len(p)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out


def verdict(kind: str, res: PairedResult, p_adj: float, *, m: int = 1, alpha: float = 0.05) -> str:
    """supported / contradicted / negligible / inconclusive for a claim of `kind` (see the module docstring).

    Args:
        kind: "better" (A > B), "worse" (A < B), "tracks" (|A − B| < margin) or "identical".
        res: the paired comparison; ``res.margin`` is δ (None: no effect is called negligible, and a tracks claim
            is contradicted by any significant difference outside 0).
        p_adj: Holm-adjusted decision p-value (:func:`decision_p`: p_equiv for tracks and for a better / worse
            estimate inside the margin, else p_diff).
        m: number of decisions in the family (for the Bonferroni contradiction rule of "tracks").
    """
    if res.n == 0:
        return "inconclusive"
    if kind == "identical":
        return "supported" if res.identical else "contradicted"
    margin = res.margin if res.margin is not None else 0.0
    lo, hi = res.ci
    if kind in ("better", "worse"):
        decided = not math.isnan(p_adj) and p_adj < alpha
        if inside_margin(res):  # p_adj is the Holm-adjusted TOST p (decision_p)
            return "negligible" if decided else "inconclusive"
        significant = decided and res.diff != 0
        if not significant:
            return "inconclusive"
        good = res.diff > 0 if kind == "better" else res.diff < 0
        return "supported" if good else "contradicted"
    if kind == "tracks":
        if not math.isnan(p_adj) and p_adj < alpha:
            return "supported"
        outside = lo > margin or hi < -margin
        if outside and not math.isnan(res.p_diff) and res.p_diff * m < alpha:
            return "contradicted"
        return "inconclusive"
    raise ValueError(f"verdict: unknown claim kind {kind!r}")


def inside_margin(res: PairedResult) -> bool:
    """The estimate is inside the declared margin (|d̄| < δ): the only place *negligible* can be
    decided, by the TOST (an estimate of δ or more can be neither negligible nor shown inside ±δ)."""
    margin = res.margin if res.margin is not None else 0.0
    return margin > 0 and not math.isnan(res.diff) and abs(res.diff) < margin


def decision_p(kind: str, res: PairedResult) -> float:
    """The p-value a verdict enters its Holm family with: the TOST p_equiv for ``tracks`` and for a ``better`` /
    ``worse`` estimate inside the margin (:func:`inside_margin`: a *negligible* candidate), else p_diff."""
    if kind == "tracks" or (kind in ("better", "worse") and inside_margin(res)):
        return res.p_equiv
    return res.p_diff


#: The test each decisive kind runs, as the reports print it.
KIND_TEXT = {"better": "A > B", "worse": "A < B", "tracks": "|A − B| < δ", "identical": "A ≡ B"}


def decide_family(
    kinds: Sequence[str], results: Sequence[PairedResult], *, alpha: float = 0.05
) -> list[tuple[float, str]]:
    """(Holm-adjusted p, verdict) for each claim of one report, in order.

    The decision p-value is :func:`decision_p` (the TOST p_equiv for ``tracks`` and for a ``better`` / ``worse``
    estimate inside the margin, else p_diff); ``identical`` claims are exact checks, outside the Holm family (their
    adjusted p is NaN).
    """
    tested = [i for i, k in enumerate(kinds) if k != "identical"]
    raw = [decision_p(kinds[i], results[i]) for i in tested]
    p_adj = [math.nan] * len(kinds)
    for i, p in zip(tested, holm(raw)):
        p_adj[i] = p
    m = max(1, len(tested))
    return [(p_adj[i], verdict(kinds[i], results[i], p_adj[i], m=m, alpha=alpha)) for i in range(len(kinds))]
