"""P3O, its two-anchor variant, and the two off-policy objectives it is measured against most closely: MinPRO
(the minimum prefix ratio) and M2PO (second-moment masking, and the public code's form: its threshold as a PPO clip).

Each objective is written as its policy term over the prepared micro-batch (N sequences, T tokens) and its own
keywords; :func:`p3o.objectives.shared.with_shared` wraps it in the rollout correction, the reference-KL and entropy
terms and the aggregation every objective shares, so the module-level name is the whole objective,
``fn(inputs, **hyper) -> (loss, stats)``. Usage::

    loss, stats = p3o(ObjectiveInputs(logp, rollout_logp, mask, advantages), scope="micro-batch")

The maths is in docs/objectives.md; the symbols are those of the P3O paper (Eq. 12) and the MinPRO paper.
"""

from __future__ import annotations

import math
from typing import Literal, get_args

import torch

from p3o.objectives.core import (
    KL_CLAMP,
    KL_ESTIMATORS,
    RATIO_LOG_CLAMP,
    EssScope,
    KlEstimator,
    ObjectiveError,
    PolicyTerm,
    Prepared,
    _ess,
    baseline_stats,
    check_eps,
    k3,
    kl_estimate,
    masked_mean,
    ratio_stats,
    side_logp,
)
from p3o.objectives.shared import Stats, with_shared

PrefixStat = Literal["min", "mean", "geomean", "prod"]
PREFIX_STATS: tuple[str, ...] = get_args(PrefixStat)
PrefixScope = Literal["preceding", "including"]
PREFIX_SCOPES: tuple[str, ...] = get_args(PrefixScope)
TwoAnchorVariant = Literal["sum", "mixture"]
P3oCap = Literal["ess", "clip"]
P3O_CAPS: tuple[str, ...] = get_args(P3oCap)
P3oKlAnchor = Literal["behaviour", "proximal"]
P3O_KL_ANCHORS: tuple[str, ...] = get_args(P3oKlAnchor)
# capped_frac counts ρ_t > e_B beyond float noise: on-policy, fp32 ratios sit ~1e-7 either side of an ESS of 1.
CAP_TOL = 1e-5


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


@with_shared()
def p3o(
    prep: Prepared,
    *,
    scope: EssScope = "micro-batch",
    kl_estimator: KlEstimator = "k3",
    cap: P3oCap = "ess",
    cap_eps: float = 0.2,
    kl_anchor: P3oKlAnchor = "behaviour",
    kl_clamp: float = KL_CLAMP,
) -> PolicyTerm:
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
    lr = prep.log_ratio
    ess, degenerate = _p3o_ess(prep, scope)
    if cap == "clip":
        check_eps("cap_eps", cap_eps, upper=1.0)
    kl_lr = _kl_log_ratio(prep, kl_anchor)
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
    stats = _p3o_stats(prep, ess, degenerate, scope=scope, cap=cap, cap_eps=cap_eps, kl_clamp=kl_clamp, kl_lr=kl_lr)
    return PolicyTerm(per_token, stats)


