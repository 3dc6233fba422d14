"""The recently published objectives: GMPO, SAPO, DPPO, TOPR, DRO, GPG, KL-Cov and Clip-Cov.

The losses verl, prime-rl, ROLL and their papers run (docs/objectives.md gives each one's source). This project's
convention throughout: lr_t = logp_t − anchor_t with the anchor π_b (the recorded rollout log-probs), or π_θold
when a rollout correction is active; A is the sequence advantage broadcast over tokens; every loss is minimised.
Each objective is written as its policy term over the prepared micro-batch (N sequences, T tokens) and its own
keywords; :func:`p3o.objectives.shared.with_shared` wraps it in the rollout correction, the reference-KL and entropy
terms and the aggregation every objective shares, so the module-level name is the whole objective,
``fn(inputs, **hyper) -> (loss, stats)``. Usage::

    loss, stats = sapo(ObjectiveInputs(logp, rollout_logp, mask, advantages), tau_neg=1.05)
"""

from __future__ import annotations

import math

import torch

from p3o.objectives.clipped import clipped_surrogate
from p3o.objectives.core import (
    RATIO_LOG_CLAMP,
    ObjectiveError,
    PolicyTerm,
    Prepared,
    baseline_stats,
    check_eps,
    masked_mean,
)
from p3o.objectives.shared import with_shared


def _row_adv(adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Ā_i = masked mean of A over row i's valid tokens, (N, 1) (0 for an empty row): the sequence advantage."""
    return adv.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)


def _valid_rows(prep: Prepared) -> torch.Tensor:
    """Rows with a valid token (0-d float): the default S of the per-sequence losses (GMPO)."""
    return prep.mask.any(-1).sum().float()


@with_shared(agg="seq-mean-token-mean")
def gmpo(prep: Prepared, *, clip_eps_low: float = 0.4, clip_eps_high: float = 0.4) -> PolicyTerm:
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
    check_eps("clip_eps_low", clip_eps_low)
    check_eps("clip_eps_high", clip_eps_high)
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
    stats = baseline_stats(prep)
    with torch.no_grad():
        out = above | below
        pos = masked_mean((out & (adv > 0)).float(), mask)
        neg = masked_mean((out & (adv < 0)).float(), mask)
        rows = mask.any(-1)
        stats.update(clipfrac=pos + neg, clipfrac_pos=pos, clipfrac_neg=neg)
        stats["seq_ratio_mean"] = masked_mean(seq_ratio.detach()[:, 0], rows)
    num_seqs = None if prep.inputs.num_seqs is not None else _valid_rows(prep)
    return PolicyTerm(per_token, stats, num_seqs=num_seqs)


@with_shared(agg="seq-mean-token-mean")
def sapo(prep: Prepared, *, tau_pos: float = 1.0, tau_neg: float = 1.05) -> PolicyTerm:
    """SAPO (soft adaptive policy optimisation, arXiv 2511.20347; verl ``sapo``): a sigmoid gate instead of a clip.

        r_t = exp(clamp(lr_t, ±20)),  τ_t = τ_pos if A_t > 0 else τ_neg,  ℓ_t = −σ(τ_t·(r_t − 1))·(4/τ_t)·A_t

    No stop-gradient and no clip: ∂ℓ_t/∂logp_t = −A_t·4σ(1 − σ)·r_t, which is −A_t at r = 1 and decays smoothly as
    |r − 1| grows. The loss VALUE at r = 1 is −2A/τ, not −A. τ_pos = 1, τ_neg = 1.05 (verl, SkyRL, AReaL);
    ``seq-mean-token-mean`` as in the paper and verl. Stats: soft_gate_mean (mean 4σ(1 − σ), the gradient's gate).
    """
    if not (tau_pos > 0 and tau_neg > 0):
        raise ObjectiveError(f"tau_pos and tau_neg must be > 0, got {tau_pos} and {tau_neg}")
    mask, lr, adv = prep.mask, prep.log_ratio, prep.adv
    ratio = torch.exp(lr.clamp(-20.0, 20.0))
    tau = torch.where(adv > 0, torch.full((), tau_pos, device=lr.device), torch.full((), tau_neg, device=lr.device))
    gate = torch.sigmoid(tau * (ratio - 1.0))
    per_token = -gate * (4.0 / tau) * adv
    stats = baseline_stats(prep)
    with torch.no_grad():
        stats["soft_gate_mean"] = masked_mean(4 * gate.detach() * (1 - gate.detach()), mask)
    return PolicyTerm(per_token, stats)


@with_shared()
def dppo(
    prep: Prepared,
    *,
    mask_low: float = 0.2,
    mask_high: float = 0.2,
    adv_tau: float = 1.0,
    kl_tau: float = 1e-3,
) -> PolicyTerm:
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
    mask, lr, adv = prep.mask, prep.log_ratio, prep.adv
    with torch.no_grad():
        delta = torch.exp(prep.logp.detach()) - torch.exp(prep.rollout_logp)
        high, low = delta > mask_high, delta < -mask_low
        masked = torch.where(adv > 0, high, low) & mask
    ratio = torch.exp(lr.clamp(-RATIO_LOG_CLAMP, RATIO_LOG_CLAMP))
    pg = torch.where(masked, torch.zeros((), device=lr.device), -adv_tau * adv * ratio)
    per_token = pg + kl_tau * lr * lr
    stats = baseline_stats(prep)
    with torch.no_grad():
        stats["masked_frac"] = masked_mean(masked.float(), mask)
        stats["masked_low_frac"] = masked_mean((masked & (adv <= 0)).float(), mask)
        stats["masked_high_frac"] = masked_mean((masked & (adv > 0)).float(), mask)
    return PolicyTerm(per_token, stats)


