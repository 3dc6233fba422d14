"""An off-policy monitor that any training loop can feed: how far the data is from the policy being trained.

    monitor = OffPolicyMonitor(max_len=64)                      # max_len: the response-length cap (position deciles)
    stats = monitor.update(logp, rollout_logp, mask, versions=versions, version=step, step=step)
    # {"ess": 0.97, "ess_lag_0": 0.99, ..., "lag_mean": 1.4, "dlogp_pos_0": 0.01, ..., "finding_low_ess": 0.0}
    for f in monitor.findings: print(f.message)

``logp`` is the trainer's log π_θ(y_t) of the sampled tokens, ``rollout_logp`` the log-prob the rollout engine
recorded when it sampled them, ``mask`` the valid tokens, all (N, T) with responses right-padded (column t is decode
position t). ``versions`` (N, T) are the policy versions that sampled each token and ``version`` the trainer's, so
lag = version − versions. With micro-batches call :meth:`OffPolicyMonitor.observe` for each, then ``update()``:
every statistic is computed from sums (and maxima) that add up exactly over micro-batches and, with ``group`` (a
torch.distributed process group), over ranks, so the numbers do not depend on how the step's tokens were split.

The statistics (lr_t = logp_t − rollout_logp_t, ρ_t = e^{lr_t}, over valid tokens with finite log-probs):

* ``ess`` = (Σρ)² / (|B|·Σρ²) (Kong's ESS, ∈ [1/|B|, 1]), and ``ess_lag_<b>`` per lag bucket b ∈ LAG_BUCKETS;
* ``lag_min`` / ``lag_mean`` / ``lag_max`` and ``lag_hist_<k>`` (the lag histogram, as p3o's trainer logs it: share
  of tokens k versions old, k = 0 … lag_max; lags ≥ LAG_HIST_BINS − 1 share the last bin);
  these and ``ess_lag_<b>`` only when the step's batches came with ``versions``;
* ``dlogp_mean``, ``dlogp_max`` (|lr|) and ``dlogp_pos_<d>``: mean |lr| in decile d = ⌊10·t / max_len⌋ of the
  decode position t;
* ``ratio_min``, ``ratio_max``, ``ratio_frac_above_2``, ``ratio_frac_below_0_5`` (the tails);
* ``kl_k1`` = mean(−lr), ``kl_k2`` = mean(lr²/2), ``kl_k3`` = mean(ρ − 1 − lr): Schulman's estimators of
  KL(π_rollout ‖ π_θ) on the rollout's samples (the objectives' ``approx_kl`` is another one, e^{−lr} + lr − 1);
* ``m_mean``, ``m_frac_above_0_5``, ``m_frac_below_0_1``: MinPRO's prefix factor m_t = min_{j<t} ρ_j (1 at t = 0);
* ``nonfinite_frac``: share of valid tokens whose log-probs were NaN or ±inf (left out of everything else);
* ``tokens``: valid tokens counted; ``finding_<name>``: 1.0 while that finding fires (rules: :func:`find`).

Empty sets give NaN (an ESS of an empty lag bucket, a decile no response reached). The findings follow the rules in
:func:`find` over the last ``window`` steps; docs/metrics.md lists them with their thresholds.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from p3o.objectives import ess_from_parts, ess_parts, prefix_log_stat

__all__ = [
    "LAG_BUCKETS",
    "LAG_HIST_BINS",
    "N_POSITION_BUCKETS",
    "RULES",
    "Finding",
    "OffPolicyMonitor",
    "find",
    "lag_bucket_names",
    "prefixed",
    "strip_prefixes",
]

_log = logging.getLogger(__name__)

#: Lag buckets (inclusive lower, inclusive upper; None = no upper bound) and their key suffixes.
LAG_BUCKETS: tuple[tuple[int, int | None], ...] = ((0, 0), (1, 1), (2, 3), (4, 7), (8, None))
N_POSITION_BUCKETS = 10
LAG_HIST_BINS = 32


def lag_bucket_names() -> list[str]:
    """Key suffixes of :data:`LAG_BUCKETS`: ``0``, ``1``, ``2_3``, ``4_7``, ``8_plus``."""
    return [f"{lo}" if hi == lo else (f"{lo}_plus" if hi is None else f"{lo}_{hi}") for lo, hi in LAG_BUCKETS]


# ----------------------------------------------------------------------------------------------------- findings


@dataclass(frozen=True)
class Finding:
    """One named finding: what fired, the rule and threshold it used, the numbers, and what to do.

    Attributes:
        name: the rule's name (``low_ess``, ``position_drift``, ...; docs/metrics.md).
        message: one plain-language line, the threshold included.
        evidence: the numbers behind it.
        suggestion: what to change.
        cause: for ``low_ess``: ``staleness`` or ``mismatch``; for ``position_drift``: ``staleness`` or the rule's
            name; else the rule's name.
    """

    name: str
    message: str
    evidence: str
    suggestion: str
    cause: str = ""


#: Thresholds of the rules in :func:`find` (docs/metrics.md "Off-policy findings").
RULES: dict[str, float] = {
    "ess_threshold": 0.9,  # low_ess: ESS below this ...
    "ess_share": 0.5,  # ... on more than this share of the window's steps
    "drift_factor": 3.0,  # position_drift: last decile's |Δlogp| ≥ this × the first decile's ...
    "drift_floor": 0.03,  # ... and ≥ this (nats): fp32 noise and the small drift of a lag-2 batch stay silent
    "drift_support": 0.5,  # ... over the deciles that at least this share of the window's steps reached
    "tail_share": 0.01,  # ratio_tails: share of tokens with ρ > 2 or ρ < 0.5 above this (window mean)
    "m_floor": 0.5,  # prefix_decay: window mean of MinPRO's m_t below this
    "stale_lag": 0.5,  # low_ess cause: staleness when the window's mean lag exceeds this and fresh tokens are fine
}

_SUGGEST = {
    "staleness": (
        "lower loop.max_lag (or the reuse / epochs count); train with a soft objective (P3O, MinPRO, CISPO, M2PO), "
        "not a hard clip (docs/metrics.md, 'Which objective when')"
    ),
    "mismatch": (
        "record rollout log-probs in fp32 (rollout.precision fp32, vLLM dtype float32), use processed log-probs "
        "with top-p/top-k, match the trainer's temperature; with a mismatched engine use P3O or a wide clip"
    ),
    "position_drift": (
        "suspect the KV cache or attention precision (an FP8 KV cache: kv_cache_dtype auto); shorter responses; "
        "P3O's ESS cap bounds the late tokens' weights"
    ),
    "ratio_tails": "check the sampling settings (top-p/top-k need processed log-probs) and the engine's precision",
    "prefix_decay": (
        "MinPRO-style prefix weights would silence the later tokens of long responses: reduce the staleness or "
        "engine mismatch behind it (the other findings name it)"
    ),
    "nonfinite": "NaN/inf log-probs: check the engine's dtype and the tokenizer (ids out of the vocabulary)",
    "kl_clamped": "ratios beyond e^20: a tokenizer, temperature or precision mismatch between engine and trainer",
    "ess_degenerate": "empty or non-finite ESS sums: NaN/inf log-probs somewhere",
}


def _vals(rows: Sequence[Mapping[str, Any]], key: str) -> list[float]:
    out = []
    for r in rows:
        v = r.get(key)
        if isinstance(v, int | float) and math.isfinite(float(v)):
            out.append(float(v))
    return out


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def find(rows: Sequence[Mapping[str, Any]], rules: Mapping[str, float] | None = None) -> list[Finding]:
    """The findings that fire on ``rows`` (a window of metric rows, oldest first; missing keys are skipped).

    Rules (thresholds from :data:`RULES`, overridable by ``rules``):

    * ``low_ess``: ``ess`` < 0.9 on more than half of the rows that have it. Cause ``mismatch`` when the fresh
      tokens' ESS (``ess_lag_0``, median) is also < 0.9 or the mean ``lag_mean`` is ≤ 0.5, else ``staleness``.
    * ``position_drift``: per decile, the mean of ``dlogp_pos_<d>`` over the rows; over the deciles that at least
      half of the rows reached, the later half's mean ≥ 3 × the earlier half's and ≥ 0.03 nats. Cause
      ``staleness`` when the mean ``lag_mean`` exceeds 0.5, else the engine (KV cache / attention precision).
    * ``ratio_tails``: mean of ``ratio_frac_above_2`` + ``ratio_frac_below_0_5`` > 0.01.
    * ``prefix_decay``: mean ``m_mean`` < 0.5.
    * ``nonfinite``: any ``nonfinite_frac`` > 0. ``kl_clamped``, ``ess_degenerate``: any > 0 (p3o's trainer).
    """
    th = {**RULES, **(rules or {})}
    out: list[Finding] = []
    ess = _vals(rows, "ess")
    if ess:
        low = sum(e < th["ess_threshold"] for e in ess)
        if low > th["ess_share"] * len(ess):
            fresh = sorted(_vals(rows, "ess_lag_0"))
            fresh_med = fresh[len(fresh) // 2] if fresh else math.nan
            lag = _mean(_vals(rows, "lag_mean"))
            fresh_ok = math.isnan(fresh_med) or fresh_med >= th["ess_threshold"]
            stale = not math.isnan(lag) and lag > th["stale_lag"] and fresh_ok
            cause = "staleness" if stale else "mismatch"
            why = (
                f"mean lag {lag:.2f} versions while fresh tokens' ESS is {fresh_med:.3f}"
                if stale
                else (
                    f"fresh tokens' ESS {fresh_med:.3f}"
                    if not math.isnan(fresh_med)
                    else f"mean lag {lag:.2f}"
                    if not math.isnan(lag)
                    else "no lag recorded"
                )
            )
            out.append(
                Finding(
                    "low_ess",
                    f"ESS below {th['ess_threshold']} on {low} of the last {len(ess)} steps (threshold: more than "
                    f"{th['ess_share']:.0%}): likely {cause} ({why})",
                    f"ess min {min(ess):.3f}, mean {_mean(ess):.3f}",
                    _SUGGEST[cause],
                    cause,
                )
            )
    # deciles that most of the window's steps reached (a decile only a few long responses reach is too noisy)
    per_decile = [_vals(rows, f"dlogp_pos_{d}") for d in range(N_POSITION_BUCKETS)]
    have = [(d, _mean(v)) for d, v in enumerate(per_decile) if v and len(v) >= th["drift_support"] * len(rows)]
    if len(have) >= 2:
        # the later half of those deciles against the earlier half
        half = len(have) // 2
        d0, d1 = have[0][0], have[-1][0]
        first = _mean([v for _, v in have[:half]])
        last = _mean([v for _, v in have[len(have) - half :]])
        if last >= th["drift_factor"] * first and last >= th["drift_floor"]:
            factor = last / first if first > 0 else math.inf
            # stale tokens drift along the response too (a policy update moves late tokens more): name that cause
            lag = _mean(_vals(rows, "lag_mean"))
            stale = not math.isnan(lag) and lag > th["stale_lag"]
            cause = f"; the tokens are {lag:.1f} versions old on average, so staleness may cause it" if stale else ""
            out.append(
                Finding(
                    "position_drift",
                    f"mismatch grows with position: mean |Δlogp| ×{factor:.1f} from the early to the late deciles "
                    f"({d0}–{have[half - 1][0]} vs {have[len(have) - half][0]}–{d1}) "
                    f"(threshold ×{th['drift_factor']:g} and ≥ {th['drift_floor']:g} nats){cause}",
                    "|Δlogp| by decile: " + " ".join(f"{v:.3g}" for _, v in have),
                    _SUGGEST["staleness"] if stale else _SUGGEST["position_drift"],
                    "staleness" if stale else "position_drift",
                )
            )
    above, below = _vals(rows, "ratio_frac_above_2"), _vals(rows, "ratio_frac_below_0_5")
    if above or below:
        tails = _mean(above or [0.0]) + _mean(below or [0.0])
        if tails > th["tail_share"]:
            out.append(
                Finding(
                    "ratio_tails",
                    f"heavy ratio tails: {tails:.2%} of tokens have ρ > 2 or ρ < 0.5 (threshold "
                    f"{th['tail_share']:.0%})",
                    f"ρ > 2: {_mean(above or [0.0]):.2%}, ρ < 0.5: {_mean(below or [0.0]):.2%}",
                    _SUGGEST["ratio_tails"],
                    "ratio_tails",
                )
            )
    m = _vals(rows, "m_mean")
    if m and _mean(m) < th["m_floor"]:
        out.append(
            Finding(
                "prefix_decay",
                f"MinPRO's prefix factor m_t averages {_mean(m):.3f} (threshold {th['m_floor']}): later tokens of "
                "long responses carry little weight",
                f"m_mean min {min(m):.3f}, mean {_mean(m):.3f}",
                _SUGGEST["prefix_decay"],
                "prefix_decay",
            )
        )
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
                    _SUGGEST[name],
                    name,
                )
            )
    return out


# ------------------------------------------------------------------------------------------------------ monitor


class OffPolicyMonitor:
    """Per-step off-policy statistics from (logp, rollout_logp, mask[, versions]) and findings over a window.

    Args:
        max_len: the response-length cap, for the position deciles (position t falls in ⌊10·t / max_len⌋, the last
            decile also takes t ≥ max_len). None: the width T of the first batch seen (pass it explicitly when
            micro-batches are padded to different widths, or the deciles depend on the split).
        window: steps the findings look back over (default 20).
        group: torch.distributed process group to reduce over (None: the default group when initialised; pass
            ``False`` for this process only).
        rules: threshold overrides for :func:`find`.
        warn: log a warning when a finding starts firing.
    """

    FINDINGS = ("low_ess", "position_drift", "ratio_tails", "prefix_decay", "nonfinite")

    def __init__(
        self,
        max_len: int | None = None,
        *,
        window: int = 20,
        group: Any = None,
        rules: Mapping[str, float] | None = None,
        warn: bool = True,
    ) -> None:
        self.max_len = max_len
        self.window: deque[dict[str, float]] = deque(maxlen=window)
        self.group = group
        self.rules = dict(rules or {})
        self.warn = warn
        self.findings: list[Finding] = []
        self._firing: set[str] = set()
        self._reset()

    # --------------------------------------------------------------------------------------- accumulation
    def _reset(self) -> None:
        nb = len(LAG_BUCKETS)
        self._parts: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in range(nb + 1)]
        # sums: tokens, |lr|, ρ>2, ρ<0.5, k1, k2, k3, m, m>0.5, m<0.1, lag, nonfinite, valid(all), lag-bucket
        # counts (nb), position counts (10), position |lr| sums (10), exact-lag counts (LAG_HIST_BINS)
        self._sums: torch.Tensor | None = None  # float64 on the first micro-batch's device (collectives run there)
        # maxima: |lr|, ρ, −ρ (min), lag, −lag (min)
        self._max: torch.Tensor | None = None
        self._seen = False
        self._has_versions = False

    def state(self) -> dict[str, Any]:
        """The window of closed steps and the firing findings (what a checkpoint keeps, so that a resumed run's
        window-based statistics equal an uninterrupted run's)."""
        return {"window": [dict(r) for r in self.window], "firing": sorted(self._firing)}

    def load_state(self, state: Mapping[str, Any] | None) -> None:
        """Restore `state()` (None: keep the empty window)."""
        if not state:
            return
        self.window.clear()
        self.window.extend(dict(r) for r in state.get("window", []))
        self.findings = find(list(self.window), self.rules) if self.window else []
        self._firing = set(state.get("firing", []))

    def observe(
        self,
        logp: torch.Tensor,
        rollout_logp: torch.Tensor,
        mask: torch.Tensor,
        versions: torch.Tensor | None = None,
        version: int | None = None,
    ) -> None:
        """Add one micro-batch, all (N, T): no communication; ``update()`` reduces and reports the step."""
        assert logp.shape == rollout_logp.shape == mask.shape, (logp.shape, rollout_logp.shape, mask.shape)
        with torch.no_grad():
            dev = logp.device if self._sums is None else self._sums.device
            logp, rollout_logp = logp.detach().to(dev, torch.float64), rollout_logp.detach().to(dev, torch.float64)
            mask = mask.detach().to(dev, torch.bool)
            finite = torch.isfinite(logp) & torch.isfinite(rollout_logp)
            valid = mask & finite
            lr = torch.where(valid, logp - rollout_logp, torch.zeros((), dtype=torch.float64))
            n, t = lr.shape
            if self.max_len is None:
                self.max_len = max(int(t), 1)
            rho = torch.exp(lr)
            vf = valid.double()
            m = torch.exp(prefix_log_stat(lr.float(), valid, "min")).double()
            if versions is not None:
                if version is None:
                    raise ValueError("OffPolicyMonitor: versions given without the trainer's version (version=)")
                lag = (int(version) - versions.detach().to(dev, torch.int64)).clamp(min=0)
                self._has_versions = True
            else:
                lag = torch.zeros((n, t), dtype=torch.int64, device=dev)
            bucket_masks = [valid & (lag >= lo) & (lag <= (lag.max() if hi is None else hi)) for lo, hi in LAG_BUCKETS]
            pos = torch.arange(t, device=dev).expand(n, t)
            dec = (pos * N_POSITION_BUCKETS // self.max_len).clamp(max=N_POSITION_BUCKETS - 1)
            absd = lr.abs()
            lagd = lag.double()
            sums = [
                vf.sum(),
                (absd * vf).sum(),
                ((rho > 2.0) & valid).double().sum(),
                ((rho < 0.5) & valid).double().sum(),
                (-lr * vf).sum(),
                (0.5 * lr * lr * vf).sum(),
                ((rho - 1.0 - lr) * vf).sum(),
                (m * vf).sum(),
                ((m > 0.5) & valid).double().sum(),
                ((m < 0.1) & valid).double().sum(),
                (lagd * vf).sum(),
                (mask & ~finite).double().sum(),
            ]
            sums += [b.double().sum() for b in bucket_masks]
            onehot = torch.nn.functional.one_hot(dec, N_POSITION_BUCKETS).double() * vf[..., None]  # (N, T, 10)
            sums += list(onehot.sum((0, 1)).unbind())
            sums += list((onehot * absd[..., None]).sum((0, 1)).unbind())
            hist = torch.nn.functional.one_hot(lag.clamp(0, LAG_HIST_BINS - 1), LAG_HIST_BINS).double()
            sums += list((hist * vf[..., None]).sum((0, 1)).unbind())
            zero = torch.zeros(len(sums), dtype=torch.float64, device=dev)
            self._sums = (zero if self._sums is None else self._sums) + torch.stack(sums)
            if self._max is None:
                self._max = torch.full((5,), -math.inf, dtype=torch.float64, device=dev)
            if valid.any():
                mx = torch.stack(
                    [
                        absd[valid].max(),
                        rho[valid].max(),
                        -rho[valid].min(),
                        lagd[valid].max(),
                        -lagd[valid].min(),
                    ]
                )
                self._max = torch.maximum(self._max, mx)
            lr32 = lr.float()
            self._parts[0].append(ess_parts(lr32, valid))
            for k, b in enumerate(bucket_masks):
                self._parts[k + 1].append(ess_parts(lr32, b))
            self._seen = True

    def _group(self) -> Any:
        if self.group is False:
            return None
        if self.group is not None:
            return self.group
        return dist.group.WORLD if dist.is_available() and dist.is_initialized() else None

    def update(
        self,
        logp: torch.Tensor | None = None,
        rollout_logp: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        versions: torch.Tensor | None = None,
        step: int | None = None,
        *,
        version: int | None = None,
    ) -> dict[str, float]:
        """Observe (logp, rollout_logp, mask) if given, then close the step: reduce over micro-batches and ranks,
        append the row to the window, re-evaluate the findings and return the flat dict of statistics.

        ``versions`` and ``version`` (the trainer's policy version; default ``step``) give the lags.
        """
        if logp is not None:
            assert rollout_logp is not None and mask is not None, "update(logp, rollout_logp, mask)"
            self.observe(logp, rollout_logp, mask, versions, version if version is not None else step)
        if not self._seen or self._sums is None or self._max is None:
            raise ValueError("OffPolicyMonitor.update: no tokens observed this step (pass logp, rollout_logp, mask)")
        group = self._group()
        sums, mx = self._sums.clone(), self._max.clone()
        if group is not None:
            dist.all_reduce(sums, group=group)
            dist.all_reduce(mx, op=dist.ReduceOp.MAX, group=group)
        ess = [float(ess_from_parts(parts, group)) for parts in self._parts]
        row = self._row(sums.cpu(), mx.cpu(), ess)
        if not self._has_versions:  # no versions this step: no lag statistics (not a lag of 0)
            row = {k: v for k, v in row.items() if not k.startswith(("lag_", "ess_lag_"))}
        if step is not None:
            row["step"] = float(step)
        self._reset()
        self.window.append(row)
        self.findings = find(list(self.window), self.rules)
        fired = {f.name for f in self.findings}
        for f in self.findings:
            if self.warn and f.name not in self._firing:
                _log.warning("p3o off-policy monitor: %s. Suggestion: %s", f.message, f.suggestion)
        self._firing = fired
        for name in self.FINDINGS:
            row[f"finding_{name}"] = 1.0 if name in fired else 0.0
        return row

    @staticmethod
    def _row(sums: torch.Tensor, mx: torch.Tensor, ess: list[float]) -> dict[str, float]:
        nb = len(LAG_BUCKETS)
        s = sums.tolist()
        n = s[0]
        nan = math.nan

        def per(x: float, d: float = n) -> float:
            return x / d if d > 0 else nan

        row = {
            "tokens": n,
            "ess": ess[0] if n > 0 else nan,
            "dlogp_mean": per(s[1]),
            "dlogp_max": mx[0].item() if n > 0 else nan,
            "ratio_min": -mx[2].item() if n > 0 else nan,
            "ratio_max": mx[1].item() if n > 0 else nan,
            "ratio_frac_above_2": per(s[2]),
            "ratio_frac_below_0_5": per(s[3]),
            "kl_k1": per(s[4]),
            "kl_k2": per(s[5]),
            "kl_k3": per(s[6]),
            "m_mean": per(s[7]),
            "m_frac_above_0_5": per(s[8]),
            "m_frac_below_0_1": per(s[9]),
            "lag_min": -mx[4].item() if n > 0 else nan,
            "lag_mean": per(s[10]),
            "lag_max": mx[3].item() if n > 0 else nan,
            "nonfinite_frac": per(s[11], n + s[11]),
        }
        counts = s[12 : 12 + nb]
        for name, c, e in zip(lag_bucket_names(), counts, ess[1:]):
            row[f"ess_lag_{name}"] = e if c > 0 else nan
        pos = 12 + nb
        pc = s[pos : pos + N_POSITION_BUCKETS]
        ps = s[pos + N_POSITION_BUCKETS : pos + 2 * N_POSITION_BUCKETS]
        for d in range(N_POSITION_BUCKETS):
            row[f"dlogp_pos_{d}"] = per(ps[d], pc[d])
        hist = s[pos + 2 * N_POSITION_BUCKETS :]
        if n > 0:
            for k in range(min(int(mx[3].item()), LAG_HIST_BINS - 1) + 1):
                row[f"lag_hist_{k}"] = per(hist[k])
        return row


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
