"""The ONE update step every training loop shares: mini-batches, micro-batches, the token normaliser, the ESS group.

A rollout batch of N sequences (this rank's share) is trained on for `epochs` passes; each pass splits it into
`num_mini_batches` contiguous mini-batches (one optimizer step each — several steps per batch, and several
epochs, make the data off-policy: knob 1 of docs/objectives.md) and each mini-batch into micro-batches of
`micro_batch_size` rows (gradient accumulation). For every micro-batch the objective receives

    num_tokens = Σ_{ranks} Σ_{micro-batches of the step} |valid tokens|     (the step's global token count)
    num_seqs   = Σ_{ranks} |sequences of the step|
    group      = the data-parallel group (the ESS sums are all-reduced over it)

so that Σ_{micro, ranks} loss_micro equals the loss of the whole step taken as one batch, and summing the
gradients over ranks (not averaging) gives exactly the world-size-1 gradient. Optional side inputs:
`old_logp` (no-grad log-probs of the trainer before the update: rollout correction), `prox_logp` (a no-grad
snapshot at the start of each epoch: decoupled PPO, two-anchor P3O), `ref_logp` (a frozen reference model),
a step-scope ESS and M2PO's step-level threshold (a no-grad pass over the mini-batch before its backward passes).
Statistics stay tensors until the end of the update and are synced once (one `.tolist()`).

    stats = update(policy, optimizer, scheduler, batch, get_objective("p3o"), {}, micro_batch_size=8)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from p3o import dist
from p3o.errors import ConfigError
from p3o.objectives.registry import BoundObjective, Objective
from p3o.types import Rollouts

SCHEDULES = ("constant", "cosine")


def make_optimizer(
    model: nn.Module,
    lr: float,
    *,
    weight_decay: float = 0.0,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
) -> torch.optim.AdamW:
    """AdamW over the trainable parameters of `model`."""
    if not lr > 0:
        raise ConfigError(f"optim.lr: must be > 0, got {lr}")
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay, eps=eps)


def lr_factor(step: int, *, warmup_steps: int, total_steps: int, schedule: str, min_factor: float = 0.1) -> float:
    """Multiplier of the base LR at optimizer step `step` (0-based): linear warmup, then constant or cosine.

    warmup: (step + 1) / warmup_steps for step < warmup_steps
    cosine: min_factor + (1 − min_factor)·½(1 + cos(π·p)),  p = (step − warmup) / (total − warmup) ∈ [0, 1]
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    span = max(1, total_steps - warmup_steps)
    p = min(1.0, (step - warmup_steps) / span)
    if schedule == "cosine":
        return min_factor + (1 - min_factor) * 0.5 * (1 + math.cos(math.pi * p))
    raise ConfigError(f"optim.schedule: unknown schedule {schedule!r}; known: {', '.join(SCHEDULES)}")


