"""The clip family: PPO's clipped surrogate and the objectives built on a clipped or truncated ratio.

GRPO, DAPO, GSPO, CISPO and decoupled PPO (AReaL).
Each objective is written as its policy term over the prepared micro-batch (N sequences, T tokens) and its own
keywords; :func:`p3o.objectives.shared.with_shared` wraps it in the rollout correction, the reference-KL and entropy
terms and the aggregation every objective shares, so the module-level name is the whole objective,
``fn(inputs, **hyper) -> (loss, stats)``. Usage::

    loss, stats = grpo(ObjectiveInputs(logp, rollout_logp, mask, advantages), clip_eps=0.2)

The maths is in docs/objectives.md; the symbols are those of the P3O paper (Eq. 4).
"""

from __future__ import annotations

import math
from typing import Literal

import torch

from p3o.objectives.core import (
    RATIO_LOG_CLAMP,
    ObjectiveError,
    PolicyTerm,
    Prepared,
    baseline_stats,
    check_eps,
    masked_mean,
    side_logp,
)
from p3o.objectives.shared import with_shared

WeightMode = Literal["mask", "clamp"]


def clipped_surrogate(
    log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    clip_eps_low: float,
    clip_eps_high: float,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO clipped surrogate per token (P3O paper Eq. 4), gradient through ρ = e^{lr}:

        ℓ_t = − min(ρ_t·A_t, clip(ρ_t, 1 − ε_l, 1 + ε_h)·A_t);   dual clip c: ℓ_t ← min(ℓ_t, −c·A_t) when A_t < 0

    Returns ((N, T) loss, (N, T) bool "the clipped branch is active").
    """
    ratio = torch.exp(log_ratio.clamp(-RATIO_LOG_CLAMP, RATIO_LOG_CLAMP))
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_eps_low, 1.0 + clip_eps_high)
    loss = torch.maximum(unclipped, clipped)
    was_clipped = (clipped > unclipped).detach()
    if dual_clip is not None:
        bound = -advantages * dual_clip
        loss = torch.where(advantages < 0, torch.minimum(loss, bound), loss)
    return loss, was_clipped


def _ppo_like(prep: Prepared, clip_eps_low: float, clip_eps_high: float, dual_clip: float | None) -> PolicyTerm:
    """The PPO clip of :func:`clipped_surrogate` on the prepared ratio, with ``clipfrac``: GRPO's and DAPO's term."""
    check_eps("clip_eps_low", clip_eps_low, upper=1.0)
    check_eps("clip_eps_high", clip_eps_high)
    if dual_clip is not None and dual_clip <= 1.0:
        raise ObjectiveError(f"dual_clip must be > 1 (or None), got {dual_clip}")
    per_token, was_clipped = clipped_surrogate(prep.log_ratio, prep.adv, clip_eps_low, clip_eps_high, dual_clip)
    stats = baseline_stats(prep)
    stats["clipfrac"] = masked_mean(was_clipped.float(), prep.mask)
    return PolicyTerm(per_token, stats)


@with_shared(agg="seq-mean-token-mean")
def grpo(
    prep: Prepared,
    *,
    clip_eps: float = 0.2,
    clip_eps_low: float | None = None,
    clip_eps_high: float | None = None,
    dual_clip: float | None = None,
) -> PolicyTerm:
    """GRPO / PPO clip (P3O paper Eq. 4): ℓ_t = −min(ρ_t·A_t, clip(ρ_t, 1−ε_l, 1+ε_h)·A_t).

    ``clip_eps`` sets both sides (0.2; the P3O paper sweeps 0.2/0.4/0.6); ``clip_eps_low`` / ``clip_eps_high``
    override one side. ``dual_clip`` c bounds ρ·A by c·A for A < 0. Aggregation ``seq-mean-token-mean``;
    use ``ref_kl_coef`` for GRPO's Eq. 8 KL term. Gradient flows through ρ.
    """
    low = clip_eps if clip_eps_low is None else clip_eps_low
    high = clip_eps if clip_eps_high is None else clip_eps_high
    return _ppo_like(prep, low, high, dual_clip)


@with_shared()
def dapo(
    prep: Prepared,
    *,
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.28,
    dual_clip: float | None = None,
) -> PolicyTerm:
    """DAPO: the PPO clip with decoupled "clip-higher" ε_l = 0.2, ε_h = 0.28 and ``token-mean`` aggregation.

    Dynamic sampling and the soft overlong penalty (:func:`p3o.advantages.overlong_penalty`) are data-side and
    applied by the training loop.
    """
    return _ppo_like(prep, clip_eps_low, clip_eps_high, dual_clip)


@with_shared(agg="seq-mean-token-mean")
def gspo(prep: Prepared, *, clip_eps_low: float = 3e-4, clip_eps_high: float = 4e-4) -> PolicyTerm:
    """GSPO: a sequence-level ratio s_i = exp(mean_{t valid} lr_{i,t}) in token form

        s_{i,t} = sg(s_i)·exp(logp_t − sg(logp_t)),   ℓ_t = −min(s_{i,t}·A_t, clip(s_{i,t}, 1−ε_l, 1+ε_h)·A_t)

    (value s_i, gradient s_i·A_t per token, averaged by ``seq-mean-token-mean``). ε = 3e-4 / 4e-4 (the MinPRO
    paper used 2e-3 both sides). Stats add seq_ratio_mean/min/max; ``clipfrac`` is the clipped-token fraction.
    """
    check_eps("clip_eps_low", clip_eps_low, upper=1.0)
    check_eps("clip_eps_high", clip_eps_high)
    mask, lr = prep.mask, prep.log_ratio
    count = mask.sum(-1, keepdim=True)
    seq_log = (lr.detach().sum(-1, keepdim=True) / count.clamp(min=1)).clamp(-RATIO_LOG_CLAMP, RATIO_LOG_CLAMP)
    token_log = seq_log + (prep.logp - prep.logp.detach())  # value log s_i, gradient 1 w.r.t. logp_t
    per_token, was_clipped = clipped_surrogate(token_log, prep.adv, clip_eps_low, clip_eps_high)
    stats = baseline_stats(prep)
    with torch.no_grad():
        rows = count[:, 0] > 0
        s = torch.exp(seq_log[:, 0])
        one = torch.ones((), device=s.device)
        stats.update(
            clipfrac=masked_mean(was_clipped.float(), mask),
            seq_ratio_mean=masked_mean(s, rows),
            seq_ratio_min=torch.where(rows.any(), torch.where(rows, s, math.inf).amin(), one),
            seq_ratio_max=torch.where(rows.any(), torch.where(rows, s, -math.inf).amax(), one),
        )
    return PolicyTerm(per_token, stats)


@with_shared()
def cispo(prep: Prepared, *, trunc_eps_low: float = 1.0, trunc_eps_high: float = 4.0) -> PolicyTerm:
    """CISPO: clipped, stop-gradient importance weights on a REINFORCE term — every token keeps a gradient.

        ℓ_t = − sg(clip(ρ_t, 1 − ε_l, 1 + ε_h))·A_t·logp_t

    Defaults ε_l = 1 (no lower bound), ε_h = 4 (cap 5), as in the MinPRO paper's table. ``trunc_frac`` counts
    tokens whose weight is truncated (ρ outside [1 − ε_l, 1 + ε_h]), ``trunc_high_frac`` those above 1 + ε_h.
    ``trunc_eps_low`` / ``trunc_eps_high`` were ``clip_eps_low`` / ``clip_eps_high`` (deprecated aliases).
    """
    check_eps("trunc_eps_low", trunc_eps_low, upper=1.0)
    check_eps("trunc_eps_high", trunc_eps_high)
    mask, lr = prep.mask, prep.log_ratio
    lr_d = lr.detach()
    log_hi = math.log1p(trunc_eps_high)
    weight = torch.exp(lr_d.clamp(max=log_hi)).clamp(min=1.0 - trunc_eps_low)
    per_token = -(weight * prep.adv) * prep.logp
    stats = baseline_stats(prep)
    with torch.no_grad():
        out = (lr_d > log_hi) | (torch.exp(lr_d) < 1.0 - trunc_eps_low)
        stats["trunc_frac"] = masked_mean(out.float(), mask)
        stats["trunc_high_frac"] = masked_mean((lr_d > log_hi).float(), mask)
    return PolicyTerm(per_token, stats)


@with_shared()
def decoupled_ppo(
    prep: Prepared,
    *,
    clip_eps: float = 0.2,
    clip_eps_low: float | None = None,
    clip_eps_high: float | None = None,
    weight_cap: float = 5.0,
    weight_mode: WeightMode = "mask",
) -> PolicyTerm:
    """Decoupled PPO loss (Hilton et al. 2022; AReaL): the clip is taken against π_prox, π_b only reweights.

        r_t = π_θ/π_prox,  w_t = sg(π_prox/π_b),  ℓ_t = −w_t·min(r_t·A_t, clip(r_t, 1−ε_l, 1+ε_h)·A_t)

    Tokens with w_t > ``weight_cap`` are dropped (``weight_mode="mask"``: weight 0, denominator unchanged, as
    in AReaL) or get w_t = ``weight_cap`` (``"clamp"``). Needs ``inputs.prox_logp``. Stats: behav_capped_frac
    (w_t > cap), clipfrac (clip vs π_prox), ratio_* and ess vs π_b.
    """
    if weight_mode not in ("mask", "clamp"):
        raise ObjectiveError(f"weight_mode: unknown value {weight_mode!r}; valid: mask, clamp")
    if not weight_cap > 0:
        raise ObjectiveError(f"weight_cap must be > 0, got {weight_cap}")
    low = clip_eps if clip_eps_low is None else clip_eps_low
    high = clip_eps if clip_eps_high is None else clip_eps_high
    check_eps("clip_eps_low", low, upper=1.0)
    check_eps("clip_eps_high", high)
    mask = prep.mask
    prox = side_logp(prep.inputs, "prox_logp", mask, needed_by="decoupled_ppo")
    surrogate, was_clipped = clipped_surrogate(prep.logp - prox, prep.adv, low, high)
    log_w = prox - prep.rollout_logp
    log_cap = math.log(weight_cap)
    over = log_w > log_cap
    weight = torch.exp(log_w.clamp(max=log_cap))
    per_token = weight * surrogate
    keep = ~over if weight_mode == "mask" else None
    stats = baseline_stats(prep)
    stats["clipfrac"] = masked_mean(was_clipped.float(), mask)
    stats["behav_capped_frac"] = masked_mean(over.float(), mask)
    stats["behav_weight_mean"] = masked_mean(torch.exp(log_w.clamp(max=RATIO_LOG_CLAMP)), mask)
    return PolicyTerm(per_token, stats, extra_mask=keep)
