"""Shared pieces of every objective: the inputs dataclass, token aggregation, the ESS and the extra terms.

Usage: ``loss = reduce_tokens(per_token, mask, "token-mean", num_tokens=step_tokens)``.

Shape legend: N sequences, T response tokens. Every log-ratio is set to 0 at masked positions *before* any
``exp`` and masking always uses ``torch.where`` (never a multiplication), so NaN/inf stored at masked positions
can neither reach the loss nor the gradient.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch
import torch.distributed as dist

from p3o.errors import ConfigError

Agg = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
EssScope = Literal["micro-batch", "step", "sequence"]
RolloutCorrection = Literal[
    "none", "token-tis", "seq-mis", "token-icepop", "seq-tis", "geo-rs", "seq-max-k2", "seq-max-k3"
]
KlEstimator = Literal["k3", "k3_is", "k2", "none"]
AGG_MODES: tuple[str, ...] = get_args(Agg)
ESS_SCOPES: tuple[str, ...] = get_args(EssScope)
ROLLOUT_CORRECTIONS: tuple[str, ...] = get_args(RolloutCorrection)
ROW_REJECTIONS: tuple[str, ...] = ("geo-rs", "seq-max-k2", "seq-max-k3")
"""Rollout corrections that reject whole rows: rejected rows LEAVE the loss denominators (and the ESS)."""
KL_ESTIMATORS: tuple[str, ...] = get_args(KlEstimator)
BAND = 0.2  # band_frac counts tokens with |ρ − 1| > BAND: the same statistic for every objective
KL_CLAMP = 20.0  # |lr| bound inside exp(-lr) of the k3 estimator: e^20 ~ 4.9e8 keeps every KL_t finite in float32
RATIO_LOG_CLAMP = 80.0  # lr bound inside exp(lr) where ρ carries gradient: e^80 ~ 5.5e34 keeps ρ·A finite in float32


class ObjectiveError(ConfigError, ValueError):
    """A bad objective name, keyword or option value (one line naming it); both a ConfigError and a ValueError."""


def check_eps(name: str, value: float, *, upper: float | None = None) -> None:
    """A clip / truncation width ``name`` must be >= 0 (and <= ``upper`` when given), else ObjectiveError."""
    if not (value >= 0) or (upper is not None and value > upper):
        bound = f"[0, {upper}]" if upper is not None else ">= 0"
        raise ObjectiveError(f"{name} must be {bound}, got {value}")


@dataclass
class ObjectiveInputs:
    """Everything an objective reads for one micro-batch. Only ``logp`` carries gradient.

    Shape legend: N sequences, T response tokens (right-padded).
    """

    logp: torch.Tensor
    """(N, T) float: log π_θ(y_t | ·) of the current policy; requires grad."""
    rollout_logp: torch.Tensor
    """(N, T) float: log π_b(y_t | ·) recorded by the rollout engine at sampling time (no grad)."""
    mask: torch.Tensor
    """(N, T) bool: True = a valid response token that counts."""
    advantages: torch.Tensor
    """(N,) or (N, T) float: detached advantages, broadcast over tokens when (N,)."""
    old_logp: torch.Tensor | None = None
    """(N, T) float: the trainer's no-grad log-probs before the update (π_θold; used by rollout correction)."""
    prox_logp: torch.Tensor | None = None
    """(N, T) float: no-grad snapshot π_prox at the start of the update (decoupled PPO, two-anchor P3O)."""
    ref_logp: torch.Tensor | None = None
    """(N, T) float: frozen reference policy π_ref (needed when ``ref_kl_coef`` != 0)."""
    entropy: torch.Tensor | None = None
    """(N, T) float: token entropies H_t (needed when ``entropy_coef`` != 0); may carry grad."""
    num_tokens: int | float | torch.Tensor | None = None
    """Valid tokens of the whole optimizer step (all micro-batches, all data-parallel ranks); ``token-mean``
    divides by it. None: the micro-batch's own count."""
    num_seqs: int | float | torch.Tensor | None = None
    """Sequences of the whole optimizer step on this rank (the ``seq-mean-*`` modes divide by it so that
    gradient accumulation sums to the one-batch loss). None: the micro-batch's N."""
    group: Any = None
    """torch.distributed process group for the ESS all-reduce (None: the default group when initialised)."""
    step_ess: torch.Tensor | float | None = None
    """0-d: e_B precomputed by the loop over all micro-batches of the optimizer step (no-grad pass before the
    backward passes, e.g. with :func:`ess_from_parts`); required by ``p3o(scope="step")``."""
    m2po_threshold: torch.Tensor | float | None = None
    """0-d: M2PO's step-level cut (from :func:`p3o.objectives.m2po_threshold` over the step's tokens); tokens
    with lr² >= threshold are masked. None: computed on this micro-batch."""
    loss_weight: torch.Tensor | None = None
    """(N, T) float, detached: a framework's own per-token multiplier of the objective's per-token loss (verl's
    zero or sequence-level ``rollout_is_weights``), applied with the rollout correction's weight; it moves no
    anchor. None: 1."""