def make_scheduler(
    optimizer: torch.optim.Optimizer,
    *,
    warmup_steps: int,
    total_steps: int,
    schedule: str = "constant",
    min_factor: float = 0.0,
) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR stepping once per optimizer step with `lr_factor` (`min_factor`: the cosine floor)."""
    if schedule not in SCHEDULES:
        raise ConfigError(f"optim.schedule: unknown schedule {schedule!r}; known: {', '.join(SCHEDULES)}")
    if warmup_steps < 0:
        raise ConfigError(f"optim.warmup_steps: must be >= 0, got {warmup_steps}")

    def fn(step: int) -> float:
        return lr_factor(
            step, warmup_steps=warmup_steps, total_steps=total_steps, schedule=schedule, min_factor=min_factor
        )

    return torch.optim.lr_scheduler.LambdaLR(optimizer, fn)


@dataclass
class _Micro:
    """The tensors of one micro-batch, trimmed to its own padding. Shapes (n, p) prompt and (n, t) response."""

    rows: Tensor  # (n,) indices into the update's batch
    prompt_ids: Tensor
    prompt_mask: Tensor
    response_ids: Tensor
    mask: Tensor
    rollout_logp: Tensor
    advantages: Tensor
    t_full: int  # response width before trimming (side log-probs are stored at that width)


def _micro(batch: Rollouts, adv: Tensor, rows: Tensor) -> _Micro:
    """Rows `rows` of `batch`, with all-pad prompt columns (left) and all-pad response columns (right) dropped."""
    pm = batch.prompt_mask[rows]
    m = batch.mask[rows]
    p_keep = int(pm.any(0).nonzero().min()) if pm.any() else pm.shape[1] - 1
    t_keep = int(m.any(0).nonzero().max()) + 1 if m.any() else 1
    return _Micro(
        rows=rows,
        prompt_ids=batch.prompt_ids[rows][:, p_keep:],
        prompt_mask=pm[:, p_keep:],
        response_ids=batch.response_ids[rows][:, :t_keep],
        mask=m[:, :t_keep],
        rollout_logp=batch.rollout_logp[rows][:, :t_keep],
        advantages=adv[rows],
        t_full=batch.mask.shape[1],
    )


def _logprobs(
    model: nn.Module, mb: _Micro, temperature: float, chunk_size: int, with_entropy: bool
) -> tuple[Tensor, Tensor | None]:
    from p3o.logprobs import token_logprobs

    return token_logprobs(
        model,
        mb.prompt_ids,
        mb.prompt_mask,
        mb.response_ids,
        mb.mask,
        temperature=temperature,
        chunk_size=chunk_size,
        with_entropy=with_entropy,
    )


@torch.no_grad()
def _snapshot(model: nn.Module, micros: list[_Micro], n: int, t: int, temperature: float, chunk: int) -> Tensor:
    """(N, T) no-grad log-probs of every row of the batch under `model` (0 where masked)."""
    out = torch.zeros(n, t, dtype=torch.float32, device=micros[0].mask.device)
    for mb in micros:
        lp, _ = _logprobs(model, mb, temperature, chunk, False)
        out[mb.rows, : lp.shape[1]] = lp
    return out


def _split(n: int, parts: int) -> list[Tensor]:
    """`parts` contiguous, near-equal index chunks of range(n) (empty chunks dropped)."""
    return [c for c in torch.arange(n).chunk(parts) if c.numel()]


_MAX_KEYS = ("ratio_max",)
_MIN_KEYS = ("ratio_min",)


def update(
    policy: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    batch: Rollouts,
    objective_fn: Objective | BoundObjective | Callable[..., tuple[Tensor, dict[str, Tensor]]],
    hyper: dict[str, Any],
    *,
    needs: frozenset[str] | set[str] | None = None,
    num_mini_batches: int = 1,
    micro_batch_size: int = 8,
    epochs: int = 1,
    grad_clip: float = 1.0,
    temperature: float = 1.0,
    ref_model: nn.Module | None = None,
    group: Any = None,
    chunk_size: int = 256,
    monitor: Any = None,
    version: int = 0,
) -> dict[str, float]:
    """Train `policy` on `batch` (this rank's rows; `batch.advantages` (N,) must be set); returns the step's stats.

    For each epoch e and mini-batch k (rows split contiguously into `num_mini_batches` chunks):
    forward each micro-batch with grad, loss_micro = objective_fn(inputs, **hyper) with the step's global
    `num_tokens` / `num_seqs`, backward; then all-reduce (sum) the gradients over ranks, clip their global
    norm to `grad_clip` (≤ 0: no clipping), optimizer.step(), scheduler.step().

    Args:
        policy: the trainer's model (float32 on CPU here); its parameters are updated in place.
        batch: Rollouts with N rows; prompt_ids (N, P), response_ids / mask / rollout_logp (N, T), advantages (N,).
        objective_fn: an objective bound to its hyper-parameters once per run (`get_objective(name).bind(hyper)`;
            `hyper` must then be {}), a record (`p3o.objectives.get_objective(name)`, bound here once per update),
            or any `fn(ObjectiveInputs, **hyper) -> (loss 0-d, stats dict of 0-d tensors)`.
        needs: the optional inputs to compute and pass (exactly these; the others stay None). None: what the
            record says (`objective_fn.inputs_needed(hyper)`); a plain function then gets none.
        temperature: the trainer-side temperature of the log-probs (`train.temperature`).
        ref_model: frozen reference for `ref_logp` (required when "ref_logp" in needs).
        group: data-parallel process group for the ESS (None: the default group when distributed).
        monitor: a `metrics.monitor.OffPolicyMonitor` fed each micro-batch of the first epoch (the trainer's log-probs
            before this update moved them, against the recorded ones); the caller closes the step with
            `monitor.update()`. None: no monitoring.
        version: the trainer's policy version during this update (the monitor's lag = version − token version).
    Returns:
        Means over micro-batches (weighted by valid tokens) of the objective's stats (`ratio_max` the max,
        `ratio_min` the min), plus `loss` (mean per optimizer step), `grad_norm` (mean, before clipping), `lr`,
        `entropy` (token mean), `optimizer_steps`; averaged over ranks. Python floats.
    """
    from p3o.objectives import (
        Correction,
        ObjectiveInputs,
        correction_anchor,
        ess_from_parts,
        ess_parts,
        m2po_threshold,
    )

    if isinstance(objective_fn, Objective):
        objective_fn = objective_fn.bind(hyper)  # resolved once for this update, not per micro-batch
    elif isinstance(objective_fn, BoundObjective) and hyper:
        raise ValueError(f"update: objective {objective_fn.name!r} is bound; pass hyper={{}}, got {sorted(hyper)}")
    is_record = isinstance(objective_fn, BoundObjective)
    call_hyper: dict[str, Any] = {} if is_record else hyper
    if needs is None:
        needs = objective_fn.needs if is_record else frozenset()
    if "m2po_threshold" in needs:
        if not is_record:
            raise ValueError("update: the m2po_threshold pre-pass needs an objective record (for its tau)")
        tau = float(objective_fn.hyper["tau"])
    if batch.advantages is None:
        raise ValueError("update: batch.advantages is None (compute advantages before the update)")
    if num_mini_batches < 1 or micro_batch_size < 1 or epochs < 1:
        raise ConfigError(
            f"update: num_mini_batches, micro_batch_size and epochs must be >= 1, got "
            f"{num_mini_batches}, {micro_batch_size}, {epochs}"
        )
    if "ref_logp" in needs and ref_model is None:
        raise ValueError("update: the objective needs ref_logp (ref_kl_coef != 0) but no ref_model was given")
    device = next(policy.parameters()).device
    batch = batch.to(device)
    n, t = batch.mask.shape
    adv = batch.advantages.float()
    params = [p for p in policy.parameters() if p.requires_grad]
    minis = _split(n, num_mini_batches)
    # the micro-batches of each mini-batch (fixed for the whole update)
    plan = [[_micro(batch, adv, rows) for rows in mini.split(micro_batch_size)] for mini in minis]
    all_micros = [mb for mbs in plan for mb in mbs]
    # same number of optimizer steps / micro-batches on every rank, or the collectives would deadlock
    if dist.world_size() > 1:
        shape = torch.tensor([len(plan)] + [len(mbs) for mbs in plan], dtype=torch.long)
        lens = dist.all_gather_object(shape.tolist())
        if any(x != lens[0] for x in lens):
            raise ValueError(f"update: ranks disagree on the mini/micro-batch plan: {lens}")

    old_logp = None
    if "old_logp" in needs or "prox_logp" in needs:
        old_logp = _snapshot(policy, all_micros, n, t, temperature, chunk_size)
    # the objective's ratio anchor and mask: π_b, or π_θold with a rollout correction (less the rows it rejects)
    anchor, eff_mask = batch.rollout_logp, batch.mask
    if is_record and "old_logp" in needs:
        rc = objective_fn.hyper
        keys = ("rollout_correction", "rollout_correction_cap", "rollout_correction_low")
        corr = Correction(*(rc.get(k, d) for k, d in zip(keys, ("none", Correction.cap, Correction.low))))
        anchor, eff_mask = correction_anchor(batch.rollout_logp, batch.mask, old_logp, corr)
    rejected = (batch.mask & ~eff_mask).any(-1)  # (N,) rows a row-rejecting correction removes
    ref_logp = None
    if "ref_logp" in needs:
        assert ref_model is not None
        ref_logp = _snapshot(ref_model, all_micros, n, t, temperature, chunk_size)

    stat_sums: dict[str, Tensor] = {}
    stat_max: dict[str, Tensor] = {}
    stat_min: dict[str, Tensor] = {}
    # every accumulator lives on the device of what is added to it (the batch's, i.e. the policy's device)
    dev = batch.mask.device
    weight_sum = torch.zeros((), dtype=torch.float64, device=dev)
    ent_sum = torch.zeros((), dtype=torch.float64, device=dev)
    ent_count = torch.zeros((), dtype=torch.float64, device=dev)
    losses: list[Tensor] = []
    grad_norms: list[Tensor] = []
    for epoch in range(epochs):
        prox_logp = None
        if "prox_logp" in needs:  # π_prox: a snapshot at the start of each epoch (= old_logp for epoch 0)
            prox_logp = old_logp if epoch == 0 else _snapshot(policy, all_micros, n, t, temperature, chunk_size)
        for mini, micros in zip(minis, plan):
            num_tokens = dist.all_reduce_sum(eff_mask[mini].sum().to(torch.float32))
            num_seqs = dist.all_reduce_sum((len(mini) - rejected[mini].sum()).to(torch.float32))
            step_ess = thr = None
            if "step_ess" in needs or "m2po_threshold" in needs:
                with torch.no_grad():
                    lrs = []
                    for mb in micros:
                        lp, _ = _logprobs(policy, mb, temperature, chunk_size, False)
                        m = eff_mask[mb.rows, : mb.mask.shape[1]]
                        lrs.append(((lp - anchor[mb.rows, : mb.mask.shape[1]]) * m, m))
                    if "step_ess" in needs:
                        step_ess = ess_from_parts([ess_parts(lr, m) for lr, m in lrs], group)
                    if "m2po_threshold" in needs:
                        flat = torch.cat([lr[m] for lr, m in lrs])[None]  # (1, K) this rank's step tokens
                        thr = m2po_threshold(flat, torch.ones_like(flat, dtype=torch.bool), tau)
            step_loss = torch.zeros((), device=dev)
            for mb in micros:
                tt = mb.mask.shape[1]
                logp, ent = _logprobs(policy, mb, temperature, chunk_size, True)
                if monitor is not None and epoch == 0:
                    versions = batch.policy_version[mb.rows, :tt]
                    monitor.observe(logp.detach(), mb.rollout_logp, mb.mask, versions, version=version)
                inputs = ObjectiveInputs(
                    logp=logp,
                    rollout_logp=mb.rollout_logp,
                    mask=mb.mask,
                    advantages=mb.advantages,
                    old_logp=None if "old_logp" not in needs else old_logp[mb.rows, :tt],
                    prox_logp=None if prox_logp is None else prox_logp[mb.rows, :tt],
                    ref_logp=None if ref_logp is None else ref_logp[mb.rows, :tt],
                    entropy=ent if "entropy" in needs else None,
                    num_tokens=num_tokens,
                    num_seqs=num_seqs,
                    group=group,
                    step_ess=step_ess,
                    m2po_threshold=thr,
                )
                loss, st = objective_fn(inputs, **call_hyper)
                loss.backward()
                step_loss = step_loss + loss.detach()
                w = mb.mask.sum().to(torch.float64)
                weight_sum += w
                for k, v in st.items():
                    v = v.detach().reshape(()).to(torch.float64)
                    if k in _MAX_KEYS:
                        stat_max[k] = v if k not in stat_max else torch.maximum(stat_max[k], v)
                    elif k in _MIN_KEYS:
                        stat_min[k] = v if k not in stat_min else torch.minimum(stat_min[k], v)
                    else:
                        stat_sums[k] = stat_sums.get(k, torch.zeros((), dtype=torch.float64, device=dev)) + v * w
                if ent is not None:
                    ent_sum += ent.detach().to(torch.float64)[mb.mask].sum()
                    ent_count += w
            dist.all_reduce_grads_(params)
            max_norm = grad_clip if grad_clip and grad_clip > 0 else math.inf  # inf: measure, don't clip
            gn = torch.nn.utils.clip_grad_norm_(params, max_norm)
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(dist.all_reduce_sum(step_loss))
            grad_norms.append(gn.detach().float())

    # one sync for all stats: [means..., maxes..., mins...]
    mean_keys = sorted(stat_sums)
    means = [stat_sums[k] / weight_sum.clamp(min=1) for k in mean_keys]
    means += [ent_sum / ent_count.clamp(min=1)]
    vec = dist.all_reduce_mean(torch.stack(means).float()) if means else torch.zeros(0, device=dev)
    empty = torch.zeros(0, device=dev)  # an objective may report no max / min stat at all
    maxes = [stat_max[k] for k in _MAX_KEYS if k in stat_max]
    mins = [stat_min[k] for k in _MIN_KEYS if k in stat_min]
    maxes = dist.all_reduce_max(torch.stack(maxes).float().reshape(-1)) if maxes else empty
    mins = dist.all_reduce_min(torch.stack(mins).float().reshape(-1)) if mins else empty
    tail = torch.stack([torch.stack(losses).mean(), torch.stack(grad_norms).mean()])
    values = torch.cat([vec, maxes, mins, tail]).tolist()
    keys = [*mean_keys, "entropy"]
    keys += [k for k in _MAX_KEYS if k in stat_max] + [k for k in _MIN_KEYS if k in stat_min]
    keys += ["loss", "grad_norm"]
    out = dict(zip(keys, values))
    out["lr"] = float(optimizer.param_groups[0]["lr"])
    out["optimizer_steps"] = float(len(losses))
    return out


__all__ = ["SCHEDULES", "lr_factor", "make_optimizer", "make_scheduler", "update"]