def _p3o_ess(prep: Prepared, scope: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(e_B, degenerate flag) of P3O's ``scope``: ``inputs.step_ess`` for ``step`` (0-d), else the ESS of the
    (N, T) log-ratio over the micro-batch (0-d, all-reduced over ``inputs.group``) or per ``sequence`` ((N, 1))."""
    lr, inputs = prep.log_ratio, prep.inputs
    if scope == "step":
        if inputs.step_ess is None:
            raise ObjectiveError('p3o scope="step" needs ObjectiveInputs.step_ess (the step\'s precomputed ESS)')
        ess = torch.as_tensor(inputs.step_ess, dtype=torch.float32, device=lr.device).detach().reshape(())
        return ess, torch.zeros((), dtype=torch.bool, device=lr.device)
    return _ess(lr, prep.mask, inputs.group, scope)


def _kl_log_ratio(prep: Prepared, kl_anchor: str) -> torch.Tensor | None:
    """The (N, T) log-ratio P3O's KL term is taken on, with gradient: None for ``behaviour`` (the ratio's own
    anchor), logp − prox_logp (0 at masked positions) for ``proximal``."""
    if kl_anchor == "proximal":
        prox = side_logp(prep.inputs, "prox_logp", prep.mask, needed_by='kl_anchor="proximal"')
        return torch.where(prep.mask, prep.logp - prox, torch.zeros_like(prox))
    if kl_anchor == "behaviour":
        return None
    raise ObjectiveError(f"kl_anchor: unknown value {kl_anchor!r}; valid: {', '.join(P3O_KL_ANCHORS)}")


def _p3o_stats(
    prep: Prepared,
    ess: torch.Tensor,
    degenerate: torch.Tensor,
    *,
    scope: str,
    cap: str,
    cap_eps: float,
    kl_clamp: float,
    kl_lr: torch.Tensor | None,
) -> Stats:
    """P3O's diagnostics (listed in :func:`p3o`'s docstring), detached 0-d tensors."""
    mask = prep.mask
    with torch.no_grad():
        lr_d = prep.log_ratio.detach()
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
    return stats


@with_shared()
def p3o_two_anchor(prep: Prepared, *, variant: TwoAnchorVariant = "sum", kl_clamp: float = KL_CLAMP) -> PolicyTerm:
    """Two-anchor P3O (paper App. D, reconstructed from the authors' code): anchors π_b and π_prox.

        ρ^b = π_θ/π_b, ρ^p = π_θ/π_prox, e_b = ESS(ρ^b), e_p = ESS(ρ^p), e_mix = min(e_b, e_p)
        ℓ_t = − sg(min(ρ^b_t, e_mix))·A_t·logp_t + KL terms
        variant "sum":     (1 − e_b)·KL_t(π_θ‖π_b) + (1 − e_p)·KL_t(π_θ‖π_prox)
        variant "mixture": (1 − e_mix)·KL_t(π_θ‖π_mix),  π_mix ∝ (1−e_b)·π_b + (1−e_p)·π_prox (per token)

    Needs ``inputs.prox_logp`` (N, T). KL_t is the k3 form. The paper reports that it collapsed in its runs.
    """
    if variant not in ("sum", "mixture"):
        raise ObjectiveError(f"variant: unknown value {variant!r}; valid: sum, mixture")
    mask, lr_b = prep.mask, prep.log_ratio
    prox = side_logp(prep.inputs, "prox_logp", mask, needed_by="p3o_two_anchor")
    lr_p = prep.logp - prox
    e_b, bad_b = _ess(lr_b, mask, prep.inputs.group)
    e_p, bad_p = _ess(lr_p, mask, prep.inputs.group)
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
    return PolicyTerm(per_token, stats)


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


@with_shared()
def m2po(prep: Prepared, *, tau: float = 0.04) -> PolicyTerm:
    """M2PO (second-moment trust policy optimisation): no clip, mask the tokens with the largest lr².

        M_t = 1[lr_t² < threshold],   ℓ_t = −M_t·ρ_t·A_t   (gradient through ρ)

    divided by the ORIGINAL valid-token count (masked tokens stay in the denominator). The threshold is
    ``inputs.m2po_threshold`` (step-level, see :func:`m2po_threshold`) or, when None, this batch's own.
    Stats: masked_frac, m2 (mean lr² before masking).
    """
    if not tau > 0:
        raise ObjectiveError(f"tau must be > 0, got {tau}")
    mask, lr = prep.mask, prep.log_ratio
    if prep.inputs.m2po_threshold is None:
        thr = m2po_threshold(lr, mask, tau)
    else:
        thr = torch.as_tensor(prep.inputs.m2po_threshold, dtype=torch.float32, device=lr.device).reshape(())
    v = lr.detach() ** 2
    keep = v < thr
    ratio = torch.exp(lr.clamp(-RATIO_LOG_CLAMP, RATIO_LOG_CLAMP))
    per_token = -prep.adv * ratio
    stats = baseline_stats(prep)
    stats["masked_frac"] = masked_mean((~keep).float(), mask)
    stats["m2"] = masked_mean(v, mask)
    return PolicyTerm(per_token, stats, extra_mask=keep)


def m2po_clip_bounds(
    log_ratio: torch.Tensor,
    mask: torch.Tensor,
    adv: torch.Tensor,
    tau: float = 0.04,
    floor_low: float = 0.3,
    floor_high: float = 0.5,
) -> tuple[float, float, float]:
    """The clip range (ε_l, ε_h) of M2PO's public code (Infini-AI-Lab/M2PO, ``compute_m2po_policy_loss``) and the
    second moment it starts from, all Python floats.

    Only the "harmful" tokens count: H = {valid t: A_t > 0 and lr_t > 0, or A_t < 0 and lr_t < 0}, v_t = lr_t².
    If H is empty or M̂2 = mean_H v ≤ τ nothing is constrained (ε_l = 1, ε_h = +inf). Otherwise, with v sorted
    ascending (v_(0) ≤ … ≤ v_(n−1)), k is the first index whose cap reaches the budget,
    Σ_{j≤k} v_(j) + (n − k − 1)·v_(k) ≥ τ·n, and the cap is c = v_(k−1)^{1/2} (c = 0 when k = 0): the largest
    sorted value at which capping |lr| keeps the harmful tokens' M2 under τ. Then

        ε_l = max(1 − e^{−c}, floor_low),   ε_h = max(e^{c} − 1, floor_high)        (code defaults 0.3 / 0.5)

    Returns (ε_l, ε_h, M̂2 of the harmful tokens; 0 when there are none).
    """
    assert log_ratio.shape == mask.shape == adv.shape, (log_ratio.shape, mask.shape, adv.shape)
    with torch.no_grad():
        lr = log_ratio.detach().double()
        harm = mask & (((adv > 0) & (lr > 0)) | ((adv < 0) & (lr < 0)))
        v = torch.sort(lr[harm] ** 2).values
        n = v.numel()
        if n == 0:
            return 1.0, math.inf, 0.0
        m2 = float(v.mean())
        if m2 <= tau:
            return 1.0, math.inf, m2
        csum = torch.cumsum(v, 0)
        capped = csum + v * (n - 1 - torch.arange(n, dtype=v.dtype, device=v.device))
        k = int(torch.argmax((capped >= tau * n).to(torch.uint8)))
        cap = 0.0 if k == 0 else math.sqrt(float(v[k - 1]))
        return max(1.0 - math.exp(-cap), floor_low), max(math.expm1(cap), floor_high), m2


@with_shared()
def m2po_clip(prep: Prepared, *, tau: float = 0.04, floor_low: float = 0.3, floor_high: float = 0.5) -> PolicyTerm:
    """M2PO as its public code runs it (and as the MinPRO paper describes M2PO: hard clipping): the second-moment
    budget τ sets ONE clip range for this call's tokens (:func:`m2po_clip_bounds`), applied as a PPO clip

        ℓ_t = − min(ρ_t·A_t, clip(ρ_t, 1 − ε_l, 1 + ε_h)·A_t)   (gradient through ρ; no dual clip)

    where :func:`m2po` (the M2PO paper's form) masks the tokens with the largest lr² instead. The range is computed
    per call (one micro-batch, as verl calls its loss), so its ``coupling`` is ``batch``. τ = 0.04, floors 0.3 / 0.5
    (the code's ``miniclip_low`` / ``miniclip_high`` defaults). Token-mean. Stats: clipfrac, m2po_bound (1 when the
    budget binds this call, 0 when M̂2 ≤ τ leaves it unconstrained), m2po_eps_low, m2po_eps_high (inf reported as
    1e6), m2 (M̂2 of the harmful tokens).
    """
    if not tau > 0:
        raise ObjectiveError(f"tau must be > 0, got {tau}")
    if not (0 <= floor_low <= 1 and floor_high >= 0):
        raise ObjectiveError(f"floor_low must be in [0, 1] and floor_high >= 0, got {floor_low} and {floor_high}")
    mask, lr, adv = prep.mask, prep.log_ratio, prep.adv
    eps_low, eps_high, m2 = m2po_clip_bounds(lr, mask, adv, tau, floor_low, floor_high)
    ratio = torch.exp(lr.clamp(-RATIO_LOG_CLAMP, RATIO_LOG_CLAMP))
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    per_token = torch.maximum(unclipped, clipped)
    stats = baseline_stats(prep)
    with torch.no_grad():
        stats["clipfrac"] = masked_mean((clipped > unclipped).float(), mask)
        stats["m2po_eps_low"] = torch.tensor(eps_low, device=lr.device)
        stats["m2po_eps_high"] = torch.tensor(min(eps_high, 1e6), device=lr.device)
        stats["m2po_bound"] = torch.tensor(float(math.isfinite(eps_high)), device=lr.device)
        stats["m2"] = torch.tensor(m2, device=lr.device)
    return PolicyTerm(per_token, stats)


# ----------------------------------------------------------------------------------------------- MinPRO


def prefix_log_stat(
    log_ratio: torch.Tensor,
    mask: torch.Tensor,
    stat: str = "min",
    *,
    include_one: bool = False,
    including: bool = False,
) -> torch.Tensor:
    """log of a statistic of each row's prefix ratios (detached, (N, T)).

    The prefix is the STRICTLY preceding valid tokens j < t (``including=False``: MinPRO's m_t, multiplied by ρ_t
    afterwards) or the valid tokens j ≤ t, the current one included (``including=True``: the MinPRO paper's
    ablation, whose statistic is the whole weight). ``min``: min_j ρ_j (cumulative min of lr; masked positions count
    as +inf); ``mean``: the arithmetic mean of the ρ_j (log-cum-sum-exp); ``geomean``: exp(mean lr_j); ``prod``:
    Π_j ρ_j (strict: m_t·ρ_t is the exact cumulative prefix ratio ρ_{1:t}; including: it is ρ_{1:t} itself).
    An empty prefix gives 1. ``include_one``: the prefix also holds an implicit ρ = 1 (min: min(1, ·); mean /
    geomean: one more term; prod: unchanged).
    """
    if stat not in PREFIX_STATS:
        raise ObjectiveError(f"prefix_stat: unknown value {stat!r}; valid: {', '.join(PREFIX_STATS)}")
    with torch.no_grad():
        lr = torch.where(mask, log_ratio.detach().float(), torch.zeros((), device=log_ratio.device))
        n, t = lr.shape
        if t == 0:
            return lr

        def shift(x: torch.Tensor, fill: float) -> torch.Tensor:
            if including:
                return x
            return torch.cat([torch.full((n, 1), fill, device=x.device, dtype=x.dtype), x[:, :-1]], dim=1)

        count = shift(torch.cumsum(mask, 1).float(), 0.0)  # number of valid tokens in the prefix
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


@with_shared()
def minpro(
    prep: Prepared,
    *,
    trunc_eps_low: float = 1.0,
    trunc_eps_high: float = 4.0,
    prefix_stat: PrefixStat = "min",
    include_one: bool = False,
    prefix_scope: PrefixScope = "preceding",
) -> PolicyTerm:
    """MinPRO: the token's ratio scaled by the minimum ratio of its strictly preceding valid tokens.

        m_t = min_{j<t, j valid} ρ_j  (m = 1 on an empty prefix),  ℓ_t = −sg(clip(m_t·ρ_t, 1−ε_l, 1+ε_h))·A_t·logp_t

    ε_l = 1, ε_h = 4 (the paper's table). The weight never carries gradient (sg, as in CISPO): ∂ℓ_t/∂logp_t =
    −w_t·A_t. ``prefix_stat`` ∈ {min, mean, geomean, prod} swaps the statistic. ``prefix_scope``:

    * ``"preceding"`` (default): w_t = clip(S(ρ_{j<t})·ρ_t) — the statistic over the strictly earlier tokens times
      the current ratio (MinPRO itself with ``min``; ``prod`` gives ρ_{1:t});
    * ``"including"``: w_t = clip(S(ρ_1 … ρ_t)) — the MinPRO paper's prefix-statistic ablation (section 5.3), where
      the statistic of the prefix, the current token included, REPLACES the whole weight m_t·ρ_t: (1/t)·Σ_{i≤t} ρ_i,
      (Π_{i≤t} ρ_i)^{1/t}, Π_{i≤t} ρ_i (the last equals ``preceding``'s prod), with the same clip and the same
      stop-gradient. Its diagnostic factor m_t is reported as w_t/ρ_t before the clip (what multiplies ρ_t).

    ``include_one`` adds an implicit ρ = 1 to the prefix. Stats add the diagnostics of :func:`minpro_diagnostics`,
    ``trunc_frac`` (the unclipped weight outside [1 − ε_l, 1 + ε_h]) and ``trunc_high_frac`` (above 1 + ε_h).
    ``trunc_eps_low`` / ``trunc_eps_high`` were ``clip_eps_low`` / ``clip_eps_high`` (deprecated aliases).
    """
    check_eps("trunc_eps_low", trunc_eps_low, upper=1.0)
    check_eps("trunc_eps_high", trunc_eps_high)
    if prefix_scope not in PREFIX_SCOPES:
        raise ObjectiveError(f"prefix_scope: unknown value {prefix_scope!r}; valid: {', '.join(PREFIX_SCOPES)}")
    mask, lr = prep.mask, prep.log_ratio
    including = prefix_scope == "including"
    log_s = prefix_log_stat(lr, mask, prefix_stat, include_one=include_one, including=including)
    if including:
        log_w = log_s
        log_m = torch.where(mask, log_s - lr.detach(), torch.zeros((), device=lr.device))
    else:
        log_m = log_s
        log_w = log_m + lr.detach()
    log_hi = math.log1p(trunc_eps_high)
    weight = torch.exp(log_w.clamp(max=log_hi)).clamp(min=1.0 - trunc_eps_low)
    per_token = -(weight * prep.adv) * prep.logp
    stats = baseline_stats(prep)
    with torch.no_grad():
        stats["trunc_high_frac"] = masked_mean((log_w > log_hi).float(), mask)
        stats["trunc_frac"] = masked_mean(((log_w > log_hi) | (torch.exp(log_w) < 1.0 - trunc_eps_low)).float(), mask)
        stats.update(minpro_diagnostics(log_m, weight, mask))
    return PolicyTerm(per_token, stats)