@with_shared(agg="seq-mean-token-mean")
def topr(prep: Prepared) -> PolicyTerm:
    """TOPR (tapered off-policy REINFORCE, arXiv 2503.14286), the paper's SEQUENCE form with the advantage as score:

        c_i = 1 if Ā_i ≥ 0,  else sg(exp(min(0, Σ_t m·lr_t)))  (= sg(min(1, π_θ(y_i)/π_b(y_i))))
        ℓ_t = −c_i·A_t·logp_t

    Positive sequences get a plain SFT-like push; negative ones are pushed down with their truncated sequence
    ratio. No hyper-parameter; ``seq-mean-token-mean`` (ROLL's default; the paper fixes no length normalisation).
    The public implementations (ROLL, Trinity-RFT) use a per-token ratio against π_old instead.
    Stats: neg_weight_mean (mean c_i over negative rows, 1 when none), neg_frac (tokens in negative rows).
    """
    mask, lr, adv = prep.mask, prep.log_ratio, prep.adv
    with torch.no_grad():
        seq_lr = lr.detach().sum(-1, keepdim=True)
        neg = _row_adv(adv, mask) < 0  # (N, 1)
        weight = torch.where(neg, torch.exp(seq_lr.clamp(max=0.0)), torch.ones((), device=lr.device))
    per_token = -(weight * adv) * prep.logp
    stats = baseline_stats(prep)
    with torch.no_grad():
        neg_rows = neg[:, 0] & mask.any(-1)
        stats["neg_weight_mean"] = torch.where(
            neg_rows.any(), masked_mean(weight[:, 0], neg_rows), torch.ones((), device=lr.device)
        )
        stats["neg_frac"] = masked_mean(neg.expand_as(mask).float(), mask)
    return PolicyTerm(per_token, stats)


@with_shared()
def dro(prep: Prepared, *, beta: float | None = None) -> PolicyTerm:
    """DRO / the Kimi-1.5 squared-log-ratio loss, token level (verl ``dro``, ROLL ``kimi15``):

        ℓ_t = −(A_t·logp_t − ½·β·lr_t²),   ∂ℓ_t/∂logp_t = −(A_t − β·lr_t)

    ``beta`` has NO default (verl raises too): missing or ≤ 0 is a one-line error. (ROLL's ``kimi15_tau`` is
    the same β, default 0.1.) With lr ≡ 0 it is REINFORCE, −A·logp. Token-mean. Stats: sq_log_ratio (mean lr²).
    """
    if beta is None or not beta > 0:
        raise ObjectiveError(f"dro: beta must be set and > 0 (it has no default), got {beta}")
    mask, lr, adv = prep.mask, prep.log_ratio, prep.adv
    per_token = -(adv * prep.logp - 0.5 * beta * lr * lr)
    stats = baseline_stats(prep)
    with torch.no_grad():
        stats["sq_log_ratio"] = masked_mean(lr.detach() ** 2, mask)
    return PolicyTerm(per_token, stats)


@with_shared()
def gpg(prep: Prepared) -> PolicyTerm:
    """GPG (group policy gradient, arXiv 2504.02546; verl ``gpg``): plain REINFORCE, no ratio, no clip.

        ℓ_t = −A_t·logp_t

    Token-mean. GPG's own advantage (α-scaled, no std normalisation) is data-side; any advantage works here.
    On-policy it IS the policy gradient; off-policy it ignores the mismatch (a rollout correction can weight it).
    """
    per_token = -prep.adv * prep.logp
    stats = baseline_stats(prep)
    return PolicyTerm(per_token, stats)


def _covariance(logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Cov_t = (A_t − Ā)·(sg(logp_t) − mean sg(logp)), the means over this call's valid tokens (detached, (N, T))."""
    with torch.no_grad():
        lp = logp.detach()
        return (adv - masked_mean(adv, mask)) * (lp - masked_mean(lp, mask))


@with_shared()
def kl_cov(prep: Prepared, *, ratio: float = 2e-4, beta: float = 0.1) -> PolicyTerm:
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
    stats = baseline_stats(prep)
    with torch.no_grad():
        stats["cov_selected_frac"] = masked_mean(chosen.float(), mask)
        stats["cov_mean"] = masked_mean(cov, mask)
    return PolicyTerm(per_token, stats)


@with_shared()
def clip_cov(
    prep: Prepared,
    *,
    ratio: float = 2e-4,
    cov_low: float = 1.0,
    cov_high: float = 5.0,
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.2,
    choice_seed: int = 0,
) -> PolicyTerm:
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
    check_eps("clip_eps_low", clip_eps_low, upper=1.0)
    check_eps("clip_eps_high", clip_eps_high)
    if not 0 <= ratio <= 1:
        raise ObjectiveError(f"ratio must be in [0, 1], got {ratio}")
    if not cov_low < cov_high:
        raise ObjectiveError(f"cov_low must be < cov_high, got {cov_low} and {cov_high}")
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
    stats = baseline_stats(prep)
    stats["clipfrac"] = masked_mean(was_clipped.float(), mask)
    stats["cov_clipped_frac"] = masked_mean(chosen.float(), mask)
    return PolicyTerm(per_token, stats, extra_mask=~chosen)