# ----------------------------------------------------------------------------------------------- aggregation


def reduce_tokens(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "token-mean",
    num_tokens: int | float | torch.Tensor | None = None,
    *,
    num_seqs: int | float | torch.Tensor | None = None,
    norm_const: float | None = None,
) -> torch.Tensor:
    """Aggregate an (N, T) per-token loss matrix into a 0-d loss (the one place that owns aggregation).

    * ``token-mean``: Σ_{valid t} ℓ_t / N_tok with N_tok = ``num_tokens`` (the optimizer step's valid-token
      count) or, when None, this batch's valid-token count (at least 1).
    * ``seq-mean-token-mean``: Σ_i (Σ_t ℓ_it / n_i) / S with n_i the row's valid count (rows with none give 0)
      and S = ``num_seqs`` or N (original GRPO, GSPO).
    * ``seq-mean-token-sum-norm``: Σ_i (Σ_t ℓ_it / C) / S with C = ``norm_const`` or T (Dr.GRPO).

    With the step's ``num_tokens`` / ``num_seqs`` passed in, the micro-batch losses sum to the one-batch loss.

    Args:
        per_token: (N, T) float; values at masked positions are ignored (torch.where, so NaN there is harmless).
        mask: (N, T) bool, True = counts.
    """
    assert per_token.shape == mask.shape, (per_token.shape, mask.shape)
    vals = torch.where(mask, per_token, torch.zeros((), dtype=per_token.dtype, device=per_token.device))
    if mode == "token-mean":
        denom = mask.sum() if num_tokens is None else num_tokens
        denom = torch.as_tensor(denom, dtype=vals.dtype, device=vals.device).clamp(min=1)
        return vals.sum() / denom
    seqs = torch.as_tensor(mask.shape[0] if num_seqs is None else num_seqs, dtype=vals.dtype, device=vals.device)
    seqs = seqs.clamp(min=1)
    if mode == "seq-mean-token-mean":
        per_seq = vals.sum(-1) / mask.sum(-1).clamp(min=1).to(vals.dtype)
        return per_seq.sum() / seqs
    if mode == "seq-mean-token-sum-norm":
        const = float(mask.shape[-1] if norm_const is None else norm_const)
        return vals.sum() / const / seqs
    raise ObjectiveError(f"agg: unknown aggregation mode {mode!r}; valid: {', '.join(AGG_MODES)}")


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over ``mask`` (0 on an empty mask), computed with torch.where; returns a 0-d tensor."""
    vals = torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))
    return vals.sum() / mask.sum().clamp(min=1)


# ----------------------------------------------------------------------------------------------- ESS


def _dist_active(group: Any) -> bool:
    return dist.is_available() and dist.is_initialized() and (group is not None or dist.get_world_size() > 1)


def ess_parts(log_ratio: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Local sufficient statistics of the ESS: (max lr over valid tokens, float64 [Σe^{lr−m}, Σe^{2(lr−m)}, |B|]).

    The max is −inf on an empty mask. Combine parts of several micro-batches with :func:`ess_from_parts`.
    """
    assert log_ratio.shape == mask.shape, (log_ratio.shape, mask.shape)
    with torch.no_grad():
        lr = log_ratio.detach().float()
        neg_inf = torch.full((), -math.inf, device=lr.device)
        m = torch.where(mask, lr, neg_inf).amax() if lr.numel() else neg_inf
        return m, _ess_sums(lr, mask, m)


