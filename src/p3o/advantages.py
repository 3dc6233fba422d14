"""Advantage estimators: group-relative advantages (GRPO Eq. 3, Dr.GRPO, the MinPRO paper's AsymRE baseline and an
earlier std-lowered one) and DAPO's soft overlong penalty.

Usage: ``adv, stats = group_advantages(rollouts.rewards, rollouts.group_ids)``.
"""

from __future__ import annotations

import torch

from p3o.errors import ConfigError

STD_MODES = ("population", "bessel")
SCALE_MODES = ("group", "batch", "none")
BASELINES = ("mean", "asymre", "lowered")


def _check(name: str, value: str, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise ConfigError(f"{name}: unknown value {value!r}; valid: {', '.join(valid)}")


def group_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    std: str = "population",
    scale: str = "group",
    baseline: str = "mean",
    alpha: float = 0.5,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Group-relative advantages, one per sequence (broadcast over its tokens by the objectives).

        A_i = (r_i − b_g) / (σ + ε),   σ = std_g r (``scale="group"``), the batch std (``"batch"``) or no division
        at all (``"none"``, Dr.GRPO), with the baseline

        b_g = mean_g r                                  (``baseline="mean"``, GRPO)
        b_g = mean_g r − α·(mean_g r − min_g r)         (``"asymre"``: AsymRE as the MinPRO paper's appendix D
                                                          adapts it, α = 0.5)
        b_g = mean_g r − α·std_g r                      (``"lowered"``: an earlier, wrong reconstruction of that
                                                          formula, kept under its own name for the studies that ran it)

    Worked values (binary rewards, pass rate 0.75: group {1, 1, 1, 0}, population std 0.433, α = 0.5): ``asymre``
    gives correct / wrong 1.443 / −0.866 (the paper's), ``lowered`` 1.077 / −1.232; the two agree only at a pass
    rate of 0.5. A group with all rewards equal gets A = 0 under every baseline (mean = min, std = 0).

    ``std="population"`` divides by n (the paper's text), ``"bessel"`` by n − 1 (the authors' code). A group of
    size 1 has mean 0 and std 1 by convention (so A = r/(1+ε) for scale="group"). Groups whose advantages are
    all 0 (e.g. all rewards equal) give no gradient; they are counted in ``zero_adv_groups``.

    Args:
        rewards: (N,) float.
        group_ids: (N,) int, equal ids = same prompt (any values, any order).
    Returns:
        ((N,) float32 advantages, stats of 0-d tensors: zero_adv_groups, num_groups, adv_mean, adv_std,
        adv_abs_max, reward_mean, reward_std).
    """
    _check("std", std, STD_MODES)
    _check("scale", scale, SCALE_MODES)
    _check("baseline", baseline, BASELINES)
    assert rewards.dim() == 1 and rewards.shape == group_ids.shape, (rewards.shape, group_ids.shape)
    r = rewards.detach().double()
    uniq, inv = torch.unique(group_ids, return_inverse=True)
    g = uniq.numel()
    cnt = torch.zeros(g, dtype=torch.float64, device=r.device).index_add_(0, inv, torch.ones_like(r))
    mean = torch.zeros(g, dtype=torch.float64, device=r.device).index_add_(0, inv, r) / cnt.clamp(min=1)
    sq = torch.zeros(g, dtype=torch.float64, device=r.device).index_add_(0, inv, (r - mean[inv]) ** 2)
    dof = cnt if std == "population" else cnt - 1
    gstd = torch.sqrt(sq / dof.clamp(min=1))
    single = cnt <= 1
    mean = torch.where(single, torch.zeros_like(mean), mean)  # documented convention for singleton groups
    gstd = torch.where(single, torch.ones_like(gstd), gstd)
    if baseline == "mean":
        base = mean
    elif baseline == "asymre":
        gmin = torch.full((g,), torch.inf, dtype=torch.float64, device=r.device).scatter_reduce(
            0, inv, r, reduce="amin", include_self=True
        )
        gmin = torch.where(single, torch.zeros_like(gmin), gmin)  # singleton: mean 0 by convention, min likewise
        base = mean - alpha * (mean - gmin)
    else:
        base = mean - alpha * gstd
    adv = r - base[inv]
    if scale == "group":
        adv = adv / (gstd[inv] + eps)
    elif scale == "batch":
        n = r.numel()
        bstd = r.std(correction=0 if std == "population" else 1) if n > 1 else torch.ones((), dtype=r.dtype)
        adv = adv / (bstd + eps)
    nonzero = torch.zeros(g, dtype=torch.float64, device=r.device).index_add_(0, inv, (adv != 0).double())
    adv32 = adv.float()
    stats = {
        "zero_adv_groups": (nonzero == 0).sum().float(),
        "num_groups": torch.tensor(float(g)),
        "adv_mean": adv32.mean() if adv32.numel() else torch.zeros(()),
        "adv_std": adv32.std(correction=0) if adv32.numel() else torch.zeros(()),
        "adv_abs_max": adv32.abs().max() if adv32.numel() else torch.zeros(()),
        "reward_mean": r.mean().float() if r.numel() else torch.zeros(()),
        "reward_std": r.std(correction=0).float() if r.numel() else torch.zeros(()),
    }
    return adv32, stats


def overlong_penalty(lengths: torch.Tensor, max_len: int, buffer: int, factor: float = 1.0) -> torch.Tensor:
    """DAPO's soft overlong punishment, added to the reward by the training loop, (N,) float32 ≤ 0:

        0                          if L ≤ L_max − L_c
        ((L_max − L_c) − L)/L_c·f  if L_max − L_c < L ≤ L_max
        −f                         if L > L_max

    Args: lengths (N,) int response lengths L; max_len L_max; buffer L_c (0 < L_c ≤ L_max); factor f.
    """
    if not 0 < buffer <= max_len:
        raise ConfigError(f"overlong buffer must be in (0, max_len={max_len}], got {buffer}")
    length = lengths.float()
    start = float(max_len - buffer)
    pen = (start - length) / buffer * factor
    pen = torch.where(length <= start, torch.zeros_like(pen), pen)
    return torch.where(length > max_len, torch.full_like(pen, -factor), pen)
