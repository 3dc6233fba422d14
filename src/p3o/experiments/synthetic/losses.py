"""The real p3o objectives applied to each seed's batch of the toy (one call when that is exact, else vmap or a
loop), and the per-seed off-policy diagnostics of a batch (ESS, MinPRO's prefix factor, a nominal clip share)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from p3o.errors import ConfigError
from p3o.objectives import ObjectiveInputs, effective_sample_size, get_objective, m2po_threshold, prefix_log_stat

Stats = dict[str, Tensor]


def objective_loss(
    name: str,
    hyper: dict[str, Any],
    logp: Tensor,
    rollout_logp: Tensor,
    advantages: Tensor,
    *,
    prox_logp: Tensor | None = None,
    old_logp: Tensor | None = None,
    ref_logp: Tensor | None = None,
    entropy: Tensor | None = None,
    layout: str = "auto",
) -> tuple[Tensor, Stats]:
    """Σ_s loss_s of the REAL objective ``name`` applied to each seed's batch separately, and pooled stats.

    Each seed's loss is exactly ``get_objective(name)(ObjectiveInputs(logp[s], rollout_logp[s], mask, adv[s],
    ...), **hyper)`` on its own (n, T) batch; it is computed in one call when that is exact:

    * ``rows`` (``coupling_for(hyper)`` ``"row"``, and ``"ess-scope"`` ones such as P3O with ``scope="sequence"``;
      a row-rejecting rollout correction makes it ``"batch"``):
      the S·n rows in one (S·n, T) batch —
      the per-token losses only see their own row, and the aggregation's 1/(S·…) is multiplied back by S;
    * ``seed-rows`` (P3O with scope micro-batch / step): each seed's n·T tokens as ONE row of an (S, n·T) batch
      with ``scope="sequence"``, which gives each seed its own e_B = ESS over its batch (identical per-token loss;
      with equal lengths every aggregation mode reduces to the same per-seed mean);
    * ``vmap`` (p3o_two_anchor, m2po: two batch ESS values / a batch-level threshold): one call per seed, batched
      by torch.func.vmap (M2PO's per-seed threshold precomputed); ``loop``: plain per-seed calls (also the fallback
      when vmap meets an op without a batching rule; nothing is remembered between calls).

    Args:
        logp: (S, n, T) with grad; rollout_logp, prox_logp, old_logp, ref_logp, entropy: (S, n, T);
        advantages: (S, n).
        layout: ``auto`` (the fastest exact one), or force ``vmap`` / ``loop``.
    Returns:
        (0-d loss = Σ_s loss_s, stats: 0-d tensors, means over seeds (pooled over tokens for the one-call layouts)).
    """
    fn = get_objective(name)
    s, n, t_len = logp.shape
    side = {"prox_logp": prox_logp, "old_logp": old_logp, "ref_logp": ref_logp, "entropy": entropy}
    layout = _layout(fn, hyper) if layout == "auto" else layout
    if layout == "rows":
        shape = (s * n, t_len)
        mask = torch.ones(shape, dtype=torch.bool)
        extra = {k: None if v is None else v.reshape(shape) for k, v in side.items()}
        inputs = ObjectiveInputs(
            logp.reshape(shape), rollout_logp.reshape(shape), mask, advantages.reshape(-1), **extra
        )
        loss, st = fn(inputs, **hyper)
        return loss * s, st
    if layout == "seed-rows":
        shape = (s, n * t_len)
        mask = torch.ones(shape, dtype=torch.bool)
        extra = {k: None if v is None else v.reshape(shape) for k, v in side.items()}
        adv = advantages[..., None].expand(s, n, t_len).reshape(shape)
        h = {**hyper, "scope": "sequence"}
        if h.get("agg", "token-mean") == "seq-mean-token-sum-norm":
            raise ConfigError("synthetic: p3o with agg=seq-mean-token-sum-norm needs layout='loop'")
        loss, st = fn(ObjectiveInputs(logp.reshape(shape), rollout_logp.reshape(shape), mask, adv, **extra), **h)
        return loss * s, st
    if layout not in ("loop", "vmap"):
        raise ConfigError(f"objective_loss: unknown layout {layout!r}; valid: auto, rows, seed-rows, vmap, loop")
    return _per_seed(fn, hyper, logp, rollout_logp, advantages, side, batched=layout == "vmap")


def _layout(fn: Any, hyper: dict[str, Any]) -> str:
    """The fastest exact layout for ``fn`` with ``hyper`` (see :func:`objective_loss`)."""
    scope = fn.resolve(hyper).get("scope")
    coupling = fn.coupling_for(hyper)  # a row-rejecting rollout correction couples the rows (``batch``)
    if coupling == "row" or (coupling == "ess-scope" and scope == "sequence"):
        return "rows"
    if coupling == "ess-scope":
        return "seed-rows"
    return "vmap"


def _per_seed(
    fn: Any,
    hyper: dict[str, Any],
    logp: Tensor,
    rollout_logp: Tensor,
    advantages: Tensor,
    side: dict[str, Tensor | None],
    *,
    batched: bool,
) -> tuple[Tensor, Stats]:
    """One call of ``fn`` per seed's (n, T) batch: Σ_s loss_s and the stats averaged over seeds.

    ``batched``: the calls batched with torch.func.vmap (autograd flows through the vmapped forward); M2PO's
    batch-level cut is computed per seed by :func:`p3o.objectives.m2po_threshold` first and passed in as
    ``ObjectiveInputs.m2po_threshold`` (exactly what the objective computes on its own batch). An op without a
    batching rule (none today) falls back to plain per-seed calls, which give the same loss.
    """
    s, n, t_len = logp.shape
    mask = torch.ones((n, t_len), dtype=torch.bool)
    if batched:
        keys = [k for k, v in side.items() if v is not None]
        args = [side[k] for k in keys]
        if "m2po_threshold" in fn.inputs_needed(hyper):
            tau = float(fn.resolve(hyper)["tau"])
            lr = logp.detach() - rollout_logp
            try:
                thr = torch.func.vmap(lambda x: m2po_threshold(x, mask, tau))(lr)
            except RuntimeError:  # pragma: no cover - depends on torch's batching rules
                thr = torch.stack([m2po_threshold(lr[i], mask, tau) for i in range(s)])
            args.append(thr)
            keys.append("m2po_threshold")

        def one(lp: Tensor, rl: Tensor, adv: Tensor, *xs: Tensor) -> tuple[Tensor, Stats]:
            return fn(ObjectiveInputs(lp, rl, mask, adv, **dict(zip(keys, xs))), **hyper)

        try:
            losses, stats = torch.func.vmap(one)(logp, rollout_logp, advantages, *args)
            return losses.sum(), {k: v.float().mean() for k, v in stats.items()}
        except RuntimeError:  # an op without a batching rule (none today): the per-seed loop gives the same loss
            pass
    total = logp.new_zeros(())
    acc: dict[str, Tensor] = {}
    for i in range(s):
        extra = {k: None if v is None else v[i] for k, v in side.items()}
        loss, st = fn(ObjectiveInputs(logp[i], rollout_logp[i], mask, advantages[i], **extra), **hyper)
        total = total + loss
        for k, v in st.items():
            acc[k] = acc.get(k, torch.zeros(())) + v
    return total, {k: v / s for k, v in acc.items()}


def batch_diagnostics(log_ratio: Tensor) -> dict[str, Tensor]:
    """Per-seed off-policy diagnostics of one (mini-)batch's log-ratios lr = log π_θ − log π_b, (S, n, T):

    ``ess`` (S,): Kong's ESS over the seed's n·T tokens (= P3O's e_B); ``m_mean`` (S,), ``m_above_0.5``,
    ``m_below_0.1``: MinPRO's prefix minimum m_t = min_{j<t} ρ_j (m_1 = 1) and its token fractions;
    ``clip_0.2`` (S,): fraction of tokens with |ρ − 1| > 0.2 (a nominal clip fraction, any objective).
    """
    s, n, t_len = log_ratio.shape
    lr = log_ratio.detach()
    ess = effective_sample_size(lr.reshape(s, n * t_len), torch.ones(s, n * t_len, dtype=torch.bool), scope="sequence")
    m = prefix_log_stat(lr.reshape(s * n, t_len), torch.ones(s * n, t_len, dtype=torch.bool), "min").exp()
    m = m.reshape(s, n * t_len)
    return {
        "ess": ess[:, 0],
        "m_mean": m.mean(-1),
        "m_above_0.5": (m > 0.5).float().mean(-1),
        "m_below_0.1": (m < 0.1).float().mean(-1),
        "clip_0.2": ((lr.exp() - 1).abs() > 0.2).float().reshape(s, -1).mean(-1),
    }