def _ess_sums(lr: torch.Tensor, mask: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    z = torch.where(mask, lr - m_safe, torch.full((), -math.inf, device=lr.device))  # e^{-inf} = 0 when masked
    e1 = torch.exp(z)
    s1 = e1.sum(dtype=torch.float64)
    s2 = (e1 * e1).sum(dtype=torch.float64)
    return torch.stack([s1, s2, mask.sum().to(torch.float64)])


def _ess_from_sums(sums: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """log ESS = 2·log s1 − log s2 − log n; returns (ESS float32 clamped to [1/n, 1], degenerate flag)."""
    s1, s2, n = sums.unbind(-1)
    log_ess = 2 * torch.log(s1) - torch.log(s2) - torch.log(n)
    ok = (n > 0) & torch.isfinite(log_ess)
    ess = torch.where(ok, torch.exp(log_ess.clamp(max=0.0)), torch.ones_like(log_ess))
    ess = torch.maximum(ess, torch.where(ok, 1.0 / n.clamp(min=1), torch.zeros_like(n)))
    return ess.float(), ~ok


def ess_from_parts(
    parts: list[tuple[torch.Tensor, torch.Tensor]], group: Any = None, *, sync: bool = True
) -> torch.Tensor:
    """Combine :func:`ess_parts` of several micro-batches (and, when distributed, of all ranks) into one 0-d ESS.

    Each part is rescaled to the common max: s_k · e^{(m_k − M)k'} (k' = 1, 2). This is how the training loop
    computes the step-scope e_B for ``p3o(scope="step")`` from a no-grad pass.
    """
    ms = torch.stack([p[0] for p in parts])
    m = ms.amax()
    if sync and _dist_active(group):
        dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
    total = _rescale_sum(parts, m)
    if sync and _dist_active(group):
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=group)
    return _ess_from_sums(total)[0]


def _rescale_sum(parts: list[tuple[torch.Tensor, torch.Tensor]], m: torch.Tensor) -> torch.Tensor:
    total = torch.zeros(3, dtype=torch.float64, device=m.device)
    for mk, sk in parts:
        d = torch.where(
            torch.isfinite(mk) & torch.isfinite(m),
            (mk - m).double(),
            torch.zeros((), dtype=torch.float64, device=m.device),
        )
        scale = torch.stack([torch.exp(d), torch.exp(2 * d), torch.ones_like(d)])
        total = total + torch.where(sk[2] > 0, sk * scale, torch.zeros_like(sk))
    return total


def _ess(
    log_ratio: torch.Tensor, mask: torch.Tensor, group: Any = None, scope: str = "micro-batch", sync: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """(ESS, degenerate flag) — see :func:`effective_sample_size`."""
    with torch.no_grad():
        lr = log_ratio.detach().float()
        neg_inf = torch.full((), -math.inf, device=lr.device)
        if scope == "sequence":
            m = torch.where(mask, lr, neg_inf).amax(-1, keepdim=True)  # (N, 1)
            m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
            e1 = torch.exp(torch.where(mask, lr - m_safe, neg_inf))
            sums = torch.stack(
                [e1.sum(-1, dtype=torch.float64), (e1 * e1).sum(-1, dtype=torch.float64), mask.sum(-1).double()], -1
            )
            ess, bad = _ess_from_sums(sums)
            return ess[:, None], (bad & (sums[:, 2] > 0)).any()  # empty (padding) rows are not flagged
        if scope not in ("micro-batch", "step"):
            raise ObjectiveError(f"scope: unknown ESS scope {scope!r}; valid: {', '.join(ESS_SCOPES)}")
        m = torch.where(mask, lr, neg_inf).amax() if lr.numel() else neg_inf
        active = sync and _dist_active(group)
        if active:
            dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
        sums = _ess_sums(lr, mask, m)
        if active:
            dist.all_reduce(sums, op=dist.ReduceOp.SUM, group=group)
        return _ess_from_sums(sums)


def effective_sample_size(
    log_ratio: torch.Tensor, mask: torch.Tensor, group: Any = None, *, scope: str = "micro-batch", sync: bool = True
) -> torch.Tensor:
    """Kong's effective sample size of the importance ratios ρ_t = e^{lr_t} over the valid tokens B (detached).

        ESS(B) = (Σ_B ρ_t)² / (|B| · Σ_B ρ_t²) ∈ [1/|B|, 1]

    computed in log space with float64 sums: with m = max_B lr, log ESS = 2·log Σe^{lr−m} − log Σe^{2(lr−m)} −
    log |B|. When torch.distributed is initialised (and ``sync``), each rank's (m, Σe^{lr−m}, Σe^{2(lr−m)}, |B|)
    is all-reduced over ``group`` (MAX, then SUM), so B spans the micro-batches all ranks process together.
    Empty B or non-finite sums give 1. Invariant to scaling all ratios; 1 iff all ratios are equal.

    Args:
        log_ratio: (N, T) float log π_θ − log π_b (values at masked positions are ignored).
        mask: (N, T) bool.
        scope: ``micro-batch`` / ``step`` (one 0-d value over the given tokens) or ``sequence`` ((N, 1), one per
            row, never all-reduced).
    Returns:
        0-d float32 tensor, or (N, 1) for ``scope="sequence"``.
    """
    assert log_ratio.shape == mask.shape, (log_ratio.shape, mask.shape)
    return _ess(log_ratio, mask, group, scope, sync)[0]


# ----------------------------------------------------------------------------------------------- shared terms


@dataclass(frozen=True)
class Correction:
    """A rollout correction (the ``rollout_correction*`` hyper-parameters every objective takes)."""

    mode: str = "none"
    cap: float = 2.0
    low: float = 0.5


@dataclass
class Prepared:
    """Sanitised float32 tensors of one micro-batch (all 0 at masked positions), and the inputs they came from."""

    inputs: ObjectiveInputs  # the raw micro-batch: its group, step-level values and optional log-probs
    logp: torch.Tensor  # (N, T) with grad
    rollout_logp: torch.Tensor  # (N, T) the ratio's anchor: π_b, or π_θold when a rollout correction is active
    log_ratio: torch.Tensor  # (N, T) logp − anchor, with grad
    adv: torch.Tensor  # (N, T)
    mask: torch.Tensor  # (N, T) bool; rows rejected by a row-rejecting correction are removed
    rc_weight: torch.Tensor | None = None  # (N, T) detached rollout-correction weight, None for "none"
    rc_stats: dict[str, torch.Tensor] | None = None
    rejected_rows: torch.Tensor | None = None  # 0-d count of rows a row rejection removed (None: no rejection)


@dataclass
class PolicyTerm:
    """What an objective's own function returns: its policy loss and stats, before :func:`finish` adds the rollout
    correction, the reference-KL and entropy terms and aggregates.

    Attributes:
        per_token: (N, T) float policy loss ℓ^policy (with gradient).
        stats: detached 0-d diagnostics of the objective.
        extra_mask: (N, T) bool or None: tokens kept in the policy term (False: weight 0, still in the denominator).
        num_seqs: the row count of the ``seq-mean-*`` modes when ``inputs.num_seqs`` is None (None: N less the rows
            a row rejection removed).
    """

    per_token: torch.Tensor
    stats: dict[str, torch.Tensor]
    extra_mask: torch.Tensor | None = None
    num_seqs: torch.Tensor | float | None = None


def _clean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    x = x.float()
    return torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))


