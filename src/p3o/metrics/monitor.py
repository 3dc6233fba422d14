"""An off-policy monitor that any training loop can feed: how far the data is from the policy being trained.

    monitor = OffPolicyMonitor(max_len=64)                      # max_len: the response-length cap (position deciles)
    stats = monitor.update(logp, rollout_logp, mask, versions=versions, version=step, step=step)
    # {"ess": 0.97, "ess_lag_0": 0.99, ..., "lag_mean": 1.4, "dlogp_pos_0": 0.01, ..., "finding_low_ess": 0.0,
    #  "cause_low_ess": 0.0, ...}
    for f in monitor.findings: print(f.message)

``logp`` is the trainer's log π_θ(y_t) of the sampled tokens, ``rollout_logp`` the log-prob the rollout engine
recorded when it sampled them, ``mask`` the valid tokens, all (N, T) with responses right-padded (column t is decode
position t). ``versions`` (N, T) are the policy versions that sampled each token and ``version`` the trainer's. The
lag of a token is the number of optimizer updates between its sampling and the trainer's log-prob of it:

    lag = (version − versions) · updates_per_version + updates

``updates_per_version`` (U, default 1): optimizer updates per policy version (p3o: num_mini_batches × epochs);
``updates`` (an int, or a tensor broadcast to (N, T), e.g. (N, 1) per row; default 0): the updates already taken
on the token's own batch when it is scored (p3o: k for mini-batch k). So a sync run with 4 mini-batches has lags
0, 1, 2, 3 — its later mini-batches are stale, not an engine mismatch — and a trainer whose versions count
optimizer steps (TRL's ``global_step``) passes neither. With micro-batches call :meth:`OffPolicyMonitor.observe`
for each, then ``update()``:
every statistic is computed from sums (and maxima) that add up exactly over micro-batches and, with ``group`` (a
torch.distributed process group), over ranks, so the numbers do not depend on how the step's tokens were split.

The statistics (lr_t = logp_t − rollout_logp_t, ρ_t = e^{lr_t}, over valid tokens with finite log-probs):

* ``ess`` = (Σρ)² / (|B|·Σρ²) (Kong's ESS, ∈ [1/|B|, 1]), and ``ess_lag_<b>`` per lag bucket b ∈ LAG_BUCKETS;
* ``lag_min`` / ``lag_mean`` / ``lag_max`` and ``lag_hist_<k>`` (the lag histogram: share of tokens k optimizer
  updates old, k = 0 … lag_max; lags ≥ LAG_HIST_BINS − 1 share the last bin), and ``lag_in_batch_mean``: the mean
  of the ``updates`` part alone (updates on the token's own batch: mini-batches), so ``lag_mean`` −
  ``lag_in_batch_mean`` is the policy lag's share; these and ``ess_lag_<b>`` only when the step's batches came with
  ``versions``;
* ``dlogp_mean``, ``dlogp_max`` (|lr|) and ``dlogp_pos_<d>``: mean |lr| in decile d = ⌊10·t / max_len⌋ of the
  decode position t;
* ``ratio_min``, ``ratio_max``, ``ratio_frac_above_2``, ``ratio_frac_below_0_5`` (the tails);
* ``kl_k1`` = mean(−lr), ``kl_k2`` = mean(lr²/2), ``kl_k3`` = mean(ρ − 1 − lr): Schulman's estimators of
  KL(π_rollout ‖ π_θ) on the rollout's samples (the objectives' ``approx_kl`` is another one, e^{−lr} + lr − 1);
* ``m_mean``, ``m_frac_above_0_5``, ``m_frac_below_0_1``: MinPRO's prefix factor m_t = min_{j<t} ρ_j (1 at t = 0);
* ``nonfinite_frac``: share of valid tokens whose log-probs were NaN or ±inf (left out of everything else);
* the fresh (lag 0, suffix ``_lag_0``) and stale (lag ≥ 1, ``_stale``) tokens apart, with versions only
  (:func:`split_keys`): ``tokens_*``, ``ess_stale``, ``dlogp_mean_*``, ``ratio_tails_*`` (share with ρ > 2 or
  ρ < 0.5), ``ratio_max_*``, ``m_mean_*`` and ``dlogp_pos_<group>_<d>``: what attributes a finding to staleness
  or to the engine;
* ``zero_adv_frac``: the share of the step's groups whose advantages are all zero, when the caller passes the
  step's ``signal`` (``zero_adv_groups``, ``num_groups``, ``reward_mean``): the no-signal finding's input;
* ``tokens``: valid tokens counted; ``finding_<name>``: 1.0 while that finding fires (rules: :func:`find`);
  ``cause_<name>``: its cause while it fires (:data:`CAUSES`: 1 staleness, 2 engine, 3 both, 4 weights not reaching
  the engine, 5 undetermined, 9 in-flight updates), else 0.

Empty sets give NaN (an ESS of an empty lag bucket, a decile no response reached). The findings follow the rules in
:func:`find` over the last ``window`` steps; docs/metrics.md lists them with their thresholds and the attribution.
A rule that judges how training moves the ratios over a window (:data:`PATIENT_RULES`: low ESS, ratio tails,
position drift, prefix decay) waits for ``RULES["min_steps"]`` (10) steps, or the whole window when it is shorter:
before, it is too early to judge; ``engine_mismatch`` judges the engine from step 1. The single-step rules fire at
once, and ``no_signal`` has its own window (``signal_steps``, 3).
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist

from p3o.metrics.advice import SOURCES, suggest
from p3o.metrics.rules import (  # the rules and constants, re-exported: p3o.metrics.monitor is their public home
    CAUSE_TEXT,
    CAUSES,
    LAG_BUCKETS,
    LAG_HIST_BINS,
    N_POSITION_BUCKETS,
    ORIGINS,
    PATIENT_RULES,
    RULES,
    RUN_RULES,
    SIGNAL_RULES,
    WINDOW_RULES,
    Finding,
    cause_text,
    find,
    lag_bucket_names,
    prefixed,
    split_keys,
    staleness_origin,
    strip_prefixes,
)
from p3o.objectives import ess_from_parts, ess_parts, prefix_log_stat

__all__ = [
    "CAUSES",
    "CAUSE_TEXT",
    "LAG_BUCKETS",
    "LAG_HIST_BINS",
    "N_POSITION_BUCKETS",
    "ORIGINS",
    "PATIENT_RULES",
    "RULES",
    "RUN_RULES",
    "SIGNAL_RULES",
    "SOURCES",
    "WINDOW_RULES",
    "Finding",
    "OffPolicyMonitor",
    "cause_text",
    "find",
    "lag_bucket_names",
    "prefixed",
    "split_keys",
    "staleness_origin",
    "strip_prefixes",
    "suggest",
]

_log = logging.getLogger(__name__)


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
        source: the trainer feeding it (``p3o``, ``trl``, ``verl``; None: generic), whose settings the findings'
            suggestions name.
        config: the run's config as a nested mapping (p3o: config.yaml's), so the findings' causes and advice fit
            the run (`find`: a run with ``rollout.inflight_updates`` has its fresh mismatch named as in-flight).

    Each closed step's row carries ``finding_<name>`` (1.0 while it fires) and ``cause_<name>`` (its cause as a
    number, :data:`CAUSES`: 1 staleness, 2 engine, 3 both, 4 weights not reaching the engine, 5 undetermined, 9
    in-flight updates; 0 while it does not fire) for every name of :attr:`FINDINGS`.
    """

    FINDINGS = (
        "low_ess",
        "engine_mismatch",
        "ess_collapse",
        "weights_not_synced",
        "position_drift",
        "ratio_tails",
        "prefix_decay",
        "nonfinite",
        "no_signal",
    )

    def __init__(
        self,
        max_len: int | None = None,
        *,
        window: int = 20,
        group: Any = None,
        rules: Mapping[str, float] | None = None,
        warn: bool = True,
        source: str | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        if source is not None and source not in SOURCES:
            raise ValueError(f"OffPolicyMonitor: source must be one of {', '.join(SOURCES)} or None, got {source!r}")
        self.source = source
        self.config = config  # the run's config as a mapping: findings attributed and advised as for this run (`find`)
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
        # ESS parts: all tokens, each lag bucket, the stale tokens (lag ≥ 1)
        self._parts: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in range(nb + 2)]
        # sums: tokens, |lr|, ρ>2, ρ<0.5, k1, k2, k3, m, m>0.5, m<0.1, lag, nonfinite, valid(all), lag-bucket
        # counts (nb), position counts (10), position |lr| sums (10), exact-lag counts (LAG_HIST_BINS), the fresh and
        # stale groups' (tokens, |lr|, tails, m, position counts, position |lr|), the lag's in-batch part
        self._sums: torch.Tensor | None = None  # float64 on the first micro-batch's device (collectives run there)
        # maxima: |lr|, ρ, −ρ (min), lag, −lag (min), ρ of fresh (lag 0) tokens, ρ of stale (lag ≥ 1) tokens
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
        self.findings = self._find() if self.window else []
        self._firing = set(state.get("firing", []))

    def observe(
        self,
        logp: torch.Tensor,
        rollout_logp: torch.Tensor,
        mask: torch.Tensor,
        versions: torch.Tensor | None = None,
        version: int | None = None,
        *,
        updates: int | torch.Tensor = 0,
        updates_per_version: int = 1,
    ) -> None:
        """Add one micro-batch, all (N, T): no communication; ``update()`` reduces and reports the step.

        With ``versions``, a token's lag is (version − versions) · ``updates_per_version`` + ``updates`` optimizer
        updates (``updates``: an int or a tensor broadcast to (N, T), e.g. (N, 1): the updates already taken on the
        token's own batch, p3o's mini-batch index)."""
        assert logp.shape == rollout_logp.shape == mask.shape, (logp.shape, rollout_logp.shape, mask.shape)
        if int(updates_per_version) < 1:
            raise ValueError(f"OffPolicyMonitor: updates_per_version must be >= 1, got {updates_per_version}")
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
            lag, in_batch = _token_lag((n, t), dev, versions, version, updates, int(updates_per_version))
            self._has_versions = self._has_versions or versions is not None
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
            # the fresh (lag 0) and stale (lag ≥ 1) split: tokens, |lr|, tails, m, and |lr| by position decile
            tails = (rho > 2.0) | (rho < 0.5)
            for part in (valid & (lag == 0), valid & (lag > 0)):
                pf = part.double()
                sums += [pf.sum(), (absd * pf).sum(), (tails & part).double().sum(), (m * pf).sum()]
                oh = onehot * pf[..., None]  # onehot already carries valid
                sums += list(oh.sum((0, 1)).unbind()) + list((oh * absd[..., None]).sum((0, 1)).unbind())
            sums.append((in_batch.double() * vf).sum())  # the lag's in-batch part (mini-batches): the last sum
            zero = torch.zeros(len(sums), dtype=torch.float64, device=dev)
            self._sums = (zero if self._sums is None else self._sums) + torch.stack(sums)
            self._update_max(valid, lag, rho, absd, lagd)
            lr32 = lr.float()
            self._parts[0].append(ess_parts(lr32, valid))
            for k, b in enumerate(bucket_masks):
                self._parts[k + 1].append(ess_parts(lr32, b))
            self._parts[-1].append(ess_parts(lr32, valid & (lag > 0)))
            self._seen = True

    def _update_max(
        self, valid: torch.Tensor, lag: torch.Tensor, rho: torch.Tensor, absd: torch.Tensor, lagd: torch.Tensor
    ) -> None:
        """Fold one micro-batch into the running maxima: max |lr|, max ρ, −min ρ, max lag, −min lag (valid tokens),
        then max ρ of the fresh and of the stale tokens (all (N, T); minima kept negated so one max reduces all)."""
        dev = rho.device
        if self._max is None:
            self._max = torch.full((7,), -math.inf, dtype=torch.float64, device=dev)
        neg = torch.full((), -math.inf, dtype=torch.float64, device=dev)
        if lag.numel():
            self._max[5] = torch.maximum(self._max[5], torch.where(valid & (lag == 0), rho, neg).max())
            self._max[6] = torch.maximum(self._max[6], torch.where(valid & (lag > 0), rho, neg).max())
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
            self._max[:5] = torch.maximum(self._max[:5], mx)

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
        updates: int | torch.Tensor = 0,
        updates_per_version: int = 1,
        signal: Mapping[str, float] | None = None,
    ) -> dict[str, float]:
        """Observe (logp, rollout_logp, mask) if given, then close the step: reduce over micro-batches and ranks,
        append the row to the window, re-evaluate the findings and return the flat dict of statistics.

        ``versions`` and ``version`` (the trainer's policy version; default ``step``), ``updates`` and
        ``updates_per_version`` give the lags (:meth:`observe`). ``signal``: the step's ``zero_adv_groups``,
        ``num_groups`` and ``reward_mean`` over all ranks (the caller's reduction), for the no-signal finding.
        """
        if logp is not None:
            assert rollout_logp is not None and mask is not None, "update(logp, rollout_logp, mask)"
            v = version if version is not None else step
            self.observe(
                logp, rollout_logp, mask, versions, v, updates=updates, updates_per_version=updates_per_version
            )
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
            split = set(split_keys())
            row = {k: v for k, v in row.items() if not k.startswith(("lag_", "ess_lag_")) and k not in split}
        if step is not None:
            row["step"] = float(step)
        judged = dict(row)
        if signal and signal.get("num_groups"):
            row["zero_adv_frac"] = float(signal.get("zero_adv_groups", 0.0)) / float(signal["num_groups"])
            judged.update(zero_adv_frac=row["zero_adv_frac"], reward_mean=float(signal.get("reward_mean", math.nan)))
        self._reset()
        self.window.append(judged)
        self.findings = self._find()
        fired = {f.name: f for f in self.findings}
        for f in self.findings:
            if self.warn and f.name not in self._firing:
                _log.warning("p3o off-policy monitor: %s. Suggestion: %s", f.message, f.suggestion)
        self._firing = set(fired)
        for name in self.FINDINGS:
            row[f"finding_{name}"] = 1.0 if name in fired else 0.0
            row[f"cause_{name}"] = float(fired[name].cause_code) if name in fired else 0.0
        return row

    def _find(self) -> list[Finding]:
        """The findings over the window; :data:`PATIENT_RULES` only from ``min_steps`` rows on (too early before)."""
        rows = list(self.window)
        need = min(self.window.maxlen or len(rows), int({**RULES, **self.rules}["min_steps"]))
        full = len(rows) >= need
        only = None if full else [n for n in (*RUN_RULES, *WINDOW_RULES, *SIGNAL_RULES) if n not in PATIENT_RULES]
        return find(rows, self.rules, source=self.source, only=only, config=self.config)

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
        hist = s[pos + 2 * N_POSITION_BUCKETS : pos + 2 * N_POSITION_BUCKETS + LAG_HIST_BINS]
        if n > 0:
            for k in range(min(int(mx[3].item()), LAG_HIST_BINS - 1) + 1):
                row[f"lag_hist_{k}"] = per(hist[k])
        at = pos + 2 * N_POSITION_BUCKETS + LAG_HIST_BINS
        for g, (group, ess_g, max_g) in enumerate((("lag_0", ess[1], mx[5]), ("stale", ess[-1], mx[6]))):
            c, absd, tails, msum = s[at : at + 4]
            pcs, pss = s[at + 4 : at + 4 + N_POSITION_BUCKETS], s[at + 4 + N_POSITION_BUCKETS : at + 4 + 20]
            at += 4 + 2 * N_POSITION_BUCKETS
            row[f"tokens_{group}"] = c
            if g == 1:  # ess_lag_0 is the lag-0 bucket's, above
                row["ess_stale"] = ess_g if c > 0 else nan
            row[f"dlogp_mean_{group}"] = per(absd, c)
            row[f"ratio_tails_{group}"] = per(tails, c)
            row[f"ratio_max_{group}"] = max_g.item() if c > 0 else nan
            row[f"m_mean_{group}"] = per(msum, c)
            for d in range(N_POSITION_BUCKETS):
                row[f"dlogp_pos_{group}_{d}"] = per(pss[d], pcs[d])
        row["lag_in_batch_mean"] = per(s[at])
        return row


def _token_lag(
    shape: tuple[int, int],
    dev: torch.device,
    versions: torch.Tensor | None,
    version: int | None,
    updates: int | torch.Tensor,
    updates_per_version: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's lag in optimizer updates, and its in-batch part, both (N, T) int64:

    lag = (version − versions)⁺ · updates_per_version + updates        (0 everywhere without `versions`)
    """
    if versions is None:
        zero = torch.zeros(shape, dtype=torch.int64, device=dev)
        return zero, zero
    if version is None:
        raise ValueError("OffPolicyMonitor: versions given without the trainer's version (version=)")
    upd = torch.as_tensor(updates, dtype=torch.int64)
    if upd.device.type == "cpu" and bool((upd < 0).any()):  # checked where it costs no device sync
        raise ValueError("OffPolicyMonitor: updates must be >= 0")
    in_batch = upd.to(dev).expand(*shape)
    vlag = (int(version) - versions.detach().to(dev, torch.int64)).clamp(min=0)
    return vlag * updates_per_version + in_batch, in_batch
