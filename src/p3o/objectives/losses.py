"""Policy objectives: P3O (and its two-anchor variant) and the baselines it is compared with.

Usage: ``loss, stats = p3o(ObjectiveInputs(logp, rollout_logp, mask, advantages), scope="micro-batch")``.

Every objective builds an (N, T) per-token loss and hands it to :func:`p3o.objectives.core.finish`, which adds
the rollout correction, the reference-KL and entropy terms and owns the aggregation. The maths is in
docs/objectives.md; the symbols are those of the P3O paper (Eq. 4, 12) and the MinPRO paper.
"""

from __future__ import annotations

import math
from typing import Literal, get_args

import torch

from p3o.objectives.core import (
    KL_CLAMP,
    KL_ESTIMATORS,
    Agg,
    Correction,
    EssScope,
    KlEstimator,
    ObjectiveError,
    ObjectiveInputs,
    Prepared,
    RolloutCorrection,
    _ess,
    finish,
    k3,
    kl_estimate,
    masked_mean,
    prepare,
    ratio_stats,
    side_logp,
)

Stats = dict[str, torch.Tensor]
RATIO_LOG_CLAMP = 80.0  # lr bound inside exp(lr) where ρ carries gradient: e^80 ~ 5.5e34 keeps ρ·A finite in float32
PrefixStat = Literal["min", "mean", "geomean", "prod"]
PREFIX_STATS: tuple[str, ...] = get_args(PrefixStat)
WeightMode = Literal["mask", "clamp"]
TwoAnchorVariant = Literal["sum", "mixture"]
P3oCap = Literal["ess", "clip"]
P3O_CAPS: tuple[str, ...] = get_args(P3oCap)
P3oKlAnchor = Literal["behaviour", "proximal"]
P3O_KL_ANCHORS: tuple[str, ...] = get_args(P3oKlAnchor)
# capped_frac counts ρ_t > e_B beyond float noise: on-policy, fp32 ratios sit ~1e-7 either side of an ESS of 1.
CAP_TOL = 1e-5


def _common(agg: str, ref_kl_coef: float, entropy_coef: float) -> dict:
    return {"agg": agg, "ref_kl_coef": ref_kl_coef, "entropy_coef": entropy_coef}


def _rc(mode: str, cap: float, low: float) -> Correction:
    """The rollout correction of the ``rollout_correction``, ``rollout_correction_cap``, ``rollout_correction_low``
    hyper-parameters (applied by :func:`p3o.objectives.core.prepare`)."""
    return Correction(mode, cap, low)


def _check_eps(name: str, value: float, *, upper: float | None = None) -> None:
    if not (value >= 0) or (upper is not None and value > upper):
        bound = f"[0, {upper}]" if upper is not None else ">= 0"
        raise ObjectiveError(f"{name} must be {bound}, got {value}")


# ----------------------------------------------------------------------------------------------- P3O