def prepare(inputs: ObjectiveInputs, correction: Correction | None = None) -> Prepared:
    """Check shapes, cast to float32, zero every tensor at masked positions (before any exp) and set the anchor.

    Without a rollout correction the ratio is ρ_t = π_θ/π_b (``rollout_logp``, the recorded behaviour log-probs).
    With one, the objective's ratio is anchored at π_θold (``inputs.old_logp``, the trainer's log-probs at the start
    of the update) and the correction carries π_θold/π_b (:func:`rollout_correction_weights`), so the engine
    mismatch is counted once (verl's decoupled mode, TRL's importance-sampling correction). ``old_logp`` None
    falls back to sg(logp), which equals π_θold only before the update's first optimizer step.
    """
    mask = inputs.mask
    assert mask.dtype == torch.bool, f"mask must be bool, got {mask.dtype}"
    assert inputs.logp.shape == mask.shape, (inputs.logp.shape, mask.shape)
    assert inputs.rollout_logp.shape == mask.shape, (inputs.rollout_logp.shape, mask.shape)
    adv = inputs.advantages.detach().float()
    if adv.dim() == 1:
        assert adv.shape[0] == mask.shape[0], (adv.shape, mask.shape)
        adv = adv[:, None].expand_as(mask)
    assert adv.shape == mask.shape, (adv.shape, mask.shape)
    logp = _clean(inputs.logp, mask)
    rollout = _clean(inputs.rollout_logp.detach(), mask)
    corr = correction or Correction()
    if corr.mode == "none":
        return Prepared(inputs, logp, rollout, logp - rollout, _clean(adv, mask), mask)
    if inputs.old_logp is None:
        old = logp.detach()
    else:
        assert inputs.old_logp.shape == mask.shape, (inputs.old_logp.shape, mask.shape)
        old = _clean(inputs.old_logp.detach(), mask)
    weight, keep, rc_stats = rollout_correction_weights(old - rollout, mask, corr)
    rejected = None
    if keep is not None:
        rejected = (mask & ~keep).any(-1).sum()
        mask = mask & keep
        logp, old, adv = _clean(logp, mask), _clean(old, mask), _clean(adv, mask)
    return Prepared(inputs, logp, old, logp - old, _clean(adv, mask), mask, weight, rc_stats, rejected)


