"""One update's statistics (phase 4 of `p3o.train.step.UpdateStep`): tensors accumulated per micro-batch and per
optimizer step, then reduced over ranks in ONE sync (one `.tolist()`), so the update never waits on the host midway.

    stats = UpdateStats(device)
    stats.add_micro(objective_stats, mask, entropy)     # per micro-batch, weighted by its valid tokens
    stats.add_step(loss, grad_norm)                      # per optimizer step
    row = stats.reduce(optimizer)                        # {stat, "entropy", "loss", "grad_norm", "lr", ...}
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from torch import Tensor

from p3o import dist

__all__ = ["UpdateStats"]

_MAX_KEYS = ("ratio_max",)
_MIN_KEYS = ("ratio_min",)


@dataclass
class UpdateStats:
    """One update's statistics as float64 tensors on `device` until the single sync of `reduce`.

    Per micro-batch (`add_micro`): the objective's stats weighted by its valid tokens w (`ratio_max` a max,
    `ratio_min` a min) and the entropy's token sum; per optimizer step (`add_step`): the loss and the grad norm.
    """

    device: torch.device
    sums: dict[str, Tensor] = field(default_factory=dict)
    maxes: dict[str, Tensor] = field(default_factory=dict)
    mins: dict[str, Tensor] = field(default_factory=dict)
    losses: list[Tensor] = field(default_factory=list)
    grad_norms: list[Tensor] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.weight = torch.zeros((), dtype=torch.float64, device=self.device)
        self.ent_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        self.ent_count = torch.zeros((), dtype=torch.float64, device=self.device)

    def add_micro(self, st: Mapping[str, Tensor], mask: Tensor, entropy: Tensor | None) -> None:
        """Add one micro-batch's objective stats (0-d each) and its token entropies (n, t) under `mask`."""
        w = mask.sum().to(torch.float64)
        self.weight += w
        for k, v in st.items():
            v = v.detach().reshape(()).to(torch.float64)
            if k in _MAX_KEYS:
                self.maxes[k] = v if k not in self.maxes else torch.maximum(self.maxes[k], v)
            elif k in _MIN_KEYS:
                self.mins[k] = v if k not in self.mins else torch.minimum(self.mins[k], v)
            else:
                self.sums[k] = self.sums.get(k, torch.zeros((), dtype=torch.float64, device=self.device)) + v * w
        if entropy is not None:
            self.ent_sum += entropy.detach().to(torch.float64)[mask].sum()
            self.ent_count += w

    def add_step(self, loss: Tensor, grad_norm: Tensor) -> None:
        """Add one optimizer step's loss (summed over ranks) and gradient norm."""
        self.losses.append(loss)
        self.grad_norms.append(grad_norm)

    def reduce(self, optimizer: torch.optim.Optimizer) -> dict[str, float]:
        """Means (token-weighted, averaged over ranks), maxes and mins over ranks, the mean loss and grad norm, in
        one sync: `{stat: float, "entropy", "loss", "grad_norm", "lr", "optimizer_steps"}`."""
        dev = self.device
        mean_keys = sorted(self.sums)
        means = [self.sums[k] / self.weight.clamp(min=1) for k in mean_keys]
        means += [self.ent_sum / self.ent_count.clamp(min=1)]
        vec = dist.all_reduce_mean(torch.stack(means).float()) if means else torch.zeros(0, device=dev)
        empty = torch.zeros(0, device=dev)  # an objective may report no max / min stat at all
        maxes = [self.maxes[k] for k in _MAX_KEYS if k in self.maxes]
        mins = [self.mins[k] for k in _MIN_KEYS if k in self.mins]
        maxes_t = dist.all_reduce_max(torch.stack(maxes).float().reshape(-1)) if maxes else empty
        mins_t = dist.all_reduce_min(torch.stack(mins).float().reshape(-1)) if mins else empty
        tail = torch.stack([torch.stack(self.losses).mean(), torch.stack(self.grad_norms).mean()])
        values = torch.cat([vec, maxes_t, mins_t, tail]).tolist()
        keys = [*mean_keys, "entropy"]
        keys += [k for k in _MAX_KEYS if k in self.maxes] + [k for k in _MIN_KEYS if k in self.mins]
        keys += ["loss", "grad_norm"]
        out = dict(zip(keys, values))
        out["lr"] = float(optimizer.param_groups[0]["lr"])
        out["optimizer_steps"] = float(len(self.losses))
        return out