def p3o_token_loss(
    logp: torch.Tensor,
    log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    ess: torch.Tensor,
    *,
    kl: bool = True,
    kl_clamp: float = KL_CLAMP,
    kl_estimator: str = "k3",
    cap: str = "ess",
    cap_eps: float = 0.2,
    kl_log_ratio: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token P3O loss (paper Eq. 12), (N, T):

        ℓ_t = − w_t · A_t · logp_t + (1 − e_B) · k(lr_t)

    with the paper's ``cap="ess"`` weight w_t = sg(min(ρ_t, e_B)) and ``kl_estimator="k3"``,
    k(lr) = e^{−lr} + lr − 1, so ∂ℓ_t/∂logp_t = −min(ρ_t, e_B)·A_t + (1 − e_B)·(1 − 1/ρ_t). ``ess`` is e_B (0-d,
    or (N, 1) per sequence; with ``cap="ess"`` any positive cap works, e.g. 1 + ε_h gives CISPO when
    ``kl=False``). ``log_ratio`` = logp − rollout_logp (0 at masked positions); the weight is computed as
    exp(min(lr, log e_B)) so it never overflows.

    Beyond the paper: ``kl_estimator`` ∈ {k3, k3_is, k2, none} (:func:`p3o.objectives.core.kl_estimate`;
    ``kl=False`` is ``none``), and ``cap="clip"``, a cap that follows the advantage's sign as GRPO's clip does:
    w_t = sg(ρ_t)·1[ρ_t ≤ 1 + ε] for A_t ≥ 0 and sg(ρ_t)·1[ρ_t ≥ 1 − ε] for A_t < 0 (ε = ``cap_eps``), whose
    policy-gradient term has exactly the gradient of GRPO's token loss at that ε. ``kl_log_ratio`` (N, T), with
    gradient: the log-ratio the KL term is taken on (default ``log_ratio``; P3O's ``kl_anchor="proximal"`` passes
    logp − prox_logp); the weight and e_B stay those of ``log_ratio``.
    """
    e_b = ess.detach().float()
    lr_d = log_ratio.detach()
    if cap == "ess":
        weight = torch.exp(torch.minimum(lr_d, torch.log(e_b)))
    elif cap == "clip":
        weight = _sign_clip_weight(lr_d, advantages, cap_eps)
    else:
        raise ObjectiveError(f"cap: unknown value {cap!r}; valid: {', '.join(P3O_CAPS)}")
    loss = -(weight * advantages) * logp
    if kl and kl_estimator != "none":
        kl_lr = log_ratio if kl_log_ratio is None else kl_log_ratio
        loss = loss + (1.0 - e_b) * kl_estimate(kl_lr, kl_estimator, kl_clamp)
    elif kl_estimator not in KL_ESTIMATORS:
        raise ObjectiveError(f"kl_estimator: unknown value {kl_estimator!r}; valid: {', '.join(KL_ESTIMATORS)}")
    return loss


def _sign_clip_weight(lr: torch.Tensor, advantages: torch.Tensor, eps: float) -> torch.Tensor:
    """sg(ρ)·1[ρ ≤ 1 + ε] where A ≥ 0, sg(ρ)·1[ρ ≥ 1 − ε] where A < 0 (detached, (N, T)): the tokens GRPO's clip
    leaves a gradient, with GRPO's own ratio exp(clamp(lr, ±80))."""
    rho = torch.exp(lr.detach().clamp(-RATIO_LOG_CLAMP, RATIO_LOG_CLAMP))
    keep = torch.where(advantages >= 0, rho <= 1.0 + eps, rho >= 1.0 - eps)
    return torch.where(keep, rho, torch.zeros((), device=rho.device))


def p3o(
    inputs: ObjectiveInputs,
    *,
    scope: EssScope = "micro-batch",
    kl_estimator: KlEstimator = "k3",
    cap: P3oCap = "ess",
    cap_eps: float = 0.2,
    kl_anchor: P3oKlAnchor = "behaviour",
    kl_clamp: float = KL_CLAMP,
    agg: Agg = "token-mean",
    ref_kl_coef: float = 0.0,
    entropy_coef: float = 0.0,
    rollout_correction: RolloutCorrection = "none",
    rollout_correction_cap: float = 2.0,
    rollout_correction_low: float = 0.5,
) -> tuple[torch.Tensor, Stats]:
    """P3O (Eq. 12): ESS-capped importance weights and an ESS-weighted KL to the behaviour policy.

        e_B = sg(ESS(B)),  ℓ_t = − sg(min(ρ_t, e_B))·A_t·logp_t + (1 − e_B)·KL_t,  KL_t = e^{−lr_t} + lr_t − 1

    No clip range: the cap is ≤ 1, one-sided and never zero. On-policy (ρ ≡ 1) the gradient equals GRPO's.

    Beyond the paper (opt-in, defaults are the paper's): ``kl_estimator`` picks k in (1 − e_B)·k(lr_t):
    ``k3`` (the paper's e^{−lr} + lr − 1), ``k3_is`` (e^{lr}·lr − e^{lr} + 1, unbiased for KL(π_θ‖π_b) on π_b
    samples), ``k2`` (½·lr²) or ``none`` (the policy-gradient part alone). ``cap="clip"`` replaces min(ρ, e_B)
    by a sign-following cut at ``cap_eps`` = ε (w_t = sg(ρ_t)·1[ρ_t ≤ 1 + ε] for A_t ≥ 0, sg(ρ_t)·1[ρ_t ≥ 1 − ε]
    for A_t < 0): its policy-gradient term has GRPO's token gradient at that ε; the KL term is unchanged.
    ``kl_anchor="proximal"`` takes the KL term against the proximal snapshot π_prox (``inputs.prox_logp``, the
    trainer's policy at the start of the step's epoch) instead of π_b: (1 − e_B)·k(logp_t − prox_logp_t), with
    e_B and the cap still from ρ_t = π_θ/π_b. With one optimizer step per batch, π_prox is the policy the gradient
    is taken at, so the KL term's gradient is k'(0) = 0 for every estimator: the arm is P3O's policy-gradient part.

    Args:
        inputs: logp (N, T) with grad; rollout_logp, mask, advantages; ``group`` for the ESS all-reduce;
            ``step_ess`` when ``scope="step"``.
        scope: B for the ESS: ``micro-batch`` (default, all-reduced over data-parallel ranks), ``step``
            (``inputs.step_ess`` precomputed by the loop) or ``sequence`` (one e_B per row).
        kl_estimator: k3 (default), k3_is, k2 or none (see above).
        cap: ``ess`` (default, the paper's min(ρ, e_B)) or ``clip`` (see above); ``cap_eps`` is ε of ``clip``.
        kl_clamp: bound on |lr_t| inside e^{±lr_t} (``kl_clamped`` counts the tokens beyond it).
    Stats: ess, kl_weight, capped_frac (tokens whose weight the cap changes: ρ > e_B, or removed by ``clip``),
        kl_behavior, approx_kl, ratio_mean/min/max, band_frac (|ρ − 1| > 0.2),
        kl_clamped, ess_degenerate, kl_prox (k3 against π_prox, with ``kl_anchor="proximal"``); diagnostics of
        MinPRO's prefix factor on the same ratios: m_mean, m_frac_above_0_5, m_frac_below_0_1.
    """
    prep = prepare(inputs, _rc(rollout_correction, rollout_correction_cap, rollout_correction_low))
    mask, lr = prep.mask, prep.log_ratio
    if scope == "step":
        if inputs.step_ess is None:
            raise ObjectiveError('p3o scope="step" needs ObjectiveInputs.step_ess (the step\'s precomputed ESS)')
        ess = torch.as_tensor(inputs.step_ess, dtype=torch.float32, device=lr.device).detach().reshape(())
        degenerate = torch.zeros((), dtype=torch.bool, device=lr.device)
    else:
        ess, degenerate = _ess(lr, mask, inputs.group, scope)
    if cap == "clip":
        _check_eps("cap_eps", cap_eps, upper=1.0)
    if kl_anchor == "proximal":
        prox = side_logp(inputs, "prox_logp", mask, needed_by='kl_anchor="proximal"')
        kl_lr: torch.Tensor | None = torch.where(mask, prep.logp - prox, torch.zeros_like(prox))
    elif kl_anchor == "behaviour":
        kl_lr = None
    else:
        raise ObjectiveError(f"kl_anchor: unknown value {kl_anchor!r}; valid: {', '.join(P3O_KL_ANCHORS)}")
    per_token = p3o_token_loss(
        prep.logp,
        lr,
        prep.adv,
        ess,
        kl_clamp=kl_clamp,
        kl_estimator=kl_estimator,
        cap=cap,
        cap_eps=cap_eps,
        kl_log_ratio=kl_lr,
    )
    with torch.no_grad():
        lr_d = lr.detach()
        stats = ratio_stats(lr_d, mask)
        ess_mean = ess.mean() if scope != "sequence" else masked_mean(ess[:, 0], mask.any(-1))
        if cap == "clip":
            capped = _sign_clip_weight(lr_d, prep.adv, cap_eps) == 0
        else:
            capped = lr_d > torch.log(ess) + CAP_TOL
        stats.update(
            ess=ess_mean,
            kl_weight=1.0 - ess_mean,
            capped_frac=masked_mean(capped.float(), mask),
            kl_behavior=stats["approx_kl"],
            kl_clamped=(mask & (lr_d.abs() > kl_clamp)).sum().float(),
            ess_degenerate=degenerate.float(),
        )
        if kl_lr is not None:
            stats["kl_prox"] = masked_mean(k3(kl_lr.detach(), kl_clamp), mask)
        # MinPRO's prefix factor m_t = min_{j<t} ρ_j of the same ratios (a diagnostic of how off-policy the batch
        # is along each sequence; P3O does not use it): its mean and the token shares above 0.5 and below 0.1.
        m = torch.exp(prefix_log_stat(lr_d, mask, "min"))
        stats.update(
            m_mean=masked_mean(m, mask),
            m_frac_above_0_5=masked_mean((m > 0.5).float(), mask),
            m_frac_below_0_1=masked_mean((m < 0.1).float(), mask),
        )
    return finish(
        per_token,
        inputs,
        prep,
        stats=stats,
        **_common(agg, ref_kl_coef, entropy_coef),
    )


def p3o_two_anchor(
    inputs: ObjectiveInputs,
    *,
    variant: TwoAnchorVariant = "sum",
    kl_clamp: float = KL_CLAMP,
    agg: Agg = "token-mean",
    ref_kl_coef: float = 0.0,
    entropy_coef: float = 0.0,
    rollout_correction: RolloutCorrection = "none",
    rollout_correction_cap: float = 2.0,
    rollout_correction_low: float = 0.5,
) -> tuple[torch.Tensor, Stats]:
    """Two-anchor P3O (paper App. D, reconstructed from the authors' code): anchors π_b and π_prox.

        ρ^b = π_θ/π_b, ρ^p = π_θ/π_prox, e_b = ESS(ρ^b), e_p = ESS(ρ^p), e_mix = min(e_b, e_p)
        ℓ_t = − sg(min(ρ^b_t, e_mix))·A_t·logp_t + KL terms
        variant "sum":     (1 − e_b)·KL_t(π_θ‖π_b) + (1 − e_p)·KL_t(π_θ‖π_prox)
        variant "mixture": (1 − e_mix)·KL_t(π_θ‖π_mix),  π_mix ∝ (1−e_b)·π_b + (1−e_p)·π_prox (per token)

    Needs ``inputs.prox_logp`` (N, T). KL_t is the k3 form. The paper reports that it collapsed in its runs.
    """
    if variant not in ("sum", "mixture"):
        raise ObjectiveError(f"variant: unknown value {variant!r}; valid: sum, mixture")
    prep = prepare(inputs, _rc(rollout_correction, rollout_correction_cap, rollout_correction_low))
    mask, lr_b = prep.mask, prep.log_ratio
    prox = side_logp(inputs, "prox_logp", mask, needed_by="p3o_two_anchor")
    lr_p = prep.logp - prox
    e_b, bad_b = _ess(lr_b, mask, inputs.group)
    e_p, bad_p = _ess(lr_p, mask, inputs.group)
    e_mix = torch.minimum(e_b, e_p)
    per_token = p3o_token_loss(prep.logp, lr_b, prep.adv, e_mix, kl=False)
    if variant == "sum":
        per_token = per_token + (1 - e_b) * k3(lr_b, kl_clamp) + (1 - e_p) * k3(lr_p, kl_clamp)
    else:
        a, c = (1 - e_b).clamp(min=1e-12), (1 - e_p).clamp(min=1e-12)
        log_mix = torch.logaddexp(torch.log(a) + prep.rollout_logp, torch.log(c) + prox) - torch.log(a + c)
        per_token = per_token + (1 - e_mix) * k3(prep.logp - log_mix, kl_clamp)
    with torch.no_grad():
        lr_d = lr_b.detach()
        stats = ratio_stats(lr_d, mask)
        stats.update(
            ess=e_mix,
            ess_behavior=e_b,
            ess_prox=e_p,
            kl_weight=1 - e_mix,
            capped_frac=masked_mean((lr_d > torch.log(e_mix) + CAP_TOL).float(), mask),
            kl_behavior=stats["approx_kl"],
            kl_prox=masked_mean(k3(lr_p.detach()), mask),
            ess_degenerate=(bad_b | bad_p).float(),
        )
    return finish(
        per_token,
        inputs,
        prep,
        stats=stats,
        **_common(agg, ref_kl_coef, entropy_coef),
    )


# ----------------------------------------------------------------------------------------------- clip family


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


def _ppo_like(
    inputs: ObjectiveInputs,
    clip_eps_low: float,
    clip_eps_high: float,
    dual_clip: float | None,
    common: dict,
    correction: Correction,
) -> tuple[torch.Tensor, Stats]:
    _check_eps("clip_eps_low", clip_eps_low, upper=1.0)
    _check_eps("clip_eps_high", clip_eps_high)
    if dual_clip is not None and dual_clip <= 1.0:
        raise ObjectiveError(f"dual_clip must be > 1 (or None), got {dual_clip}")
    prep = prepare(inputs, correction)
    per_token, was_clipped = clipped_surrogate(prep.log_ratio, prep.adv, clip_eps_low, clip_eps_high, dual_clip)
    stats = _baseline_stats(prep.log_ratio, prep.mask, inputs)
    stats["clipfrac"] = masked_mean(was_clipped.float(), prep.mask)
    return finish(per_token, inputs, prep, stats=stats, **common)


def _baseline_stats(log_ratio: torch.Tensor, mask: torch.Tensor, inputs: ObjectiveInputs) -> Stats:
    """Ratio diagnostics vs π_b plus the (local, not all-reduced) ESS, for objectives that do not use the ESS."""
    with torch.no_grad():
        stats = ratio_stats(log_ratio, mask)
        stats["kl_behavior"] = stats["approx_kl"]
        stats["ess"] = _ess(log_ratio, mask, inputs.group, sync=False)[0]
    return stats


def grpo(
    inputs: ObjectiveInputs,
    *,
    clip_eps: float = 0.2,
    clip_eps_low: float | None = None,
    clip_eps_high: float | None = None,
    dual_clip: float | None = None,
    agg: Agg = "seq-mean-token-mean",
    ref_kl_coef: float = 0.0,
    entropy_coef: float = 0.0,
    rollout_correction: RolloutCorrection = "none",
    rollout_correction_cap: float = 2.0,
    rollout_correction_low: float = 0.5,
) -> tuple[torch.Tensor, Stats]:
    """GRPO / PPO clip (P3O paper Eq. 4): ℓ_t = −min(ρ_t·A_t, clip(ρ_t, 1−ε_l, 1+ε_h)·A_t).

    ``clip_eps`` sets both sides (0.2; the P3O paper sweeps 0.2/0.4/0.6); ``clip_eps_low`` / ``clip_eps_high``
    override one side. ``dual_clip`` c bounds ρ·A by c·A for A < 0. Aggregation ``seq-mean-token-mean``;
    use ``ref_kl_coef`` for GRPO's Eq. 8 KL term. Gradient flows through ρ.
    """
    low = clip_eps if clip_eps_low is None else clip_eps_low
    high = clip_eps if clip_eps_high is None else clip_eps_high
    common = _common(agg, ref_kl_coef, entropy_coef)
    return _ppo_like(
        inputs, low, high, dual_clip, common, _rc(rollout_correction, rollout_correction_cap, rollout_correction_low)
    )


def dapo(
    inputs: ObjectiveInputs,
    *,
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.28,
    dual_clip: float | None = None,
    agg: Agg = "token-mean",
    ref_kl_coef: float = 0.0,
    entropy_coef: float = 0.0,
    rollout_correction: RolloutCorrection = "none",
    rollout_correction_cap: float = 2.0,
    rollout_correction_low: float = 0.5,
) -> tuple[torch.Tensor, Stats]:
    """DAPO: the PPO clip with decoupled "clip-higher" ε_l = 0.2, ε_h = 0.28 and ``token-mean`` aggregation.

    Dynamic sampling and the soft overlong penalty (:func:`p3o.advantages.overlong_penalty`) are data-side and
    applied by the training loop.
    """
    common = _common(agg, ref_kl_coef, entropy_coef)
    return _ppo_like(
        inputs,
        clip_eps_low,
        clip_eps_high,
        dual_clip,
        common,
        _rc(rollout_correction, rollout_correction_cap, rollout_correction_low),
    )


def gspo(
    inputs: ObjectiveInputs,
    *,
    clip_eps_low: float = 3e-4,
    clip_eps_high: float = 4e-4,
    agg: Agg = "seq-mean-token-mean",
    ref_kl_coef: float = 0.0,
    entropy_coef: float = 0.0,
    rollout_correction: RolloutCorrection = "none",
    rollout_correction_cap: float = 2.0,
    rollout_correction_low: float = 0.5,
) -> tuple[torch.Tensor, Stats]:
    """GSPO: a sequence-level ratio s_i = exp(mean_{t valid} lr_{i,t}) in token form

        s_{i,t} = sg(s_i)·exp(logp_t − sg(logp_t)),   ℓ_t = −min(s_{i,t}·A_t, clip(s_{i,t}, 1−ε_l, 1+ε_h)·A_t)

    (value s_i, gradient s_i·A_t per token, averaged by ``seq-mean-token-mean``). ε = 3e-4 / 4e-4 (the MinPRO
    paper used 2e-3 both sides). Stats add seq_ratio_mean/min/max; ``clipfrac`` is the clipped-token fraction.
    """
    common = _common(agg, ref_kl_coef, entropy_coef)
    _check_eps("clip_eps_low", clip_eps_low, upper=1.0)
    _check_eps("clip_eps_high", clip_eps_high)
    prep = prepare(inputs, _rc(rollout_correction, rollout_correction_cap, rollout_correction_low))
    mask, lr = prep.mask, prep.log_ratio
    count = mask.sum(-1, keepdim=True)
    seq_log = (lr.detach().sum(-1, keepdim=True) / count.clamp(min=1)).clamp(-RATIO_LOG_CLAMP, RATIO_LOG_CLAMP)
    token_log = seq_log + (prep.logp - prep.logp.detach())  # value log s_i, gradient 1 w.r.t. logp_t
    per_token, was_clipped = clipped_surrogate(token_log, prep.adv, clip_eps_low, clip_eps_high)
    stats = _baseline_stats(lr, mask, inputs)
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
    return finish(per_token, inputs, prep, stats=stats, **common)


def cispo(
    inputs: ObjectiveInputs,
    *,
    trunc_eps_low: float = 1.0,
    trunc_eps_high: float = 4.0,
    agg: Agg = "token-mean",
    ref_kl_coef: float = 0.0,
    entropy_coef: float = 0.0,
    rollout_correction: RolloutCorrection = "none",
    rollout_correction_cap: float = 2.0,
    rollout_correction_low: float = 0.5,
) -> tuple[torch.Tensor, Stats]:
    """CISPO: clipped, stop-gradient importance weights on a REINFORCE term — every token keeps a gradient.

        ℓ_t = − sg(clip(ρ_t, 1 − ε_l, 1 + ε_h))·A_t·logp_t

    Defaults ε_l = 1 (no lower bound), ε_h = 4 (cap 5), as in the MinPRO paper's table. ``trunc_frac`` counts
    tokens whose weight is truncated (ρ outside [1 − ε_l, 1 + ε_h]), ``trunc_high_frac`` those above 1 + ε_h.
    ``trunc_eps_low`` / ``trunc_eps_high`` were ``clip_eps_low`` / ``clip_eps_high`` (deprecated aliases).
    """
    common = _common(agg, ref_kl_coef, entropy_coef)
    _check_eps("trunc_eps_low", trunc_eps_low, upper=1.0)
    _check_eps("trunc_eps_high", trunc_eps_high)
    prep = prepare(inputs, _rc(rollout_correction, rollout_correction_cap, rollout_correction_low))
    mask, lr = prep.mask, prep.log_ratio
    lr_d = lr.detach()
    log_hi = math.log1p(trunc_eps_high)
    weight = torch.exp(lr_d.clamp(max=log_hi)).clamp(min=1.0 - trunc_eps_low)
    per_token = -(weight * prep.adv) * prep.logp
    stats = _baseline_stats(lr, mask, inputs)
    with torch.no_grad():
        out = (lr_d > log_hi) | (torch.exp(lr_d) < 1.0 - trunc_eps_low)
        stats["trunc_frac"] = masked_mean(out.float(), mask)
        stats["trunc_high_frac"] = masked_mean((lr_d > log_hi).float(), mask)
    return finish(per_token, inputs, prep, stats=stats, **common)


def decoupled_ppo(
    inputs: ObjectiveInputs,
    *,
    clip_eps: float = 0.2,
    clip_eps_low: float | None = None,
    clip_eps_high: float | None = None,
    weight_cap: float = 5.0,
    weight_mode: WeightMode = "mask",
    agg: Agg = "token-mean",
    ref_kl_coef: float = 0.0,
    entropy_coef: float = 0.0,
    rollout_correction: RolloutCorrection = "none",
    rollout_correction_cap: float = 2.0,
    rollout_correction_low: float = 0.5,
) -> tuple[torch.Tensor, Stats]:
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
    _check_eps("clip_eps_low", low, upper=1.0)
    _check_eps("clip_eps_high", high)
    common = _common(agg, ref_kl_coef, entropy_coef)
    prep = prepare(inputs, _rc(rollout_correction, rollout_correction_cap, rollout_correction_low))
    mask = prep.mask
    prox = side_logp(inputs, "prox_logp", mask, needed_by="decoupled_ppo")
    surrogate, was_clipped = clipped_surrogate(prep.logp - prox, prep.adv, low, high)
    log_w = prox - prep.rollout_logp
    log_cap = math.log(weight_cap)
    over = log_w > log_cap
    weight = torch.exp(log_w.clamp(max=log_cap))
    per_token = weight * surrogate
    keep = ~over if weight_mode == "mask" else None
    stats = _baseline_stats(prep.log_ratio, mask, inputs)
    stats["clipfrac"] = masked_mean(was_clipped.float(), mask)
    stats["behav_capped_frac"] = masked_mean(over.float(), mask)
    stats["behav_weight_mean"] = masked_mean(torch.exp(log_w.clamp(max=RATIO_LOG_CLAMP)), mask)
    return finish(per_token, inputs, prep, stats=stats, extra_mask=keep, **common)


# ----------------------------------------------------------------------------------------------- M2PO


def m2po_threshold(log_ratio: torch.Tensor, mask: torch.Tensor, tau: float = 0.04) -> torch.Tensor:
    """M2PO's cut on v_t = lr_t² over the valid tokens (detached 0-d float32): sort v descending and mask the
    largest until the mean of the remaining is < τ; tokens with v_t >= threshold are the masked ones.

    +inf when nothing needs masking (M̂2 = mean v < τ, or no valid token); the smallest valid v when even a single
    remaining token has v ≥ τ (everything masked). The loop calls this on all tokens of an optimizer step and
    passes the result as ``ObjectiveInputs.m2po_threshold``.
    """
    assert log_ratio.shape == mask.shape, (log_ratio.shape, mask.shape)
    with torch.no_grad():
        v = torch.where(
            mask, log_ratio.detach().double() ** 2, torch.full((), -1.0, dtype=torch.float64, device=log_ratio.device)
        )
        v_sorted = v.flatten().sort(descending=True).values  # valid first (v >= 0), masked (-1) last
        n = mask.sum()
        length = v_sorted.numel()
        if length == 0:
            return torch.full((), math.inf, device=log_ratio.device)
        k = torch.arange(length, device=v.device)
        csum = torch.cumsum(torch.where(k < n, v_sorted, torch.zeros_like(v_sorted)), 0)
        removed = torch.cat([csum.new_zeros(1), csum[:-1]])  # Σ of the k largest
        remaining_mean = (csum[-1] - removed) / (n - k).clamp(min=1)
        ok = (k < n) & (remaining_mean < tau)
        first = torch.argmax(ok.to(torch.uint8))  # first k that satisfies; 0 if none
        thr_some = v_sorted[(first - 1).clamp(min=0)]
        thr_all = v_sorted[(n - 1).clamp(min=0)]
        inf = torch.full((), math.inf, dtype=torch.float64, device=v.device)
        thr = torch.where(ok.any(), torch.where(first == 0, inf, thr_some), torch.where(n > 0, thr_all, inf))
        return thr.float()


def m2po(
    inputs: ObjectiveInputs,
    *,
    tau: float = 0.04,
    agg: Agg = "token-mean",
    ref_kl_coef: float = 0.0,
    entropy_coef: float = 0.0,
    rollout_correction: RolloutCorrection = "none",
    rollout_correction_cap: float = 2.0,
    rollout_correction_low: float = 0.5,
) -> tuple[torch.Tensor, Stats]:
    """M2PO (second-moment trust policy optimisation): no clip, mask the tokens with the largest lr².

        M_t = 1[lr_t² < threshold],   ℓ_t = −M_t·ρ_t·A_t   (gradient through ρ)

    divided by the ORIGINAL valid-token count (masked tokens stay in the denominator). The threshold is
    ``inputs.m2po_threshold`` (step-level, see :func:`m2po_threshold`) or, when None, this batch's own.
    Stats: masked_frac, m2 (mean lr² before masking).
    """
    if not tau > 0:
        raise ObjectiveError(f"tau must be > 0, got {tau}")
    common = _common(agg, ref_kl_coef, entropy_coef)
    prep = prepare(inputs, _rc(rollout_correction, rollout_correction_cap, rollout_correction_low))
    mask, lr = prep.mask, prep.log_ratio
    if inputs.m2po_threshold is None:
        thr = m2po_threshold(lr, mask, tau)
    else:
        thr = torch.as_tensor(inputs.m2po_threshold, dtype=torch.float32, device=lr.device).reshape(())
    v = lr.detach() ** 2
    keep = v < thr
    ratio = torch.exp(lr.clamp(-RATIO_LOG_CLAMP, RATIO_LOG_CLAMP))
    per_token = -prep.adv * ratio
    stats = _baseline_stats(lr, mask, inputs)
    stats["masked_frac"] = masked_mean((~keep).float(), mask)
    stats["m2"] = masked_mean(v, mask)
    return finish(per_token, inputs, prep, stats=stats, extra_mask=keep, **common)


# ----------------------------------------------------------------------------------------------- MinPRO


def prefix_log_stat(
    log_ratio: torch.Tensor, mask: torch.Tensor, stat: str = "min", *, include_one: bool = False
) -> torch.Tensor:
    """log m_t: a statistic of the ratios of the STRICTLY preceding valid tokens of each row (detached, (N, T)).

    ``min``: m_t = min_{j<t valid} ρ_j (cumulative min of lr, shifted right by one; masked positions count as
    +inf); ``mean``: arithmetic mean of those ρ_j (log-cum-sum-exp); ``geomean``: exp(mean lr_j); ``prod``:
    Π_{j<t} ρ_j (so m_t·ρ_t is the exact cumulative prefix ratio ρ_{1:t}). An empty prefix gives m = 1.
    ``include_one``: the prefix also holds an implicit ρ = 1 (min: min(1, ·); mean / geomean: one more term).
    """
    if stat not in PREFIX_STATS:
        raise ObjectiveError(f"prefix_stat: unknown value {stat!r}; valid: {', '.join(PREFIX_STATS)}")
    with torch.no_grad():
        lr = torch.where(mask, log_ratio.detach().float(), torch.zeros((), device=log_ratio.device))
        n, t = lr.shape
        if t == 0:
            return lr

        def shift(x: torch.Tensor, fill: float) -> torch.Tensor:
            return torch.cat([torch.full((n, 1), fill, device=x.device, dtype=x.dtype), x[:, :-1]], dim=1)

        count = shift(torch.cumsum(mask, 1).float(), 0.0)  # number of strictly preceding valid tokens
        if stat == "min":
            prev = shift(torch.cummin(torch.where(mask, lr, math.inf), 1).values, math.inf)
            if include_one:
                prev = prev.clamp(max=0.0)
            return torch.where(count > 0, prev, torch.zeros_like(prev))
        if stat == "prod":
            return shift(torch.cumsum(lr, 1), 0.0)
        if stat == "geomean":
            total = shift(torch.cumsum(lr, 1), 0.0)
            denom = count + 1 if include_one else count
            return torch.where(denom > 0, total / denom.clamp(min=1), torch.zeros_like(total))
        lse = shift(torch.logcumsumexp(torch.where(mask, lr, -math.inf), 1), -math.inf)
        if include_one:
            return torch.logaddexp(lse, torch.zeros_like(lse)) - torch.log(count + 1)
        return torch.where(count > 0, lse - torch.log(count.clamp(min=1)), torch.zeros_like(lse))


def minpro_diagnostics(log_m: torch.Tensor, weight: torch.Tensor, mask: torch.Tensor) -> Stats:
    """MinPRO diagnostics (the paper's tables 7 and 8), detached 0-d tensors:

    ``m_mean``, ``m_median`` (lower median) of m_t = e^{log_m}; ``m_frac_above_{0.5,0.2,0.1,0.05}``; and
    ``weight_decile_{0..9}``: the mean effective weight over tokens whose relative position k/n_i (k = 0-based
    index among the row's n_i valid tokens) falls in that decile (0 for an empty decile).

    Args: log_m, weight: (N, T) float; mask: (N, T) bool.
    """
    with torch.no_grad():
        m = torch.exp(log_m.detach().float())
        count = mask.sum()
        stats: Stats = {"m_mean": masked_mean(m, mask)}
        flat = torch.where(mask, m, math.inf).flatten().sort().values
        if flat.numel():
            med = flat[((count - 1) // 2).clamp(min=0)]
            stats["m_median"] = torch.where(count > 0, med, torch.ones((), device=m.device))
        else:
            stats["m_median"] = torch.ones((), device=m.device)
        for thr in (0.5, 0.2, 0.1, 0.05):
            stats[f"m_frac_above_{thr}"] = masked_mean((m > thr).float(), mask)
        pos = torch.cumsum(mask, 1) - 1  # 0-based index among valid tokens
        n_i = mask.sum(1, keepdim=True).clamp(min=1)
        decile = torch.div(pos * 10, n_i, rounding_mode="floor").clamp(0, 9)
        decile = torch.where(mask, decile, torch.full_like(decile, 10)).flatten()  # bin 10 = masked
        w = torch.where(mask, weight.detach().float(), 0.0).flatten()
        sums = torch.zeros(11, device=w.device).index_add_(0, decile, w)
        cnts = torch.zeros(11, device=w.device).index_add_(0, decile, torch.ones_like(w))
        means = sums / cnts.clamp(min=1)
        for d in range(10):
            stats[f"weight_decile_{d}"] = means[d]
        return stats


def minpro(
    inputs: ObjectiveInputs,
    *,
    trunc_eps_low: float = 1.0,
    trunc_eps_high: float = 4.0,
    prefix_stat: PrefixStat = "min",
    include_one: bool = False,
    agg: Agg = "token-mean",
    ref_kl_coef: float = 0.0,
    entropy_coef: float = 0.0,
    rollout_correction: RolloutCorrection = "none",
    rollout_correction_cap: float = 2.0,
    rollout_correction_low: float = 0.5,
) -> tuple[torch.Tensor, Stats]:
    """MinPRO: the token's ratio scaled by the minimum ratio of its strictly preceding valid tokens.

        m_t = min_{j<t, j valid} ρ_j  (m = 1 on an empty prefix),  ℓ_t = −sg(clip(m_t·ρ_t, 1−ε_l, 1+ε_h))·A_t·logp_t

    ε_l = 1, ε_h = 4 (the paper's table). ``prefix_stat`` ∈ {min, mean, geomean, prod} swaps the statistic
    (ablation; ``prod`` gives the cumulative prefix ratio ρ_{1:t}); ``include_one`` adds an implicit ρ = 1 to the
    prefix. Stats add the diagnostics of :func:`minpro_diagnostics` , ``trunc_frac`` (m_t·ρ_t
    outside [1 − ε_l, 1 + ε_h]) and ``trunc_high_frac`` (above 1 + ε_h). ``trunc_eps_low`` / ``trunc_eps_high`` were
    ``clip_eps_low`` / ``clip_eps_high`` (deprecated aliases).
    """
    common = _common(agg, ref_kl_coef, entropy_coef)
    _check_eps("trunc_eps_low", trunc_eps_low, upper=1.0)
    _check_eps("trunc_eps_high", trunc_eps_high)
    prep = prepare(inputs, _rc(rollout_correction, rollout_correction_cap, rollout_correction_low))
    mask, lr = prep.mask, prep.log_ratio
    log_m = prefix_log_stat(lr, mask, prefix_stat, include_one=include_one)
    log_w = log_m + lr.detach()
    log_hi = math.log1p(trunc_eps_high)
    weight = torch.exp(log_w.clamp(max=log_hi)).clamp(min=1.0 - trunc_eps_low)
    per_token = -(weight * prep.adv) * prep.logp
    stats = _baseline_stats(lr, mask, inputs)
    with torch.no_grad():
        stats["trunc_high_frac"] = masked_mean((log_w > log_hi).float(), mask)
        stats["trunc_frac"] = masked_mean(((log_w > log_hi) | (torch.exp(log_w) < 1.0 - trunc_eps_low)).float(), mask)
        stats.update(minpro_diagnostics(log_m, weight, mask))
    return finish(per_token, inputs, prep, stats=stats, **common)


# ----------------------------------------------------------------------------------------------- recent objectives
# GMPO, SAPO, DPPO, TOPR, DRO, GPG, KL-Cov and Clip-Cov: the losses verl, prime-rl, ROLL and their papers run
# (docs/objectives.md gives each one's source). This project's convention throughout: lr_t = logp_t − anchor_t with
# the anchor π_b (the recorded rollout log-probs), or π_θold when a rollout correction is active; A is the sequence
# advantage broadcast over tokens; every loss is minimised.


def _row_adv(adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Ā_i = masked mean of A over row i's valid tokens, (N, 1) (0 for an empty row): the sequence advantage."""
    return adv.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)


def _valid_rows(prep: Prepared) -> torch.Tensor:
    """Rows with a valid token (0-d float): the default S of the per-sequence losses (GMPO)."""
    return prep.mask.any(-1).sum().float()


def gmpo(
    inputs: ObjectiveInputs,
    *,
    clip_eps_low: float = 0.4,
    clip_eps_high: float = 0.4,
    agg: Agg = "seq-mean-token-mean",
    ref_kl_coef: float = 0.0,
    entropy_coef: float = 0.0,
    rollout_correction: RolloutCorrection = "none",
    rollout_correction_cap: float = 2.0,
    rollout_correction_low: float = 0.5,
) -> tuple[torch.Tensor, Stats]:
    """GMPO (geometric-mean policy optimisation, arXiv 2507.20673; verl ``geo_mean``): the clipped token
    log-ratios are averaged along the sequence, so the sequence ratio is their geometric mean.

        s_t = sign(A_t) (sign(0) = 0), ĉ_t = clamp(lr_t, −ε_lo, ε_hi), c̃_t = s_t·min(s_t·lr_t, s_t·ĉ_t)
        L_i = Σ_t m·c̃_t / n_i,  R_i = exp(L_i),  ℓ_i = −Ā_i·R_i

    (A > 0 clips only upward, A < 0 only downward; a clipped token has no gradient). ℓ_i is written on each of row
    i's tokens and averaged by ``seq-mean-token-mean`` (the default): Σ_{i: n_i > 0} ℓ_i / S with S =
    ``inputs.num_seqs`` or this call's rows with a valid token, so micro-batches add up as GRPO's do. ε_lo = ε_hi =
    0.4 (the GMPO README and verl's example; the window is [e^{−0.4}, e^{0.4}]). Token-level rollout-correction
    weights enter as their mean over the row (verl: the geometric mean). Stats: clipfrac (out-of-window tokens
    with A ≠ 0), clipfrac_pos (A > 0), clipfrac_neg (A < 0), seq_ratio_mean.
    """
    _check_eps("clip_eps_low", clip_eps_low)
    _check_eps("clip_eps_high", clip_eps_high)
    common = _common(agg, ref_kl_coef, entropy_coef)
    prep = prepare(inputs, _rc(rollout_correction, rollout_correction_cap, rollout_correction_low))
    mask, lr, adv = prep.mask, prep.log_ratio, prep.adv
    zero = torch.zeros((), device=lr.device)
    above, below = lr > clip_eps_high, lr < -clip_eps_low
    c_pos = torch.where(above, torch.full((), clip_eps_high, device=lr.device), lr)
    c_neg = torch.where(below, torch.full((), -clip_eps_low, device=lr.device), lr)
    c = torch.where(adv > 0, c_pos, torch.where(adv < 0, c_neg, zero))
    c = torch.where(mask, c, zero)
    n_i = mask.sum(-1, keepdim=True).clamp(min=1)
    log_r = (c.sum(-1, keepdim=True) / n_i).clamp(-RATIO_LOG_CLAMP, RATIO_LOG_CLAMP)
    seq_ratio = torch.exp(log_r)  # (N, 1) with grad
    per_token = (-_row_adv(adv, mask) * seq_ratio).expand_as(mask)
    stats = _baseline_stats(prep.log_ratio, mask, inputs)
    with torch.no_grad():
        out = above | below
        pos = masked_mean((out & (adv > 0)).float(), mask)
        neg = masked_mean((out & (adv < 0)).float(), mask)
        rows = mask.any(-1)
        stats.update(clipfrac=pos + neg, clipfrac_pos=pos, clipfrac_neg=neg)
        stats["seq_ratio_mean"] = masked_mean(seq_ratio.detach()[:, 0], rows)
    num_seqs = None if inputs.num_seqs is not None else _valid_rows(prep)
    return finish(per_token, inputs, prep, stats=stats, num_seqs=num_seqs, **common)


def sapo(
    inputs: ObjectiveInputs,
    *,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    agg: Agg = "seq-mean-token-mean",
    ref_kl_coef: float = 0.0,
    entropy_coef: float = 0.0,
    rollout_correction: RolloutCorrection = "none",
    rollout_correction_cap: float = 2.0,
    rollout_correction_low: float = 0.5,
) -> tuple[torch.Tensor, Stats]:
    """SAPO (soft adaptive policy optimisation, arXiv 2511.20347; verl ``sapo``): a sigmoid gate instead of a clip.

        r_t = exp(clamp(lr_t, ±20)),  τ_t = τ_pos if A_t > 0 else τ_neg,  ℓ_t = −σ(τ_t·(r_t − 1))·(4/τ_t)·A_t

    No stop-gradient and no clip: ∂ℓ_t/∂logp_t = −A_t·4σ(1 − σ)·r_t, which is −A_t at r = 1 and decays smoothly as
    |r − 1| grows. The loss VALUE at r = 1 is −2A/τ, not −A. τ_pos = 1, τ_neg = 1.05 (verl, SkyRL, AReaL);
    ``seq-mean-token-mean`` as in the paper and verl. Stats: soft_gate_mean (mean 4σ(1 − σ), the gradient's gate).
    """
    if not (tau_pos > 0 and tau_neg > 0):
        raise ObjectiveError(f"tau_pos and tau_neg must be > 0, got {tau_pos} and {tau_neg}")
    common = _common(agg, ref_kl_coef, entropy_coef)
    prep = prepare(inputs, _rc(rollout_correction, rollout_correction_cap, rollout_correction_low))
    mask, lr, adv = prep.mask, prep.log_ratio, prep.adv
    ratio = torch.exp(lr.clamp(-20.0, 20.0))
    tau = torch.where(adv > 0, torch.full((), tau_pos, device=lr.device), torch.full((), tau_neg, device=lr.device))
    gate = torch.sigmoid(tau * (ratio - 1.0))
    per_token = -gate * (4.0 / tau) * adv
    stats = _baseline_stats(lr, mask, inputs)
    with torch.no_grad():
        stats["soft_gate_mean"] = masked_mean(4 * gate.detach() * (1 - gate.detach()), mask)
    return finish(per_token, inputs, prep, stats=stats, **common)


def dppo(
    inputs: ObjectiveInputs,
    *,
    mask_low: float = 0.2,
    mask_high: float = 0.2,
    adv_tau: float = 1.0,
    kl_tau: float = 1e-3,
    agg: Agg = "token-mean",
    ref_kl_coef: float = 0.0,
    entropy_coef: float = 0.0,
    rollout_correction: RolloutCorrection = "none",
    rollout_correction_cap: float = 2.0,
    rollout_correction_low: float = 0.5,
) -> tuple[torch.Tensor, Stats]:
    """DPPO-Binary-TV with a squared log-ratio term, prime-rl's default loss (arXiv 2602.04879 + Kimi K2.5).

        Δ_t = exp(logp_t) − exp(anchor_t)   (a difference of PROBABILITIES, not a ratio)
        masked_t = (Δ_t > δ_high) if A_t > 0 else (Δ_t < −δ_low),  keep_t = m_t ∧ ¬masked_t
        ℓ_t = −keep_t·adv_tau·A_t·ρ_t + kl_tau·m_t·lr_t²

    ρ carries the gradient (not detached; exp(clamp(lr, ±80))). Masked tokens keep their squared-log-ratio term
    and still count in the token-mean. δ_low = δ_high = 0.2, adv_tau = 1, kl_tau = 1e-3 (prime-rl
    ``DefaultLossConfig``). Stats: masked_frac, masked_low_frac (A ≤ 0 side), masked_high_frac (A > 0 side).
    """
    for key, value in (("mask_low", mask_low), ("mask_high", mask_high), ("adv_tau", adv_tau), ("kl_tau", kl_tau)):
        if not value >= 0:
            raise ObjectiveError(f"{key} must be >= 0, got {value}")
    common = _common(agg, ref_kl_coef, entropy_coef)
    prep = prepare(inputs, _rc(rollout_correction, rollout_correction_cap, rollout_correction_low))
    mask, lr, adv = prep.mask, prep.log_ratio, prep.adv
    with torch.no_grad():
        delta = torch.exp(prep.logp.detach()) - torch.exp(prep.rollout_logp)
        high, low = delta > mask_high, delta < -mask_low
        masked = torch.where(adv > 0, high, low) & mask
    ratio = torch.exp(lr.clamp(-RATIO_LOG_CLAMP, RATIO_LOG_CLAMP))
    pg = torch.where(masked, torch.zeros((), device=lr.device), -adv_tau * adv * ratio)
    per_token = pg + kl_tau * lr * lr
    stats = _baseline_stats(lr, mask, inputs)
    with torch.no_grad():
        stats["masked_frac"] = masked_mean(masked.float(), mask)
        stats["masked_low_frac"] = masked_mean((masked & (adv <= 0)).float(), mask)
        stats["masked_high_frac"] = masked_mean((masked & (adv > 0)).float(), mask)
    return finish(per_token, inputs, prep, stats=stats, **common)


def topr(
    inputs: ObjectiveInputs,
    *,
    agg: Agg = "seq-mean-token-mean",
    ref_kl_coef: float = 0.0,
    entropy_coef: float = 0.0,
    rollout_correction: RolloutCorrection = "none",
    rollout_correction_cap: float = 2.0,
    rollout_correction_low: float = 0.5,
) -> tuple[torch.Tensor, Stats]:
    """TOPR (tapered off-policy REINFORCE, arXiv 2503.14286), the paper's SEQUENCE form with the advantage as score:

        c_i = 1 if Ā_i ≥ 0,  else sg(exp(min(0, Σ_t m·lr_t)))  (= sg(min(1, π_θ(y_i)/π_b(y_i))))
        ℓ_t = −c_i·A_t·logp_t

    Positive sequences get a plain SFT-like push; negative ones are pushed down with their truncated sequence
    ratio. No hyper-parameter; ``seq-mean-token-mean`` (ROLL's default; the paper fixes no length normalisation).
    The public implementations (ROLL, Trinity-RFT) use a per-token ratio against π_old instead.
    Stats: neg_weight_mean (mean c_i over negative rows, 1 when none), neg_frac (tokens in negative rows).
    """
    common = _common(agg, ref_kl_coef, entropy_coef)
    prep = prepare(inputs, _rc(rollout_correction, rollout_correction_cap, rollout_correction_low))
    mask, lr, adv = prep.mask, prep.log_ratio, prep.adv
    with torch.no_grad():
        seq_lr = lr.detach().sum(-1, keepdim=True)
        neg = _row_adv(adv, mask) < 0  # (N, 1)
        weight = torch.where(neg, torch.exp(seq_lr.clamp(max=0.0)), torch.ones((), device=lr.device))
    per_token = -(weight * adv) * prep.logp
    stats = _baseline_stats(lr, mask, inputs)
    with torch.no_grad():
        neg_rows = neg[:, 0] & mask.any(-1)
        stats["neg_weight_mean"] = torch.where(
            neg_rows.any(), masked_mean(weight[:, 0], neg_rows), torch.ones((), device=lr.device)
        )
        stats["neg_frac"] = masked_mean(neg.expand_as(mask).float(), mask)
    return finish(per_token, inputs, prep, stats=stats, **common)


def dro(
    inputs: ObjectiveInputs,
    *,
    beta: float | None = None,
    agg: Agg = "token-mean",
    ref_kl_coef: float = 0.0,
    entropy_coef: float = 0.0,
    rollout_correction: RolloutCorrection = "none",
    rollout_correction_cap: float = 2.0,
    rollout_correction_low: float = 0.5,
) -> tuple[torch.Tensor, Stats]:
    """DRO / the Kimi-1.5 squared-log-ratio loss, token level (verl ``dro``, ROLL ``kimi15``):

        ℓ_t = −(A_t·logp_t − ½·β·lr_t²),   ∂ℓ_t/∂logp_t = −(A_t − β·lr_t)

    ``beta`` has NO default (verl raises too): missing or ≤ 0 is a one-line error. (ROLL's ``kimi15_tau`` is
    the same β, default 0.1.) With lr ≡ 0 it is REINFORCE, −A·logp. Token-mean. Stats: sq_log_ratio (mean lr²).
    """
    if beta is None or not beta > 0:
        raise ObjectiveError(f"dro: beta must be set and > 0 (it has no default), got {beta}")
    common = _common(agg, ref_kl_coef, entropy_coef)
    prep = prepare(inputs, _rc(rollout_correction, rollout_correction_cap, rollout_correction_low))
    mask, lr, adv = prep.mask, prep.log_ratio, prep.adv
    per_token = -(adv * prep.logp - 0.5 * beta * lr * lr)
    stats = _baseline_stats(lr, mask, inputs)
    with torch.no_grad():
        stats["sq_log_ratio"] = masked_mean(lr.detach() ** 2, mask)
    return finish(per_token, inputs, prep, stats=stats, **common)


def gpg(
    inputs: ObjectiveInputs,
    *,
    agg: Agg = "token-mean",
    ref_kl_coef: float = 0.0,
    entropy_coef: float = 0.0,
    rollout_correction: RolloutCorrection = "none",
    rollout_correction_cap: float = 2.0,
    rollout_correction_low: float = 0.5,
) -> tuple[torch.Tensor, Stats]:
    """GPG (group policy gradient, arXiv 2504.02546; verl ``gpg``): plain REINFORCE, no ratio, no clip.

        ℓ_t = −A_t·logp_t

    Token-mean. GPG's own advantage (α-scaled, no std normalisation) is data-side; any advantage works here.
    On-policy it IS the policy gradient; off-policy it ignores the mismatch (a rollout correction can weight it).
    """
    common = _common(agg, ref_kl_coef, entropy_coef)
    prep = prepare(inputs, _rc(rollout_correction, rollout_correction_cap, rollout_correction_low))
    per_token = -prep.adv * prep.logp
    stats = _baseline_stats(prep.log_ratio, prep.mask, inputs)
    return finish(per_token, inputs, prep, stats=stats, **common)


def _covariance(logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Cov_t = (A_t − Ā)·(sg(logp_t) − mean sg(logp)), the means over this call's valid tokens (detached, (N, T))."""
    with torch.no_grad():
        lp = logp.detach()
        return (adv - masked_mean(adv, mask)) * (lp - masked_mean(lp, mask))


def kl_cov(
    inputs: ObjectiveInputs,
    *,
    ratio: float = 2e-4,
    beta: float = 0.1,
    agg: Agg = "token-mean",
    ref_kl_coef: float = 0.0,
    entropy_coef: float = 0.0,
    rollout_correction: RolloutCorrection = "none",
    rollout_correction_cap: float = 2.0,
    rollout_correction_low: float = 0.5,
) -> tuple[torch.Tensor, Stats]:
    """KL-Cov (Cui et al., arXiv 2505.22617; verl ``kl_cov``): a |log-ratio| penalty on the tokens whose
    log-probability covaries most with the advantage (the entropy-collapsing ones). No clip.

        ℓ_t = −A_t·ρ_t (+ β·|lr_t| on the top k = max(1, ⌊N·ratio⌋) tokens by Cov_t)
        Cov_t = (A_t − Ā)·(sg(logp_t) − mean sg(logp))   (means over this call's N valid tokens)

    ratio = 2e-4, β = 0.1 (verl; the paper's recipes use β = 1). Token-mean. Stats: cov_selected_frac,
    cov_mean (mean Cov over valid tokens).
    """
    if not 0 <= ratio <= 1:
        raise ObjectiveError(f"ratio must be in [0, 1], got {ratio}")
    if not beta >= 0:
        raise ObjectiveError(f"beta must be >= 0, got {beta}")
    common = _common(agg, ref_kl_coef, entropy_coef)
    prep = prepare(inputs, _rc(rollout_correction, rollout_correction_cap, rollout_correction_low))
    mask, lr, adv = prep.mask, prep.log_ratio, prep.adv
    cov = _covariance(prep.logp, adv, mask)
    n_valid = int(mask.sum())
    chosen = torch.zeros_like(mask)
    if n_valid > 0:
        k = max(1, int(n_valid * ratio))
        flat = torch.where(mask, cov, torch.full((), -math.inf, device=cov.device)).flatten()
        chosen.view(-1)[torch.topk(flat, k).indices] = True
    ratio_t = torch.exp(lr.clamp(-RATIO_LOG_CLAMP, RATIO_LOG_CLAMP))
    per_token = -adv * ratio_t + torch.where(chosen, beta * lr.abs(), torch.zeros((), device=lr.device))
    stats = _baseline_stats(lr, mask, inputs)
    with torch.no_grad():
        stats["cov_selected_frac"] = masked_mean(chosen.float(), mask)
        stats["cov_mean"] = masked_mean(cov, mask)
    return finish(per_token, inputs, prep, stats=stats, **common)


def clip_cov(
    inputs: ObjectiveInputs,
    *,
    ratio: float = 2e-4,
    cov_low: float = 1.0,
    cov_high: float = 5.0,
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.2,
    choice_seed: int = 0,
    agg: Agg = "token-mean",
    ref_kl_coef: float = 0.0,
    entropy_coef: float = 0.0,
    rollout_correction: RolloutCorrection = "none",
    rollout_correction_cap: float = 2.0,
    rollout_correction_low: float = 0.5,
) -> tuple[torch.Tensor, Stats]:
    """Clip-Cov (Cui et al., arXiv 2505.22617; verl ``clip_cov``): the PPO clip, plus a few random tokens in a
    covariance band lose their loss and gradient.

        L1_t = −A_t·ρ_t, L2_t = −A_t·clip(ρ_t, 1 − ε_lo, 1 + ε_hi), P = {t: L2_t > L1_t} (PPO-clipped)
        K = {t valid, t ∉ P, cov_low < Cov_t < cov_high},  k = max(1, ⌊N·ratio⌋)
        choose min(k, |K|) tokens of K uniformly at random;  ℓ_t = max(L1_t, L2_t)·1[t not chosen]

    (no dual clip; chosen tokens stay in the token-mean's denominator). The random choice uses a
    ``torch.Generator`` seeded from ``choice_seed`` and the step's data (the recorded log-probs of this call),
    never the global RNG: the same run reproduces, and successive steps draw differently. ratio = 2e-4, band (1, 5),
    ε = 0.2 (verl). Stats: clipfrac (PPO clip), cov_clipped_frac (the chosen tokens).
    """
    _check_eps("clip_eps_low", clip_eps_low, upper=1.0)
    _check_eps("clip_eps_high", clip_eps_high)
    if not 0 <= ratio <= 1:
        raise ObjectiveError(f"ratio must be in [0, 1], got {ratio}")
    if not cov_low < cov_high:
        raise ObjectiveError(f"cov_low must be < cov_high, got {cov_low} and {cov_high}")
    common = _common(agg, ref_kl_coef, entropy_coef)
    prep = prepare(inputs, _rc(rollout_correction, rollout_correction_cap, rollout_correction_low))
    mask, lr, adv = prep.mask, prep.log_ratio, prep.adv
    per_token, was_clipped = clipped_surrogate(lr, adv, clip_eps_low, clip_eps_high)
    cov = _covariance(prep.logp, adv, mask)
    band = mask & ~was_clipped & (cov > cov_low) & (cov < cov_high)
    chosen = torch.zeros_like(mask)
    n_valid, n_band = int(mask.sum()), int(band.sum())
    if n_valid > 0 and n_band > 0:
        k = min(max(1, int(n_valid * ratio)), n_band)
        data_key = int(torch.where(mask, prep.rollout_logp, 0.0).double().sum().mul(1e6).round().item()) % (2**31)
        gen = torch.Generator(device="cpu").manual_seed((choice_seed * 1_000_003 + data_key) % (2**63 - 1))
        pick = torch.randperm(n_band, generator=gen)[:k].to(band.device)
        chosen.view(-1)[band.flatten().nonzero()[:, 0][pick]] = True
    stats = _baseline_stats(lr, mask, inputs)
    stats["clipfrac"] = masked_mean(was_clipped.float(), mask)
    stats["cov_clipped_frac"] = masked_mean(chosen.float(), mask)
    return finish(per_token, inputs, prep, stats=stats, extra_mask=~chosen, **common)