def correction_anchor(
    rollout_logp: torch.Tensor, mask: torch.Tensor, old_logp: torch.Tensor | None, correction: Correction
) -> tuple[torch.Tensor, torch.Tensor]:
    """(anchor log-probs, mask) of the objective's ratio under ``correction``, for a caller's pre-passes (the step
    ESS, M2PO's threshold) and counts (``num_tokens`` / ``num_seqs``), exactly as :func:`prepare` sees them:
    (``rollout_logp``, ``mask``) for ``none``; (``old_logp``, ``mask`` less the rows a row rejection removes)
    otherwise. Shapes (N, T); detached.
    """
    if correction.mode == "none":
        return rollout_logp.detach(), mask
    if old_logp is None:
        raise ObjectiveError(f"rollout_correction={correction.mode!r} needs old_logp (the trainer's π_θold)")
    old = _clean(old_logp.detach(), mask)
    _, keep, _ = rollout_correction_weights(old - _clean(rollout_logp.detach(), mask), mask, correction)
    return old, mask if keep is None else mask & keep


def side_logp(inputs: ObjectiveInputs, name: str, mask: torch.Tensor, *, needed_by: str) -> torch.Tensor:
    """A sanitised, detached optional log-prob field (``prox_logp``, ``ref_logp``, ``old_logp``) or a clear error."""
    x = getattr(inputs, name)
    if x is None:
        raise ObjectiveError(f"{needed_by} needs ObjectiveInputs.{name}, which is None")
    assert x.shape == mask.shape, (name, x.shape, mask.shape)
    return _clean(x.detach(), mask)


