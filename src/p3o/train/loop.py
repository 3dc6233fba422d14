"""The training loop: sync, stale, async and reuse pipelines around the ONE update step.

    run_dir = run(load_config(["--loop.mode", "async", "--loop.max_lag", "2"]))

One loop serves every regime; only the batch source differs (see `p3o.train.sources`):

    for step s in [start, steps):
        batch  = source.get(s)            # sync: produce(s) now · stale: FIFO, produced at s − n ·
                                          # async: from the generator thread, ≤ max_lag versions old · reuse
        stats  = update(policy, ..., batch)           # p3o.train.step: mini-/micro-batches, one objective
        source.push_weights(policy, version = s + 1)  # the engine samples with the new weights
        log one JSONL line; checkpoint every ckpt.every steps

`produce(b, engine)` makes the b-th batch of the data stream: its prompts, the sampling seed and the data order are
functions of (seed, b, rank) only, so a resumed run sees exactly the batches an uninterrupted run would have seen
(bit-identical parameters on CPU in the sync, stale, reuse and async-fixed modes; `loop.schedule free` is
timing-dependent by design).
It generates G completions per prompt, scores them with the verifier, adds DAPO's soft overlong penalty
(optional), drops groups whose rewards are all equal and refills (DAPO dynamic sampling, optional) and
computes group-relative advantages.

The policy version is the number of completed update calls: the engine starts at version 0, the batch trained at
step s is compared against trainer version s, and `lag = s − policy_version` of every valid token is logged.

Data parallel (torchrun, gloo/nccl): every rank generates prompts_per_step / world_size prompts with its own seed,
the update all-reduces the token count, ESS sums and gradients, rank 0 writes metrics and checkpoints.

The data stream and the producer are `p3o.train.sources` too; the config turns into objects in `p3o.train.wiring`. With
`rollout.workers` > 0 the batch source is the caller's `remote_source` (`p3o train` hands over
`p3o.cluster.RaySource`, rollout workers as Ray actors: docs/training.md); train/ never imports the Ray layer.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from p3o import dist
from p3o.config import objective_hyper, save_config, to_dict
from p3o.errors import ConfigError
from p3o.metrics import MetricsLogger, ProgressBar, plot_run
from p3o.metrics.monitor import OffPolicyMonitor
from p3o.models.lora import AdaptersOff, apply_lora, is_lora
from p3o.objectives import get_objective
from p3o.train.evaluation import Evaluator
from p3o.train.placement import EvaluationWeights, Placement, PlacementSettings, check_placement
from p3o.train.run_dir import clear_run_outputs, earlier_run, run_outputs
from p3o.train.sources import BatchSource, Producer, PromptStream, RemoteSource, make_source, stream_seed, token_lag
from p3o.train.step import ObjectiveCall, UpdateSettings, UpdateStep
from p3o.train.wiring import (
    Components,
    build_components,
    build_optimizer,
    check_run_dir,
    resolve_device,
    worker_config,
)
from p3o.types import Rollouts


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _trim_to_common(batch: Rollouts, info: dict[str, float], group_size: int) -> Rollouts:
    """Data parallel + dynamic sampling: every rank trains on the same number of groups (the minimum)."""
    if dist.world_size() == 1:
        return batch
    n_groups = dist.all_reduce_min(torch.tensor([len(batch) // group_size]))
    keep = int(n_groups.item()) * group_size
    if keep < len(batch):
        info["trimmed_rows"] = float(len(batch) - keep)
        batch = batch.select(list(range(keep)))
    return batch


def _lag_stats(batch: Rollouts, version: int) -> dict[str, float]:
    """lag_min / lag_mean / lag_max over the valid tokens, and the histogram lag_hist_k = share of tokens k versions
    old (k = 0 .. lag_max)."""
    lag = token_lag(batch, version)
    if lag.numel() == 0:
        return {"lag_min": 0.0, "lag_mean": 0.0, "lag_max": 0.0}
    lo, mean, hi = torch.stack([lag.min().float(), lag.float().mean(), lag.max().float()]).tolist()
    hist = (torch.bincount(lag.clamp(min=0).cpu()).double() / lag.numel()).tolist()
    return {"lag_min": lo, "lag_mean": mean, "lag_max": hi, **{f"lag_hist_{k}": h for k, h in enumerate(hist)}}


def _batch_stats(batch: Rollouts) -> dict[str, float]:
    lengths = batch.mask.sum(-1).float()
    vals = torch.stack(
        [
            batch.rewards.float().mean(),
            batch.rewards.float().std(correction=0)
            if len(batch) > 1
            else torch.zeros((), device=batch.rewards.device),
            lengths.mean().to(batch.rewards.device),
            batch.truncated.float().mean().to(batch.rewards.device),
            batch.mask.sum().float().to(batch.rewards.device),
        ]
    ).tolist()
    return dict(zip(["reward_mean", "reward_std", "response_len_mean", "truncated_frac", "tokens"], vals))


def _reduce_info(values: dict[str, float]) -> dict[str, float]:
    """Average the per-rank batch statistics over ranks (sum for counts); identity at world size 1."""
    if dist.world_size() == 1:
        return values
    keys = sorted(values)
    summed = {"tokens", "zero_adv_groups", "num_groups", "generated", "dropped_rows", "trimmed_rows"}
    summed |= {"reward/timeouts", "reward/restarts", "reward/errors"}  # the verifier's counts: every rank's
    vec = dist.all_reduce_sum(torch.tensor([values[k] for k in keys], dtype=torch.float64)).tolist()
    w = dist.world_size()
    return {k: (v if k in summed else v / w) for k, v in zip(keys, vec)}


class Trainer:
    """One training run as an object: `setup` (run dir, components, resume, batch source), `step` (one update and
    its metrics row), `save` (a checkpoint), `finish` (final/ and the plot), `close` (the batch source and logs).
    `run` drives it with a linear loop body.

    With `rollout.workers` > 0 the batch source is `remote_source` (handed over by the caller, which sits above this
    floor: `p3o train` passes `p3o.cluster.RaySource`, rollout workers as Ray actors) and the in-loop evaluation runs
    on a worker; otherwise the engine lives in this process.
    """

    def __init__(
        self, cfg: Any, components: Components | None = None, remote_source: RemoteSource | None = None
    ) -> None:
        self.cfg = cfg
        self.comps: Components | None = components
        self.remote_source = remote_source
        self.run_dir = Path(cfg.run_dir)
        self.source: BatchSource | None = None
        self.workers: Any = None  # a harness run with rollout.workers > 0: the Ray workers its endpoints serve through
        self.engines: list[Any] = []  # the in-process engines built here (rollout, evaluation): closed with the run
        self.logger: Any = None
        self.bar: Any = None
        self._eval_view: EvaluationWeights | None = None  # the weights of the evaluation under way

    # -- setup ---------------------------------------------------------------------------------------
    def setup(self) -> int:
        """Build everything the steps need; returns the first step to run (0, or the resumed checkpoint's)."""
        cfg, run_dir = self.cfg, self.run_dir
        # 1. the run directory and the components
        dist.init_from_env(force=cfg.train.strategy == "fsdp", cpu_offload=cfg.train.cpu_offload)
        check_placement(PlacementSettings.of(cfg), resolve_device(cfg.model.device))
        _preflight(cfg, self.remote_source)
        _seed_everything(stream_seed(cfg.seed, dist.rank()))
        check_run_dir(run_dir, resume=cfg.ckpt.resume, overwrite=cfg.overwrite)
        self.comps = self.comps if self.comps is not None else build_components(cfg)
        self._build_update(self.comps)
        # 2. resume (model, optimizer, scheduler, this rank's own RNG states, the monitor's window, the batch source)
        start, loop_state = 0, {}
        if cfg.ckpt.resume:
            found = self.placement.load_checkpoint(run_dir, self.optimizer, self.scheduler)
            if found is not None:
                start, loop_state = found["step"], found["loop_state"] or {}
                rng = (loop_state.get("rank_rng") or {}).get(dist.rank())  # a checkpoint of the previous format
                if rng is not None:
                    torch.set_rng_state(rng)
        if dist.is_main():
            if self.placement.strategy != "single" or self.placement.precision != "no":  # one process, no cast: quiet
                print(f"p3o train: {self.placement.summary()}", file=sys.stderr)
            run_dir.mkdir(parents=True, exist_ok=True)  # only now: what a start can refuse was checked or built above
            if start == 0 and run_outputs(run_dir):
                # --overwrite, or --resume with no checkpoint yet: the earlier outputs would mix with this run's (and
                # its checkpoints would be picked up by a later --resume)
                removed = clear_run_outputs(run_dir)
                print(f"p3o train: starting fresh in {run_dir}: removed {', '.join(removed)}", file=sys.stderr)
            # `overwrite` is an action, not a setting: rerunning the saved config must not delete this run. A resumed
            # run keeps its first config.yaml (its changes: config_history.jsonl, p3o.train.resume)
            if start == 0 or not (run_dir / "config.yaml").is_file():
                save_config(dataclasses.replace(cfg, overwrite=False), run_dir / "config.yaml")
        self.monitor.load_state(loop_state.get("monitor"))  # its window, so resumed metrics equal uninterrupted ones
        # 3. logs
        main = dist.is_main()
        record = to_dict(cfg)  # the run's config as a plain dict: the logs' record, the findings' advice
        self.logger = MetricsLogger(
            run_dir,
            record if main else None,
            enabled=main,
            tensorboard=cfg.log.tensorboard,
            wandb=cfg.log.wandb,
            wandb_project=cfg.log.wandb_project,
            truncate_after=start,  # a resumed run rewrites the steps after its checkpoint; a fresh one starts empty
        )
        # 4. the batch source: in this process, or Ray rollout workers
        self.source = self._make_source(start, _own_source_state(loop_state, start))
        self.bar = ProgressBar(  # the run's config: the findings' advice fits it (p3o.metrics.rules.suggest)
            cfg.steps,
            enabled=cfg.log.progress and main,
            description=cfg.objective.name,
            start=start,
            config=record,
        )
        self.evaluator = self.bar.wrap_evaluation(self.evaluator)  # the bar shows the evaluation phase
        self.t_run = time.perf_counter()
        return start

    def _build_update(self, comps: Components) -> None:
        """The objective (resolved once: defaults, spellings, types), the off-policy monitor, LoRA adapters and the
        reference model, the optimizer and its schedule, and the update step that holds them with its settings."""
        cfg = self.cfg
        objective = get_objective(cfg.objective.name).bind(objective_hyper(cfg.objective))
        # the off-policy monitor (p3o.metrics.monitor): the same statistics any other trainer gets, as offpolicy/*. Its
        # findings are left to `p3o doctor` (warn=False): its position-drift rule does not yet separate staleness
        # from engine drift, and under the default lag of 2 it would print a KV-cache suggestion that does not apply
        self.monitor = OffPolicyMonitor(  # the run's config: an in-flight run's fresh mismatch is named as such
            max_len=cfg.rollout.max_new_tokens, group=dist.group(), warn=False, config=to_dict(cfg)
        )
        _attach_adapters_and_reference(cfg, comps, objective.needs)
        # the one place the policy is placed (DDP / FSDP2, compute precision): before the optimizer sees its parameters
        self.placement = Placement(comps.policy, PlacementSettings.of(cfg))
        self.optimizer, self.scheduler = build_optimizer(comps.policy, cfg.optim, cfg.update, cfg.steps)
        self.update_step = UpdateStep(
            comps.policy,
            self.optimizer,
            self.scheduler,
            ObjectiveCall.of(objective),
            UpdateSettings.of(cfg),
            ref_model=comps.ref_model,
            group=dist.group(),
            monitor=self.monitor,
            placement=self.placement,
        )

    def _make_source(self, start: int, state: dict[str, Any] | None) -> BatchSource:
        cfg, comps = self.cfg, self.comps
        assert comps is not None
        lp = cfg.loop
        placement = self.placement
        harness = bool(getattr(cfg.agent, "harness", None))
        if cfg.rollout.workers and not harness:
            assert self.remote_source is not None
            source = self.remote_source(cfg, self.run_dir, self._push_weights(), start_step=start, state=state)
            self.evaluator: Any = source.evaluate
            return source
        side = comps.rollout_side()
        if cfg.rollout.workers:  # a harness run: its episodes and endpoints here, every engine call in a Ray worker
            assert self.remote_source is not None and side.serve_through is not None
            self.workers = self.remote_source(worker_config(cfg), self.run_dir, self._push_weights(), start_step=start)
            side.serve_through(self.workers)
        stream = PromptStream(
            len(side.prompts), cfg.rollout.prompts_per_step, cfg.seed, dist.rank(), dist.world_size()
        )
        produce = Producer(cfg.rollout, lp, cfg.advantage, cfg.seed, side, stream)
        engine = side.make_engine(placement.engine_model())
        if start > 0:
            engine.load_weights(placement.weights(), start)  # type: ignore[arg-type]
        evaluator = Evaluator(side, cfg.seed)
        self.engines = [engine, evaluator]

        def in_process(version: int) -> dict[str, float]:
            view = self._eval_view  # set by `_evaluate` (under FSDP rank 0's gathered weights)
            assert view is not None
            return evaluator(version, view.weights, view.model)

        self.evaluator = in_process
        return make_source(lp, produce, engine, start=start, state=state)

    def _push_weights(self) -> Any:
        """What a weight push sends (`Placement.push_weights`: Ray workers under FSDP get rank 0's full state)."""
        return self.placement.push_weights(remote=bool(self.cfg.rollout.workers))

    def _evaluate(self, version: int) -> tuple[dict[str, float], float] | None:
        """The held-out evaluation of the policy at `version`: (its row, seconds) on rank 0, None elsewhere. Every
        rank calls it: an in-process evaluation's weights come from `Placement.for_evaluation` (under FSDP gathered
        by every rank, a collective); Ray workers evaluate with the weights they were pushed."""
        if not self.cfg.rollout.workers or self.workers is not None:  # in-process evaluator
            self._eval_view = self.placement.for_evaluation()
        try:
            if not dist.is_main():
                return None
            t_eval = time.perf_counter()
            row = dict(self.evaluator(version))
            return row, time.perf_counter() - t_eval
        finally:
            self._eval_view = None

    def _eval_due(self, step: int) -> bool:
        every = self.cfg.log.eval_every
        return bool(every and (step + 1) % every == 0) or step + 1 == self.cfg.steps

    # -- one step ------------------------------------------------------------------------------------
    def step(self, step: int) -> dict[str, float]:
        """Train step `step` (0-based): get its batch, update, push version step + 1; returns its metrics row."""
        cfg, comps, source = self.cfg, self.comps, self.source
        assert comps is not None and source is not None
        t0 = time.perf_counter()
        batch, info = source.get(step)
        info = dict(info)
        t_wait = time.perf_counter() - t0
        if cfg.loop.dynamic_sampling:
            batch = _trim_to_common(batch, info, cfg.rollout.group_size)
        t1 = time.perf_counter()
        stats = self.update_step.run(batch, version=step)
        # every rank: it reduces over the data-parallel group; the step's groups over all ranks feed its no-signal rule
        signal = {k: float(info.get(k, 0.0)) for k in ("zero_adv_groups", "num_groups")}
        signal = _reduce_info({**signal, "reward_mean": float(batch.rewards.float().mean())})
        offpolicy = self.monitor.update(step=step + 1, signal=signal)
        t_sync = time.perf_counter()
        source.push_weights(self._push_weights(), step + 1)
        t_sync = time.perf_counter() - t_sync
        t_train = time.perf_counter() - t1
        lag = _lag_stats(batch, step)  # the batch as trained at version `step` (the update does not change it)
        local = {**info, **_batch_stats(batch), **lag, "dropped_rows": float(source.dropped_rows), **source.metrics()}
        row = {**_reduce_info(local), **stats, **{f"offpolicy/{k}": v for k, v in offpolicy.items()}}
        wall = time.perf_counter() - t0
        row.update(
            time_wait_s=t_wait,
            time_train_s=t_train,
            time_sync_s=t_sync,
            time_step_s=wall,
            time_s=time.perf_counter() - self.t_run,
            tokens_per_s=row["tokens"] / max(wall, 1e-9),
            version=float(step + 1),
            world_size=float(dist.world_size()),  # recorded: a resume may change it (an operational setting)
        )
        if not source.overlaps_generation:  # sync-style sources generate inside get(); async overlaps it
            row["time_gen_s"] = t_wait
        # every `log.eval_every` steps and at the end (the starting policy is the step-0 row: `evaluate_start`)
        evaluated = self._evaluate(step + 1) if self._eval_due(step) else None
        if evaluated is not None:
            row.update(evaluated[0], time_eval_s=evaluated[1])
        return row

    def evaluate_start(self) -> None:
        """Held-out pass@1 of the starting policy (version 0, before any update) as the step-0 row of metrics.jsonl
        (``eval_accuracy``, ``eval_score``, ``time_eval_s`` only), when in-loop evaluation is on (`log.eval_every`
        > 0); rank 0. The evaluation samples with its own seeded generators, so the training that follows is the
        same with or without it."""
        if not self.cfg.log.eval_every:
            return
        evaluated = self._evaluate(0)
        if evaluated is not None and evaluated[0]:
            self.logger.log(0, {**evaluated[0], "time_eval_s": evaluated[1]})

    def log(self, step: int, row: dict[str, float]) -> None:
        """Progress bar and metrics.jsonl (`step` there = completed steps, 1-based, as in checkpoints)."""
        self.bar.update(step + 1, row)
        if (step + 1) % self.cfg.log.every == 0 or step + 1 == self.cfg.steps:
            self.logger.log(step + 1, row)

    def checkpoint_due(self, step: int) -> bool:
        """Every `ckpt.every` steps, and also at the last one (so `--resume` on a finished run has nothing to redo)."""
        every = self.cfg.ckpt.every
        return bool(every) and ((step + 1) % every == 0 or step + 1 == self.cfg.steps)

    def save(self, completed: int) -> None:
        """A checkpoint after `completed` steps (policy, optimizer, scheduler, RNG, the batch source's state)."""
        assert self.comps is not None and self.source is not None
        self.placement.save_checkpoint(
            self.run_dir,
            completed,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            source_state=self.source.state(),
            keep_last=self.cfg.ckpt.keep_last,
            tokenizer=self.comps.tokenizer,
            extra={"monitor": self.monitor.state()},
        )

    # -- the end -------------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the batch source (threads, Ray workers), then the engines (a harness run's endpoints and harness
        processes; a vLLM engine's instance released), and close the logs; safe to call after a failure."""
        for closer in (self.source, self.workers):
            if closer is not None:
                closer.close()
        for engine in self.engines:  # the evaluator closes the engine it built, if any
            if callable(getattr(engine, "close", None)):
                engine.close()
        for closer in (self.bar, self.logger):
            if closer is not None:
                closer.close()

    def finish(self) -> None:
        """final/ (LoRA: merged, plain HF) and plot.png on rank 0, then a barrier."""
        assert self.comps is not None
        self.placement.save_final(self.run_dir / "final", self.comps.tokenizer)  # every rank: FSDP gathers
        if dist.is_main() and self.cfg.log.plot:
            with contextlib.suppress(Exception):  # a plot must never fail a finished run
                plot_run(self.run_dir)
        dist.barrier()


def run(cfg: Any, *, components: Components | None = None, remote_source: RemoteSource | None = None) -> Path:
    """Train with `cfg` (a validated `p3o.config.TrainConfig`) and return the run directory.

    `components` replaces `build_components(cfg)` (tests pass tiny fakes). `remote_source` builds the batch source
    when `rollout.workers` > 0 (`p3o.cluster.RaySource`; `p3o train` passes it). Writes run_dir/config.yaml,
    metrics.jsonl, checkpoints/, final/ and plot.png (rank 0).

    A run never silently replaces another (`p3o.train.wiring.check_run_dir`): a fresh run refuses a run_dir holding
    an earlier run that completed a step unless `cfg.overwrite`, in which case its outputs are removed once the
    components are built (so is what a start that completed no step left). The run directory is created only then,
    and a start that fails before finishing removes the directory it created unless a step was recorded in it.
    `ckpt.resume` continues from the latest checkpoint; with none it starts from step 0, except over a finished
    run's final/ (a run saved without checkpoints), which it refuses.
    """
    trainer = Trainer(cfg, components, remote_source)
    created, finished = not trainer.run_dir.exists(), False  # a start that fails before a step removes what it made
    try:
        start = trainer.setup()
        if start == 0:
            trainer.evaluate_start()
        for step in range(start, cfg.steps):
            row = trainer.step(step)
            trainer.log(step, row)
            if trainer.checkpoint_due(step):
                trainer.save(step + 1)
        finished = True
    finally:
        trainer.close()
        if created and not finished and dist.is_main() and not earlier_run(trainer.run_dir):
            shutil.rmtree(trainer.run_dir, ignore_errors=True)
    trainer.finish()
    return trainer.run_dir


def _own_source_state(loop_state: dict[str, Any], start: int) -> dict[str, Any] | None:
    """This rank's saved batch-source state (queued batches of the stale / async / reuse sources), or None.

    A checkpoint written at another world size holds batches cut for the other split (each rank's share of a batch
    differs): then no rank takes any, every source starts afresh at the resumed step from the current policy (as a
    fresh run at this world size from this checkpoint would), and rank 0 says so once."""
    saved = loop_state.get("rank_source") or {}
    if saved and len(saved) != dist.world_size():
        if dist.is_main() and any(saved.values()):
            print(
                f"p3o train: resuming at step {start} with {dist.world_size()} rank(s), the checkpoint was written by "
                f"{len(saved)}: its queued batches are dropped and the batch source refills from the current policy",
                file=sys.stderr,
            )
        return None
    return saved.get(dist.rank())


def _preflight(cfg: Any, remote_source: RemoteSource | None) -> None:
    """With `rollout.workers` > 0: a remote batch source must be handed over, and it checks what cannot work (Ray,
    its address, the workers' Python) before any model loads."""
    if not cfg.rollout.workers:
        return
    if remote_source is None:
        raise ConfigError(
            "rollout.workers: no remote batch source was handed to the loop; run `p3o train`, or pass "
            "remote_source=p3o.cluster.RaySource to p3o.train.loop.run"
        )
    remote_source.preflight(cfg)


def _attach_adapters_and_reference(cfg: Any, comps: Components, needs: frozenset[str]) -> None:
    """LoRA adapters on the policy (`model.lora.r` > 0) and the frozen reference the objective may need."""
    if cfg.model.lora.r:
        if not is_lora(comps.policy):  # same seed on every rank: identical adapters
            comps.policy = apply_lora(comps.policy, cfg.model.lora, seed=cfg.seed)
        if comps.ref_model is None and ("ref_logp" in needs or cfg.train.ref_model):
            comps.ref_model = AdaptersOff(comps.policy)  # the base itself, adapters disabled: no second copy
    else:
        comps.policy.requires_grad_(True)
    if "ref_logp" in needs and comps.ref_model is None:
        comps.ref_model = copy.deepcopy(comps.policy).eval().requires_grad_(False)


__all__ = ["Components", "RemoteSource", "Trainer", "run"]
