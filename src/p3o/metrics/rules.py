"""The off-policy findings: their rules, thresholds and causes, over rows of monitor statistics.

`find(rows)` reads the statistics :class:`p3o.metrics.monitor.OffPolicyMonitor` logs (one mapping per step) and
returns the :class:`Finding` s that fire, each attributed to a cause (:data:`CAUSES`) by comparing the fresh tokens
(lag 0) with the stale ones: staleness when the stale buckets carry it and lag 0 is clean, the engine when lag 0
carries it, both, weights not reaching the engine (fresh mismatch growing after each weight push), or undetermined
without lag information. `suggest(name, cause, source)` names the fix in the words of the trainer that logged the
rows (p3o, TRL, verl). The same rules serve the live monitor and ``p3o doctor``; docs/metrics.md lists them with
their thresholds.

    findings = find(rows, window=20)           # rows: [{"ess": 0.93, "ess_lag_0": 1.0, ...}, ...]
    for f in findings: print(f.name, f.cause, f.message)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from p3o.metrics.advice import _get, suggest

#: Lag buckets (inclusive lower, inclusive upper; None = no upper bound) and their key suffixes.
LAG_BUCKETS: tuple[tuple[int, int | None], ...] = ((0, 0), (1, 1), (2, 3), (4, 7), (8, None))
N_POSITION_BUCKETS = 10
LAG_HIST_BINS = 32


def lag_bucket_names() -> list[str]:
    """Key suffixes of :data:`LAG_BUCKETS`: ``0``, ``1``, ``2_3``, ``4_7``, ``8_plus``."""
    return [f"{lo}" if hi == lo else (f"{lo}_plus" if hi is None else f"{lo}_{hi}") for lo, hi in LAG_BUCKETS]


_SPLIT = ("tokens", "ess", "dlogp_mean", "ratio_tails", "ratio_max", "m_mean")


def split_keys() -> list[str]:
    """The keys that split a step's tokens into fresh (lag 0, suffix ``_lag_0``) and stale (lag ≥ 1, ``_stale``)
    ones, position deciles included: ``tokens_lag_0``, ``ess_stale``, ..., ``dlogp_pos_stale_9`` (``ess_lag_0`` is
    also a lag bucket's)."""
    keys = [f"{k}_{g}" for k in _SPLIT for g in ("lag_0", "stale")]
    keys += [f"dlogp_pos_{g}_{d}" for g in ("lag_0", "stale") for d in range(N_POSITION_BUCKETS)]
    return keys


def prefixed(stats: Mapping[str, float], prefix: str = "offpolicy/") -> dict[str, float]:
    """``stats`` with every key prefixed (how the TRL callback and the verl plug-in log them)."""
    return {f"{prefix}{k}": v for k, v in stats.items()}


def strip_prefixes(row: Mapping[str, Any], prefixes: Iterable[str]) -> dict[str, Any]:
    """A metrics row with the first matching prefix removed from each key; a prefixed key wins over a bare one."""
    out: dict[str, Any] = {}
    pre = tuple(prefixes)
    for k, v in row.items():
        if not any(k.startswith(p) for p in pre):
            out.setdefault(k, v)
    for p in reversed(pre):
        for k, v in row.items():
            if k.startswith(p):
                out[k[len(p) :]] = v
    return out


# ----------------------------------------------------------------------------------------------------- findings

#: Causes a finding is attributed to, and the number its ``cause_<name>`` key carries (0: the finding does not fire).
CAUSES: dict[str, int] = {
    "staleness": 1,
    "engine": 2,
    "both": 3,
    "sync": 4,
    "undetermined": 5,
    "unsolved": 6,
    "solved": 7,
    "tied": 8,
    "inflight": 9,
}
#: How the causes read in a verdict line and a table. unsolved, solved and tied are the no-signal finding's: the groups
#: carry no advantage because the model never solves the task, always solves it, or its samples tie within each group.
#: inflight: a run with in-flight weight updates, whose fresh tokens' mismatch is theirs (:func:`find`).
CAUSE_TEXT: dict[str, str] = {
    "staleness": "staleness",
    "engine": "engine mismatch",
    "both": "staleness and engine mismatch",
    "sync": "weights not reaching the engine",
    "undetermined": "staleness or engine mismatch (no lag recorded)",
    "unsolved": "the model never solves the task",
    "solved": "the model always solves the task",
    "tied": "every sample of a group gets the same reward",
    "inflight": "in-flight weight updates (tokens after a push read KV from the older weights), not the engine",
}
#: Where a stale token's lag comes from (:func:`staleness_origin`): optimizer updates on its own batch before it was
#: scored (p3o's mini-batches, the monitor's ``lag_in_batch_mean``), or policy versions between sampling and training.
ORIGINS = ("mini-batches", "policy lag", "policy lag and mini-batches")


@dataclass(frozen=True)
class Finding:
    """One named finding: what fired, the rule and threshold it used, the numbers, its cause and what to do.

    Attributes:
        name: the rule's name (``low_ess``, ``ess_collapse``, ``weights_not_synced``, ...; docs/metrics.md).
        message: one plain-language line, the threshold included.
        evidence: the numbers behind it, the fresh (lag 0) and stale (lag ≥ 1) tokens' shares included.
        suggestion: what to change, in the words of the trainer the metrics came from (``source``).
        cause: a key of :data:`CAUSES`: ``staleness`` (the stale tokens carry it, lag 0 is clean), ``engine`` (the
            fresh tokens carry it), ``both``, ``sync`` (the engine's weights do not follow the trainer's) or
            ``undetermined`` (no token lags were recorded).
        steps: the steps a single-step finding fired on (``ess_collapse``: "4", "row 7"), else empty.
    """

    name: str
    message: str
    evidence: str
    suggestion: str
    cause: str = "undetermined"
    steps: tuple[str, ...] = ()

    @property
    def cause_code(self) -> int:
        """The cause as a number for JSONL / TensorBoard (:data:`CAUSES`)."""
        return CAUSES[self.cause]


#: Thresholds of the rules in :func:`find` (docs/metrics.md "Off-policy findings").
RULES: dict[str, float] = {
    "ess_threshold": 0.9,  # low_ess: ESS below this ...
    "ess_share": 0.5,  # ... on more than this share of the window's steps
    "ess_floor": 0.2,  # ess_collapse: any single step with ESS below this ...
    "ratio_ceiling": 1e3,  # ... or a ratio above this
    "drift_factor": 3.0,  # position_drift: last decile's |Δlogp| ≥ this × the first decile's ...
    "drift_floor": 0.03,  # ... and ≥ this (nats): fp32 noise and the small drift of a lag-2 batch stay silent
    "drift_support": 0.5,  # ... over the deciles that at least this share of the window's steps reached
    "tail_share": 0.01,  # ratio_tails: share of tokens with ρ > 2 or ρ < 0.5 above this (window mean)
    "m_floor": 0.5,  # prefix_decay: window mean of MinPRO's m_t below this
    "fresh_dlogp": 5e-4,  # engine_mismatch: median over the window's steps of the fresh tokens' mean |Δlogp| (nats)
    "stale_margin": 2.0,  # attribution: stale tokens carry a finding when their excess is ≥ this × the fresh ones'
    "sync_min_steps": 4,  # weights_not_synced: at least this many steps with fresh (lag-0) tokens ...
    "sync_trend": 0.5,  # ... the fresh tokens' |Δlogp| trends up with the step: Kendall's τ at least this ...
    "sync_factor": 2.0,  # ... its last third's mean is ≥ this × its first third's ...
    "sync_floor": 0.02,  # ... and ≥ this (nats)
    "min_steps": 10,  # PATIENT_RULES judge a window of at least this many steps (or of --window, when shorter)
    "signal_share": 0.9,  # no_signal: share of groups whose advantages are all zero at least this ...
    "signal_steps": 3,  # ... over this many steps (its own window: a short run is judged after this many)
    "signal_low": 0.1,  # ... with mean reward ≤ this: the model never solves the task; ≥ signal_high: always
    "signal_high": 0.9,
}


def staleness_origin(rows: Sequence[Mapping[str, Any]]) -> str:
    """Where the window's lag comes from, a key of :data:`ORIGINS`, or ``""`` when the rows do not say.

    Over the rows with both ``lag_mean`` (optimizer updates since sampling) and ``lag_in_batch_mean`` (its part from
    updates on the token's own batch: the earlier mini-batches of a p3o update), with means L and B: no lag (L = 0)
    or no ``lag_in_batch_mean`` (a trainer whose versions are its optimizer steps, rows recorded before p3o counted
    mini-batches) -> ``""``; B ≥ 0.9·L -> ``mini-batches``; B ≤ 0.1·L -> ``policy lag``; else both.
    """
    pairs = [
        (float(r["lag_mean"]), float(r["lag_in_batch_mean"]))
        for r in rows
        if all(isinstance(r.get(k), int | float) and math.isfinite(r[k]) for k in ("lag_mean", "lag_in_batch_mean"))
    ]
    if not pairs:
        return ""
    lag, in_batch = _mean([a for a, _ in pairs]), _mean([b for _, b in pairs])
    if not lag > 0:
        return ""
    if in_batch >= 0.9 * lag:
        return "mini-batches"
    if in_batch <= 0.1 * lag:
        return "policy lag"
    return "policy lag and mini-batches"


def cause_text(cause: str, origin: str = "") -> str:
    """How ``cause`` reads in a verdict line and a message (:data:`CAUSE_TEXT`), staleness with its ``origin``
    (:func:`staleness_origin`): ``staleness from mini-batches``, ``staleness from policy lag and engine mismatch``."""
    text = CAUSE_TEXT[cause]
    if origin and cause in ("staleness", "both"):
        text = text.replace("staleness", f"staleness from {origin}", 1)
    return text


def _vals(rows: Sequence[Mapping[str, Any]], key: str) -> list[float]:
    out = []
    for r in rows:
        v = r.get(key)
        if isinstance(v, int | float) and math.isfinite(float(v)):
            out.append(float(v))
    return out


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def _median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    return s[len(s) // 2] if s else math.nan


def _has_lags(rows: Sequence[Mapping[str, Any]]) -> bool:
    return bool(_vals(rows, "lag_mean") or _vals(rows, "tokens_lag_0") or _vals(rows, "tokens_stale"))


def _attribute(
    rows: Sequence[Mapping[str, Any]], fresh_bad: bool | None, stale_bad: bool | None, why: str
) -> tuple[str, str]:
    """(cause, one line of evidence) from whether the fresh (lag 0) and the stale (lag ≥ 1) tokens carry a finding.

    None: that group had no tokens in the window (or the rows predate the split keys). Fresh tokens carry it ->
    ``engine`` (``both`` when the stale ones carry it too, beyond what the engine explains); only the stale ones ->
    ``staleness``, also when neither carries it alone but the fresh ones are clean (the mix of the two does); no
    lags recorded -> ``undetermined``.
    """
    if not _has_lags(rows):
        return "undetermined", "no token lags recorded, so fresh and stale tokens cannot be told apart"
    lag = _mean(_vals(rows, "lag_mean"))
    if stale_bad is None and not _vals(rows, "tokens_stale") and not math.isnan(lag) and lag > 0.5:
        # rows without the stale split (recorded before it existed) but with stale tokens: the mix carries it
        stale_bad = fresh_bad is not True
        why += f" (mean lag {lag:.2f})"
    if fresh_bad and stale_bad:
        return "both", why
    if fresh_bad:
        return "engine", why
    if fresh_bad is None and stale_bad is not None:
        return "staleness", why + " (no lag-0 tokens in the window, so the engine's share is not measured)"
    if stale_bad or (fresh_bad is False and stale_bad is False):
        return "staleness", why
    return "engine", why  # only fresh tokens were seen: lag 0 carries it


def _stale_carries(
    over: bool | None, fresh_excess: float, stale_excess: float, th: Mapping[str, float]
) -> bool | None:
    """Do the stale tokens carry a finding? `over`: they cross its threshold (None: no stale tokens in the window);
    when the fresh tokens were measured, the stale ones' excess must also be ≥ `stale_margin` × theirs (else the
    engine's share explains it). Excess: how far past clean (1 − ESS, the tail share, 1 − m_t)."""
    if over is None:
        return None
    return over and (math.isnan(fresh_excess) or stale_excess >= th["stale_margin"] * fresh_excess)


def _attributed(
    rows: Sequence[Mapping[str, Any]],
    name: str,
    message: str,
    evidence: str,
    fresh_bad: bool | None,
    stale_bad: bool | None,
    why: str,
) -> Finding:
    """The finding `name` with its cause (`_attribute`) and the evidence followed by the fresh / stale split."""
    cause, why = _attribute(rows, fresh_bad, stale_bad, why)
    return Finding(name, message, f"{evidence}; {why}", "", cause)


def _fmt_opt(x: float, spec: str = ".3f") -> str:
    return "n/a" if math.isnan(x) else format(x, spec)


def _ess_low_share(values: list[float], th: Mapping[str, float]) -> float:
    return sum(e < th["ess_threshold"] for e in values) / len(values) if values else math.nan


def _low_ess(rows: Sequence[Mapping[str, Any]], th: Mapping[str, float]) -> Finding | None:
    ess = _vals(rows, "ess")
    if not ess:
        return None
    low = sum(e < th["ess_threshold"] for e in ess)
    if low <= th["ess_share"] * len(ess):
        return None
    fresh, stale = _vals(rows, "ess_lag_0"), _vals(rows, "ess_stale")
    f_med, s_med = _median(fresh), _median(stale)
    f_bad = None if not fresh else _ess_low_share(fresh, th) > th["ess_share"]
    s_over = None if not stale else _ess_low_share(stale, th) > th["ess_share"]
    return _attributed(
        rows,
        "low_ess",
        f"ESS below {th['ess_threshold']} on {low} of {len(ess)} steps (threshold: more than {th['ess_share']:.0%})",
        f"ess min {min(ess):.3f}, mean {_mean(ess):.3f}",
        f_bad,
        _stale_carries(s_over, 1 - f_med, 1 - s_med, th),
        f"median ESS of fresh tokens {_fmt_opt(f_med)}, of stale tokens {_fmt_opt(s_med)}",
    )


def _step_of(row: Mapping[str, Any], index: int) -> str:
    v = row.get("step")
    return str(int(v)) if isinstance(v, int | float) and math.isfinite(float(v)) else f"row {index + 1}"


def _ess_collapse(rows: Sequence[Mapping[str, Any]], th: Mapping[str, float]) -> Finding | None:
    hits = []
    for i, r in enumerate(rows):
        e, mx = r.get("ess"), r.get("ratio_max")
        low = isinstance(e, int | float) and math.isfinite(e) and e < th["ess_floor"]
        high = isinstance(mx, int | float) and math.isfinite(mx) and mx > th["ratio_ceiling"]
        if low or high:
            hits.append((i, r, low, high))
    if not hits:
        return None

    def bad(r: Mapping[str, Any], suffix: str) -> bool | None:
        e, mx, n = r.get(f"ess_{suffix}"), r.get(f"ratio_max_{suffix}"), r.get(f"tokens_{suffix}")
        if not isinstance(n, int | float) or not n > 0:
            return None
        return bool(
            (isinstance(e, int | float) and math.isfinite(e) and e < th["ess_floor"])
            or (isinstance(mx, int | float) and math.isfinite(mx) and mx > th["ratio_ceiling"])
        )

    shown = []
    f_any: bool | None = None
    s_any: bool | None = None
    for i, r, low, high in hits:
        what = []
        if low:
            what.append(f"ESS {float(r['ess']):.3f}")
        if high:
            what.append(f"max ratio {float(r['ratio_max']):.3g}")
        shown.append(f"step {_step_of(r, i)}: {', '.join(what)}")
        fb, sb = bad(r, "lag_0"), bad(r, "stale")
        if fb is not None:
            f_any = bool(f_any) or fb
        if sb is not None:
            s_any = bool(s_any) or sb
    fresh = [r.get("ess_lag_0") for _, r, _, _ in hits]
    stale = [r.get("ess_stale") for _, r, _, _ in hits]
    why = (
        "fresh tokens' ESS at those steps "
        + " ".join(_fmt_opt(float(v)) if isinstance(v, int | float) else "n/a" for v in fresh)
        + ", stale tokens' "
        + " ".join(_fmt_opt(float(v)) if isinstance(v, int | float) else "n/a" for v in stale)
    )
    cause, why = _attribute(rows, f_any, s_any, why)
    steps = ", ".join(_step_of(r, i) for i, r, _, _ in hits[:8]) + (" …" if len(hits) > 8 else "")
    return Finding(
        "ess_collapse",
        f"ESS collapsed at step {steps} (any single step with ESS < {th['ess_floor']:g} or a ratio > "
        f"{th['ratio_ceiling']:g})",
        "; ".join(shown[:8]) + f"; {why}",
        "",
        cause,
        tuple(_step_of(r, i) for i, r, _, _ in hits),
    )


def _drift(rows: Sequence[Mapping[str, Any]], prefix: str, th: Mapping[str, float]) -> tuple[float, str] | None:
    """(factor, description) when |Δlogp| by decile (keys ``prefix<d>``) grows along the response past the rule's
    thresholds, else None (also when fewer than two deciles have support)."""
    per_decile = [_vals(rows, f"{prefix}{d}") for d in range(N_POSITION_BUCKETS)]
    have = [(d, _mean(v)) for d, v in enumerate(per_decile) if v and len(v) >= th["drift_support"] * len(rows)]
    if len(have) < 2:
        return None
    half = len(have) // 2
    first = _mean([v for _, v in have[:half]])
    last = _mean([v for _, v in have[len(have) - half :]])
    if last >= th["drift_factor"] * first and last >= th["drift_floor"]:
        factor = last / first if first > 0 else math.inf
        span = f"({have[0][0]}–{have[half - 1][0]} vs {have[len(have) - half][0]}–{have[-1][0]})"
        return factor, span + "; |Δlogp| by decile: " + " ".join(f"{v:.3g}" for _, v in have)
    return None


def _position_drift(rows: Sequence[Mapping[str, Any]], th: Mapping[str, float]) -> Finding | None:
    found = _drift(rows, "dlogp_pos_", th)
    if found is None:
        return None
    factor, desc = found
    has_fresh = bool(_vals(rows, "tokens_lag_0")) and any(_vals(rows, f"dlogp_pos_lag_0_{d}") for d in range(10))
    has_stale = bool(_vals(rows, "tokens_stale")) and any(_vals(rows, f"dlogp_pos_stale_{d}") for d in range(10))
    f_bad = (_drift(rows, "dlogp_pos_lag_0_", th) is not None) if has_fresh else None
    s_bad = (_drift(rows, "dlogp_pos_stale_", th) is not None) if has_stale else None
    why = (
        f"fresh tokens {'drift' if f_bad else 'do not drift' if f_bad is False else 'absent'}, "
        f"stale tokens {'drift' if s_bad else 'do not drift' if s_bad is False else 'absent'}"
    )
    return _attributed(
        rows,
        "position_drift",
        f"mismatch grows with position: mean |Δlogp| ×{factor:.1f} from the early to the late deciles "
        f"(threshold ×{th['drift_factor']:g} and ≥ {th['drift_floor']:g} nats)",
        desc,
        f_bad,
        s_bad,
        why,
    )


def _ratio_tails(rows: Sequence[Mapping[str, Any]], th: Mapping[str, float]) -> Finding | None:
    above, below = _vals(rows, "ratio_frac_above_2"), _vals(rows, "ratio_frac_below_0_5")
    if not (above or below):
        return None
    tails = _mean(above or [0.0]) + _mean(below or [0.0])
    if tails <= th["tail_share"]:
        return None
    fresh = _tokens_weighted(rows, "ratio_tails_lag_0", "tokens_lag_0")
    stale = _tokens_weighted(rows, "ratio_tails_stale", "tokens_stale")
    f_bad = None if math.isnan(fresh) else fresh > th["tail_share"]
    s_over = None if math.isnan(stale) else stale > th["tail_share"]
    return _attributed(
        rows,
        "ratio_tails",
        f"heavy ratio tails: {tails:.2%} of tokens have ρ > 2 or ρ < 0.5 (threshold {th['tail_share']:.0%})",
        f"ρ > 2: {_mean(above or [0.0]):.2%}, ρ < 0.5: {_mean(below or [0.0]):.2%}",
        f_bad,
        _stale_carries(s_over, fresh, stale, th),
        f"tails among fresh tokens {_fmt_opt(fresh, '.2%')}, among stale tokens {_fmt_opt(stale, '.2%')}",
    )


def _tokens_weighted(rows: Sequence[Mapping[str, Any]], key: str, weight: str) -> float:
    """Σ w·x / Σ w over the rows that have both (the group's share over the window's tokens); NaN when none."""
    num = den = 0.0
    for r in rows:
        x, w = r.get(key), r.get(weight)
        if isinstance(x, int | float) and isinstance(w, int | float) and math.isfinite(x) and w > 0:
            num, den = num + w * float(x), den + float(w)
    return num / den if den > 0 else math.nan


def _prefix_decay(rows: Sequence[Mapping[str, Any]], th: Mapping[str, float]) -> Finding | None:
    m = _vals(rows, "m_mean")
    if not m or _mean(m) >= th["m_floor"]:
        return None
    fresh = _tokens_weighted(rows, "m_mean_lag_0", "tokens_lag_0")
    stale = _tokens_weighted(rows, "m_mean_stale", "tokens_stale")
    f_bad = None if math.isnan(fresh) else fresh < th["m_floor"]
    s_over = None if math.isnan(stale) else stale < th["m_floor"]
    return _attributed(
        rows,
        "prefix_decay",
        f"MinPRO's prefix factor m_t averages {_mean(m):.3f} (threshold {th['m_floor']}): later tokens of long "
        f"responses carry little weight",
        f"m_mean min {min(m):.3f}, mean {_mean(m):.3f}",
        f_bad,
        _stale_carries(s_over, 1 - fresh, 1 - stale, th),
        f"m_t of fresh tokens {_fmt_opt(fresh)}, of stale tokens {_fmt_opt(stale)}",
    )


def _engine_mismatch(rows: Sequence[Mapping[str, Any]], th: Mapping[str, float]) -> Finding | None:
    """Fresh (lag-0) tokens whose engine log-probs differ from the trainer's: a lower-precision engine, a sampling
    setting its log-probs do not reflect. An fp32 engine at the trainer's temperature sits near 1e-7 nats."""
    fresh = [
        float(r["dlogp_mean_lag_0"])
        for r in rows
        if isinstance(r.get("dlogp_mean_lag_0"), int | float)
        and math.isfinite(r["dlogp_mean_lag_0"])
        and isinstance(r.get("tokens_lag_0"), int | float)
        and r["tokens_lag_0"] > 0
    ]
    if not fresh or _median(fresh) < th["fresh_dlogp"]:
        return None
    kl = _vals([r for r in rows if isinstance(r.get("tokens_lag_0"), int | float) and r["tokens_lag_0"] > 0], "kl_k3")
    return Finding(
        "engine_mismatch",
        f"the engine and the trainer disagree on fresh (lag-0) tokens: median mean |Δlogp| {_median(fresh):.3g} nats "
        f"over {len(fresh)} step{'s' if len(fresh) > 1 else ''} (threshold {th['fresh_dlogp']:g}; an fp32 engine sits "
        "near 1e-7)",
        f"fresh tokens' mean |Δlogp| min {min(fresh):.3g}, max {max(fresh):.3g}"
        + (f"; k3 KL of those steps up to {max(kl):.2g}" if kl else ""),
        "",
        "engine",
    )


def _weights_not_synced(rows: Sequence[Mapping[str, Any]], th: Mapping[str, float]) -> Finding | None:
    """Fresh (lag-0) tokens' |Δlogp| rising step after step: the engine samples with weights the trainer left."""
    pts = [
        (i, r, float(r["dlogp_mean_lag_0"]))
        for i, r in enumerate(rows)
        if isinstance(r.get("dlogp_mean_lag_0"), int | float)
        and math.isfinite(r["dlogp_mean_lag_0"])
        and isinstance(r.get("tokens_lag_0"), int | float)
        and r["tokens_lag_0"] > 0
    ]
    if len(pts) < th["sync_min_steps"]:
        return None
    d = [v for _, _, v in pts]
    tau = _kendall_tau(d)
    third = max(1, len(d) // 3)
    first, last = _mean(d[:third]), _mean(d[-third:])
    if tau < th["sync_trend"] or last < th["sync_floor"] or last < th["sync_factor"] * first:
        return None
    a, b = pts[0], pts[-1]
    trail = " → ".join(f"{v:.3g}" for v in d[:: max(1, len(d) // 8)])
    return Finding(
        "weights_not_synced",
        f"weights not reaching the engine: the fresh (lag-0) tokens' mean |Δlogp| grows step by step, "
        f"{first:.3g} → {last:.3g} nats (first vs last third of steps {_step_of(a[1], a[0])}–{_step_of(b[1], b[0])}; "
        f"rule: Kendall's τ with the step ≥ {th['sync_trend']:g}, last third ≥ ×{th['sync_factor']:g} the first "
        f"and ≥ {th['sync_floor']:g} nats)",
        f"lag-0 |Δlogp| by step: {trail}; τ = {tau:.2f} over {len(d)} steps. A synced engine samples fresh tokens "
        "with the trainer's weights, so their mismatch stays flat",
        "",
        "sync",
    )


def signal_of(row: Mapping[str, Any]) -> tuple[float, float] | None:
    """(share of groups with all-zero advantages, mean reward) of one metrics row, or None when it has neither.

    The share: the monitor's ``zero_adv_frac``, else p3o's ``zero_adv_groups`` / ``num_groups``, else TRL's
    ``frac_reward_zero_std``. The reward: ``reward_mean`` (p3o), else ``reward`` (TRL); NaN when missing.
    """

    def num(key: str) -> float | None:
        v = row.get(key)
        return float(v) if isinstance(v, int | float) and math.isfinite(float(v)) else None

    share = num("zero_adv_frac")
    groups = num("num_groups")
    if share is None and groups and num("zero_adv_groups") is not None:
        share = num("zero_adv_groups") / groups  # type: ignore[operator]
    if share is None:
        share = num("frac_reward_zero_std")
    if share is None:
        return None
    reward = num("reward_mean")
    reward = num("reward") if reward is None else reward
    return share, math.nan if reward is None else reward


def _no_signal(rows: Sequence[Mapping[str, Any]], th: Mapping[str, float]) -> Finding | None:
    """The last ``signal_steps`` rows that say how many groups carry an advantage: at least ``signal_share`` of them
    carry none (every sample of the group got the same reward), so the policy gradient is (nearly) zero."""
    n = int(th["signal_steps"])
    pts = [(i, r, sig) for i, r in enumerate(rows) if (sig := signal_of(r)) is not None][-n:]
    if len(pts) < n:
        return None
    share = _mean([z for _, _, (z, _) in pts])
    if share < th["signal_share"]:
        return None
    rewards = [x for _, _, (_, x) in pts if not math.isnan(x)]
    reward = _mean(rewards)
    if rewards and reward <= th["signal_low"]:
        cause = "unsolved"
    elif rewards and reward >= th["signal_high"]:
        cause = "solved"
    else:
        cause = "tied"
    (i0, r0, _), (i1, r1, _) = pts[0], pts[-1]
    return Finding(
        "no_signal",
        f"no learning signal: {share:.0%} of groups have all-zero advantages over steps {_step_of(r0, i0)}–"
        f"{_step_of(r1, i1)} (threshold {th['signal_share']:.0%} over {n} steps)",
        "mean reward "
        + (f"{reward:.3f}" if rewards else "n/a")
        + "; zero-advantage share by step: "
        + " ".join(f"{z:.2f}" for _, _, (z, _) in pts),
        "",
        cause,
    )


def _kendall_tau(xs: Sequence[float]) -> float:
    """Kendall's τ_a of ``xs`` against its index: (concordant − discordant pairs) / all pairs, ∈ [−1, 1]."""
    n = len(xs)
    pairs = n * (n - 1) // 2
    if pairs == 0:
        return 0.0
    s = sum((xs[j] > xs[i]) - (xs[j] < xs[i]) for i in range(n) for j in range(i + 1, n))
    return s / pairs


def _any_positive(rows: Sequence[Mapping[str, Any]], th: Mapping[str, float]) -> list[Finding]:
    out = []
    for key, name, what in (
        ("nonfinite_frac", "nonfinite", "NaN/inf log-probs"),
        ("kl_clamped", "kl_clamped", "tokens with |log ρ| > 20"),
        ("ess_degenerate", "ess_degenerate", "degenerate ESS micro-batches"),
    ):
        v = _vals(rows, key)
        hits = sum(x > 0 for x in v)
        if hits:
            out.append(
                Finding(
                    name,
                    f"{what} on {hits} of {len(v)} steps (threshold: any)",
                    f"{key} max {max(v):.3g}",
                    "",
                    "engine",
                )
            )
    return out


#: The rules that judge a window as a whole (the doctor slides them over a long run).
WINDOW_RULES = ("low_ess", "engine_mismatch", "position_drift", "ratio_tails", "prefix_decay")
#: The window rules that judge how training moves the ratios: too early to judge before ``min_steps`` steps. (The
#: engine's mismatch with the trainer, ``engine_mismatch``, is a property of the engine: judged from step 1.)
PATIENT_RULES = ("low_ess", "position_drift", "ratio_tails", "prefix_decay")
#: The rules with a window of their own (``signal_steps``): judged after that many steps, however short the run.
SIGNAL_RULES = ("no_signal",)
#: The rules that fire on a single step or on the run's trend (the doctor applies them to the whole run).
RUN_RULES = ("ess_collapse", "weights_not_synced", "nonfinite", "kl_clamped", "ess_degenerate")


def find(
    rows: Sequence[Mapping[str, Any]],
    rules: Mapping[str, float] | None = None,
    *,
    source: str | None = None,
    only: Iterable[str] | None = None,
    unlagged: str = "undetermined",
    config: Mapping[str, Any] | None = None,
) -> list[Finding]:
    """The findings that fire on ``rows`` (a window of metric rows, oldest first; missing keys are skipped).

    Rules (thresholds from :data:`RULES`, overridable by ``rules``; ``only``: a subset of the names):

    * ``low_ess``: ``ess`` < 0.9 on more than half of the rows that have it.
    * ``ess_collapse``: any single row with ``ess`` < 0.2 or ``ratio_max`` > 1e3, named by its step.
    * ``position_drift``: per decile, the mean of ``dlogp_pos_<d>`` over the rows; over the deciles that at least
      half of the rows reached, the later half's mean ≥ 3 × the earlier half's and ≥ 0.03 nats.
    * ``ratio_tails``: mean of ``ratio_frac_above_2`` + ``ratio_frac_below_0_5`` > 0.01.
    * ``prefix_decay``: mean ``m_mean`` < 0.5.
    * ``engine_mismatch``: the median over the rows of the fresh tokens' ``dlogp_mean_lag_0`` ≥ 5e-4 nats.
    * ``weights_not_synced``: over ≥ 4 rows with fresh tokens, ``dlogp_mean_lag_0`` trends up with the step
      (Kendall's τ ≥ 0.5), and the last third's mean is ≥ 2 × the first third's and ≥ 0.02 nats.
    * ``nonfinite``: any ``nonfinite_frac`` > 0. ``kl_clamped``, ``ess_degenerate``: any > 0 (p3o's trainer).
    * ``no_signal``: over the last 3 rows that carry it (:func:`signal_of`), at least 90 % of the groups have all-zero
      advantages; its cause is ``unsolved`` (mean reward ≤ 0.1: the model never solves the task), ``solved`` (≥ 0.9)
      or ``tied`` (the samples of each group tie). Its own window: judged after 3 steps, however short the run.

    Attribution (``Finding.cause``): each rule is re-applied to the fresh tokens (lag 0: ``ess_lag_0``,
    ``ratio_tails_lag_0``, ``dlogp_pos_lag_0_<d>``, ``m_mean_lag_0``, ``ratio_max_lag_0``) and to the stale ones
    (lag ≥ 1: the ``_stale`` keys); the stale tokens carry it only when their excess over the ideal (1 − ESS, the
    tail share, 1 − m) is also ≥ 2 × the fresh tokens' (the engine's mismatch is in stale tokens too). Fresh tokens
    carry it -> ``engine``; stale ones only -> ``staleness``; both -> ``both``; no lags -> ``undetermined``.
    ``engine_mismatch`` and ``nonfinite`` / ``kl_clamped`` / ``ess_degenerate`` are ``engine``;
    ``weights_not_synced`` is ``sync``, and while it fires the findings the fresh tokens carry are ``sync`` too; in a
    run with ``rollout.inflight_updates`` (``config``) they are ``inflight``: a token sampled after a push in the
    middle of a turn attends to KV the older weights computed, so the fresh tokens' mismatch is the push's.
    Suggestions name the settings of ``source`` (``p3o``, ``trl``, ``verl``; None: generic). ``unlagged``: the cause
    when the rows carry no lags, for callers that know it (a fresh engine's unlagged rows: ``engine``).
    A staleness finding's message names its origin when the rows carry ``lag_in_batch_mean``
    (:func:`staleness_origin`: mini-batches, the policy lag or both) and p3o's suggestion narrows to it.
    ``config`` (the run's config.yaml as a mapping) fits every suggestion to the run (:func:`suggest`).
    """
    th = {**RULES, **(rules or {})}
    want = set(only) if only is not None else None
    out: list[Finding] = []
    checks: list[tuple[str, Any]] = [
        ("ess_collapse", _ess_collapse),
        ("weights_not_synced", _weights_not_synced),
        ("low_ess", _low_ess),
        ("engine_mismatch", _engine_mismatch),
        ("position_drift", _position_drift),
        ("ratio_tails", _ratio_tails),
        ("prefix_decay", _prefix_decay),
        ("no_signal", _no_signal),
    ]
    for name, rule in checks:
        if want is None or name in want:
            f = rule(rows, th)
            if f is not None:
                out.append(f)
    out += [f for f in _any_positive(rows, th) if want is None or f.name in want]
    if unlagged != "undetermined":
        out = [dataclasses.replace(f, cause=unlagged) if f.cause == "undetermined" else f for f in out]
    if any(f.cause == "sync" for f in out) or _weights_not_synced(rows, th) is not None:
        # the fresh tokens' mismatch is the stale engine's: name the sync, not the engine's precision
        out = [dataclasses.replace(f, cause="sync") if f.cause == "engine" else f for f in out]
    elif _get(config, "rollout.inflight_updates") is True:
        # a token sampled after a mid-turn push is tagged with the new version but attends to the older weights' KV
        # cache: its log-prob is of neither version alone, so lag-0 tokens differ from the trainer by construction
        out = [dataclasses.replace(f, cause="inflight") if f.cause == "engine" else f for f in out]
    origin = staleness_origin(rows)
    return [
        dataclasses.replace(
            f,
            message=f.message if f.name == "weights_not_synced" else f"{f.message}: {cause_text(f.cause, origin)}",
            suggestion=suggest(f.name, f.cause, source, origin, config),
        )
        for f in out
    ]


# ------------------------------------------------------------------------------------------------------ monitor