def k3(log_ratio: torch.Tensor, clamp: float = KL_CLAMP) -> torch.Tensor:
    """k3 estimator of KL(π_θ ‖ π_other) per token: e^{−lr} + lr − 1 ≥ 0, lr clamped to ±clamp inside the exp."""
    return torch.exp(-log_ratio.clamp(-clamp, clamp)) + log_ratio - 1


def kl_estimate(log_ratio: torch.Tensor, estimator: str = "k3", clamp: float = KL_CLAMP) -> torch.Tensor:
    """A per-token estimator k(lr) of a KL between π_θ and the anchor, lr = log π_θ/π_anchor (gradient kept), (N, T):

    * ``k3`` = e^{−lr} + lr − 1 (the P3O paper's; on π_anchor samples it estimates χ²(π_b‖π_θ) − KL(π_b‖π_θ),
      not KL(π_θ‖π_b); its gradient 1 − 1/ρ grows like 1/ρ as ρ → 0);
    * ``k3_is`` = e^{lr}·lr − e^{lr} + 1 = ρ·(1/ρ − 1 + lr): unbiased in value and gradient for KL(π_θ‖π_b) on π_b
      samples; gradient ρ·lr;
    * ``k2`` = ½·lr²: gradient lr;
    * ``none`` = 0.

    All are ≥ 0 and 0 at lr = 0. lr is clamped to ±``clamp`` inside every exp (finite for |lr| up to 80).
    """
    if estimator == "k3":
        return k3(log_ratio, clamp)
    if estimator == "k3_is":
        return torch.exp(log_ratio.clamp(-clamp, clamp)) * (log_ratio - 1) + 1
    if estimator == "k2":
        return 0.5 * log_ratio * log_ratio
    if estimator == "none":
        return 0.0 * log_ratio  # zero value and gradient, still a function of lr
    raise ObjectiveError(f"kl_estimator: unknown value {estimator!r}; valid: {', '.join(KL_ESTIMATORS)}")


def rollout_correction_weights(
    lr_old: torch.Tensor, mask: torch.Tensor, correction: Correction
) -> tuple[torch.Tensor | None, torch.Tensor | None, dict[str, torch.Tensor]]:
    """The rollout correction (verl, TRL, IcePop) of the engine-vs-trainer mismatch, from lr_old = log π_θold/π_b.

    With C = ``correction.cap`` (``rollout_correction_cap``), L = ``correction.low`` (``rollout_correction_low``):

    * ``token-tis``: w_t = min(e^{lr_old,t}, C) (``rc_capped_frac``: tokens above C);
    * ``seq-mis``: w_i = 1 if e^{Σ_t lr_old} ∈ [1/C, C] else 0 (``rc_masked_frac``);
    * ``token-icepop``: w_t = e^{lr_old,t} if L ≤ e^{lr_old,t} ≤ C else 0 (``rc_masked_frac``);
    * ``seq-tis``: w_i = min(e^{clamp(Σ_t lr_old, ±20)}, C) (``rc_capped_frac``: tokens of rows above C);
    * ``geo-rs``: keep row i iff L ≤ e^{mean_t lr_old} ≤ C (``rc_rejected_frac``);
    * ``seq-max-k2`` / ``seq-max-k3``: keep row i iff max_t k(lr_old,t) ≤ C, k2 = ½·lr², k3 = e^{lr} − 1 − lr
      (``rc_rejected_frac``).

    Weights (the first four) multiply the policy loss, and masked tokens stay in the denominators; the row
    rejections (the last three) return a keep mask instead: rejected rows leave the denominators and the ESS.
    Fractions are over the valid tokens. lr_old is clamped to ±20 inside every exp, as verl does.

    Args:
        lr_old: (N, T) float, 0 at masked positions; mask: (N, T) bool.
    Returns:
        ((N, T) detached weights or None, (N, T) bool keep mask or None, stats).
    """
    mode, cap, low = correction.mode, correction.cap, correction.low
    if mode not in ROLLOUT_CORRECTIONS:
        raise ObjectiveError(f"rollout_correction: unknown mode {mode!r}; valid: {', '.join(ROLLOUT_CORRECTIONS)}")
    if mode in ("token-tis", "seq-mis", "seq-tis") and not cap > 1.0:
        raise ObjectiveError(f"rollout_correction_cap must be > 1, got {cap}")
    if mode in ("token-icepop", "geo-rs") and not 0.0 <= low <= 1.0 <= cap:
        raise ObjectiveError(
            f"rollout_correction_low <= 1 <= rollout_correction_cap must hold for {mode}, got {low} and {cap}"
        )
    if mode in ("seq-max-k2", "seq-max-k3") and not cap > 0.0:
        raise ObjectiveError(f"rollout_correction_cap must be > 0 for {mode}, got {cap}")
    with torch.no_grad():
        lr = torch.where(mask, lr_old.detach().float().clamp(-20.0, 20.0), torch.zeros((), device=lr_old.device))
        if mode == "token-tis":
            w = torch.exp(lr.clamp(max=math.log(cap)))
            return w, None, {"rc_capped_frac": masked_mean((lr > math.log(cap)).float(), mask)}
        if mode == "token-icepop":
            raw = torch.exp(lr)
            inside = (raw >= low) & (raw <= cap)
            w = torch.where(inside, raw, torch.zeros((), device=lr.device))
            return w, None, {"rc_masked_frac": masked_mean((~inside).float(), mask)}
        seq = torch.where(mask, lr_old.detach().float(), torch.zeros((), device=lr.device)).sum(-1, keepdim=True)
        if mode == "seq-mis":
            keep = (seq.abs() <= math.log(cap)).expand_as(mask)
            return keep.float(), None, {"rc_masked_frac": masked_mean((~keep).float(), mask)}
        if mode == "seq-tis":
            s = seq.clamp(-20.0, 20.0)
            w = torch.exp(s.clamp(max=math.log(cap))).expand_as(mask)
            return w, None, {"rc_capped_frac": masked_mean((s > math.log(cap)).expand_as(mask).float(), mask)}
        if mode == "geo-rs":
            n = mask.sum(-1, keepdim=True).clamp(min=1)
            geo = torch.exp(lr.sum(-1, keepdim=True) / n)
            keep = ((geo >= low) & (geo <= cap)).expand_as(mask)
        else:
            k = 0.5 * lr * lr if mode == "seq-max-k2" else torch.exp(lr) - 1 - lr
            worst = torch.where(mask, k, torch.zeros((), device=lr.device)).amax(-1, keepdim=True)
            keep = (worst <= cap).expand_as(mask) if lr.shape[-1] else mask
        return None, keep, {"rc_rejected_frac": masked_mean((~keep).float(), mask)}


def finish(
    term: PolicyTerm, prep: Prepared, *, agg: str, ref_kl_coef: float, entropy_coef: float
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Apply the common modifier and extra terms to an objective's (N, T) policy term, aggregate it and finalise
    the stats.

        ℓ_t = w^rc_t · u_t · m_t · ℓ^policy_t + η · k3(π_θ ‖ π_ref)_t − β · H_t,   loss = agg(ℓ)   (0-d)

    w^rc is the rollout correction's weight, computed by :func:`prepare` (1 for ``none`` and the row rejections,
    whose rows :func:`prepare` already removed from ``prep.mask``); u = ``inputs.loss_weight`` (1 when None);
    m = ``term.extra_mask`` (1 when None: a False token leaves the policy term only, the denominator is
    unchanged). ``term.num_seqs``: the row count of the ``seq-mean-*`` modes when ``inputs.num_seqs`` is None
    (default: N less the rejected rows). Returns the loss and ``term.stats`` with the correction's, ``ref_kl``,
    ``entropy`` and ``num_valid_tokens`` added, each a detached 0-d float.
    """
    if agg not in AGG_MODES:
        raise ObjectiveError(f"agg: unknown aggregation mode {agg!r}; valid: {', '.join(AGG_MODES)}")
    inputs, mask, stats, extra_mask, num_seqs = prep.inputs, prep.mask, term.stats, term.extra_mask, term.num_seqs
    per_token = term.per_token
    if prep.rc_weight is not None:
        per_token = per_token * prep.rc_weight
    if inputs.loss_weight is not None:
        assert inputs.loss_weight.shape == mask.shape, (inputs.loss_weight.shape, mask.shape)
        per_token = per_token * _clean(inputs.loss_weight.detach(), mask)
    if extra_mask is not None:
        per_token = torch.where(extra_mask, per_token, torch.zeros((), device=per_token.device))
    stats.update(prep.rc_stats or {})
    if ref_kl_coef != 0.0:
        ref = side_logp(inputs, "ref_logp", mask, needed_by="ref_kl_coef != 0")
        ref_kl = k3(prep.logp - ref)
        per_token = per_token + ref_kl_coef * ref_kl
        stats["ref_kl"] = masked_mean(ref_kl.detach(), mask)
    if entropy_coef != 0.0:
        if inputs.entropy is None:
            raise ObjectiveError("entropy_coef != 0 needs ObjectiveInputs.entropy, which is None")
        ent = _clean(inputs.entropy, mask)
        per_token = per_token - entropy_coef * ent
        stats["entropy"] = masked_mean(ent.detach(), mask)
    if inputs.num_seqs is not None:
        num_seqs = inputs.num_seqs
    elif num_seqs is None and prep.rejected_rows is not None:  # rejected rows leave the row count too
        num_seqs = mask.shape[0] - prep.rejected_rows
    loss = reduce_tokens(per_token, mask, agg, inputs.num_tokens, num_seqs=num_seqs)
    stats["num_valid_tokens"] = mask.sum().float()
    return loss, {k: v.detach().float().reshape(()) for k, v in stats.items()}


def ratio_stats(log_ratio: torch.Tensor, mask: torch.Tensor, *, band: float = BAND) -> dict[str, torch.Tensor]:
    """Standard diagnostics of ρ = e^{lr} over valid tokens: ratio_mean/min/max, approx_kl (mean k3), and
    ``band_frac`` (fraction of tokens with |ρ − 1| > ``band``: what a PPO clip at ε = band would act on, reported
    by every objective so objectives compare like with like). All detached; min/max are 1 when empty."""
    with torch.no_grad():
        lr = log_ratio.detach()
        ratio = torch.exp(lr)
        one = torch.ones((), device=lr.device)
        any_valid = mask.any()
        inf = torch.full((), math.inf, device=lr.device)
        rmin = torch.where(mask, ratio, inf).amin() if lr.numel() else one
        rmax = torch.where(mask, ratio, -inf).amax() if lr.numel() else one
        return {
            "ratio_mean": masked_mean(ratio, mask),
            "ratio_min": torch.where(any_valid, rmin, one),
            "ratio_max": torch.where(any_valid, rmax, one),
            "approx_kl": masked_mean(k3(lr), mask),
            "band_frac": masked_mean(((ratio - 1).abs() > band).float(), mask),
        }


def baseline_stats(prep: Prepared) -> dict[str, torch.Tensor]:
    """:func:`ratio_stats` of ``prep.log_ratio`` over ``prep.mask`` plus ``kl_behavior`` and the (local, not
    all-reduced) ``ess``: the diagnostics of every objective that does not use the ESS itself (detached 0-d)."""
    with torch.no_grad():
        stats = ratio_stats(prep.log_ratio, prep.mask)
        stats["kl_behavior"] = stats["approx_kl"]
        stats["ess"] = _ess(prep.log_ratio, prep.mask, prep.inputs.group, sync=False)[0]
    return stats
