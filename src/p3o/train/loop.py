"""The training loop: sync, stale, async and reuse pipelines around the ONE update step.

    run_dir = run(load_config(["--loop.mode", "async", "--loop.max_lag", "2"]))

One loop serves every regime; only the batch source differs (see `p3o.train.buffer`):

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

The data stream and producer are `p3o.train.stream`; turning the config into objects is `p3o.train.wiring`.
"""

from __future__ import annotations

import contextlib
import random
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from p3o import dist
from p3o.train.buffer import BatchSource, make_source, token_lag
from p3o.train.step import update
from p3o.train.stream import PromptStream, make_producer, stream_seed
from p3o.train.wiring import (
    Components,
    build_components,
    build_optimizer,
    check_run_dir,
    engine_model,
    save_loop_checkpoint,
    sync_weights,
)
from p3o.types import Rollouts


def evaluate(comps: Components, seed: int, batch_size: int = 64) -> dict[str, float]:
    """pass@1 on the held-out prompts: one sample each from a fresh engine copy of the current policy (fixed seeds),
    by the one evaluation sampler (`p3o.eval.runner.heldout_metrics`, the rollout engine's own settings).

    Returns {"eval_accuracy": fraction with score > 0.5, "eval_score": mean score} ({} without eval prompts).
    """
    from p3o.eval.runner import heldout_metrics

    return heldout_metrics(
        engine_model(comps.policy),
        comps.tokenizer,
        comps.eval_prompts,
        comps.eval_answers,
        comps.reward_fn,
        n_samples=1,
        batch_seed=lambda lo: stream_seed(seed, lo, 99991),
        engine=comps.make_engine,
        batch_size=batch_size,
    )


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
    lag = token_lag(batch, version).float()
    if lag.numel() == 0:
        return {"lag_min": 0.0, "lag_mean": 0.0, "lag_max": 0.0}
    lo, mean, hi = torch.stack([lag.min(), lag.mean(), lag.max()]).tolist()
    return {"lag_min": lo, "lag_mean": mean, "lag_max": hi}


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
    vec = dist.all_reduce_sum(torch.tensor([values[k] for k in keys], dtype=torch.float64)).tolist()
    w = dist.world_size()
    return {k: (v if k in summed else v / w) for k, v in zip(keys, vec)}


def run(cfg: Any, *, components: Components | None = None) -> Path:
    """Train with `cfg` (a validated `p3o.config.TrainConfig`) and return the run directory.

    `components` replaces `build_components(cfg)` (tests pass tiny fakes). Writes run_dir/config.yaml,
    metrics.jsonl, checkpoints/, final/ and plot.png (rank 0).

    A run never silently replaces another (`p3o.train.wiring.check_run_dir`): a fresh run refuses a run_dir holding
    an earlier run's outputs unless `cfg.overwrite`, in which case they are removed once the components are built.
    `ckpt.resume` continues from the latest checkpoint; with none it starts from step 0, except over a finished
    run's final/ (a run saved without checkpoints), which it refuses.
    """
    import dataclasses

    from p3o.config import objective_hyper, save_config, to_dict
    from p3o.metrics import MetricsLogger, ProgressBar
    from p3o.objectives import get_objective
    from p3o.train.checkpoint import clear_run_outputs, load_checkpoint, run_outputs, save_policy

    # 1. the run directory and the components
    dist.init_from_env()
    _seed_everything(stream_seed(cfg.seed, dist.rank()))
    run_dir = Path(cfg.run_dir)
    check_run_dir(run_dir, resume=cfg.ckpt.resume, overwrite=cfg.overwrite)
    comps = components if components is not None else build_components(cfg)
    objective = get_objective(cfg.objective.name)
    hyper = objective_hyper(cfg.objective)
    needs = objective.inputs_needed(hyper)
    _attach_adapters_and_reference(cfg, comps, needs)
    policy = comps.policy
    optimizer, scheduler = build_optimizer(policy, cfg.optim, cfg.update, cfg.steps)

    # 2. resume (model, optimizer, scheduler, this rank's own RNG states and batch source)
    start, loop_state = 0, {}
    if cfg.ckpt.resume:
        found = load_checkpoint(run_dir, model=policy, optimizer=optimizer, scheduler=scheduler)
        if found is not None:
            start, loop_state = found["step"], found["loop_state"] or {}
            rng = (loop_state.get("rank_rng") or {}).get(dist.rank())  # a checkpoint of the previous format
            if rng is not None:
                torch.set_rng_state(rng)
    if dist.is_main():
        if start == 0 and run_outputs(run_dir):
            # --overwrite, or --resume with no checkpoint yet: the earlier outputs would mix with this run's (and
            # its checkpoints would be picked up by a later --resume)
            removed = clear_run_outputs(run_dir)
            print(f"p3o train: starting fresh in {run_dir}: removed {', '.join(removed)}", file=sys.stderr)
        # `overwrite` is an action, not a setting: rerunning the saved config must not delete this run
        save_config(dataclasses.replace(cfg, overwrite=False), run_dir / "config.yaml")

    # 3. the data stream, the engine and the batch source
    stream = PromptStream(len(comps.prompts), cfg.rollout.prompts_per_step, cfg.seed, dist.rank(), dist.world_size())
    produce = make_producer(cfg.rollout, cfg.loop, cfg.advantage, cfg.seed, comps, stream)
    engine = comps.make_engine(engine_model(policy))
    if start > 0:
        engine.load_weights(sync_weights(policy), start)
    lp = cfg.loop
    source: BatchSource = make_source(
        lp.mode,
        produce,
        engine,
        staleness=lp.staleness,
        max_lag=lp.max_lag,
        schedule=lp.schedule,
        epochs=lp.reuse_epochs,
        start_step=start,
        start_version=start,
        state=(loop_state.get("rank_source") or {}).get(dist.rank()),
    )

    # 4. the steps
    main = dist.is_main()
    logger = MetricsLogger(
        run_dir,
        to_dict(cfg) if main else None,
        enabled=main,
        tensorboard=cfg.log.tensorboard,
        wandb=cfg.log.wandb,
        wandb_project=cfg.log.wandb_project,
        truncate_after=start,  # a resumed run rewrites the steps after its checkpoint; a fresh one starts empty
    )
    bar = ProgressBar(
        cfg.steps, enabled=cfg.log.progress and main, description=f"p3o {cfg.objective.name}", start=start
    )
    up = cfg.update
    t_run = time.perf_counter()
    try:
        for step in range(start, cfg.steps):
            t0 = time.perf_counter()
            batch, info = source.get(step)
            info = dict(info)
            t_wait = time.perf_counter() - t0
            if lp.dynamic_sampling:
                batch = _trim_to_common(batch, info, cfg.rollout.group_size)
            lag = _lag_stats(batch, step)
            t1 = time.perf_counter()
            stats = update(
                policy,
                optimizer,
                scheduler,
                batch,
                objective,
                hyper,
                needs=needs,
                num_mini_batches=up.num_mini_batches,
                micro_batch_size=up.micro_batch_size,
                epochs=up.epochs,
                grad_clip=cfg.optim.grad_clip,
                temperature=cfg.train.temperature,
                ref_model=comps.ref_model,
                group=dist.group(),
                chunk_size=cfg.train.chunk_size,
            )
            t_sync = time.perf_counter()
            source.push_weights(sync_weights(policy), step + 1)
            t_sync = time.perf_counter() - t_sync
            t_train = time.perf_counter() - t1
            local = {**info, **_batch_stats(batch), **lag, "dropped_rows": float(source.dropped_rows)}
            row = {**_reduce_info(local), **stats}
            wall = time.perf_counter() - t0
            row.update(
                time_wait_s=t_wait,
                time_train_s=t_train,
                time_sync_s=t_sync,
                time_step_s=wall,
                time_s=time.perf_counter() - t_run,
                tokens_per_s=row["tokens"] / max(wall, 1e-9),
                version=float(step + 1),
            )
            if not source.overlaps_generation:  # sync-style sources generate inside get(); async overlaps it
                row["time_gen_s"] = t_wait
            every = cfg.log.eval_every
            # after the first update (≈ the starting policy), every `every` steps, and at the end
            if main and ((step == 0 and every) or (every and (step + 1) % every == 0) or step + 1 == cfg.steps):
                t_eval = time.perf_counter()
                row.update(evaluate(comps, cfg.seed))
                row["time_eval_s"] = time.perf_counter() - t_eval
            bar.update(step + 1, row)
            if (step + 1) % cfg.log.every == 0 or step + 1 == cfg.steps:
                logger.log(step + 1, row)  # `step` in metrics.jsonl = completed steps (1-based), as in checkpoints
            # also at the last step, so `--resume` on a finished run has nothing left to redo
            if cfg.ckpt.every and ((step + 1) % cfg.ckpt.every == 0 or step + 1 == cfg.steps):
                save_loop_checkpoint(run_dir, step + 1, comps, optimizer, scheduler, source, cfg.ckpt.keep_last)
    finally:
        source.close()
        bar.close()
        logger.close()

    # 5. the final policy and its plot
    if dist.is_main():
        save_policy(run_dir / "final", engine_model(policy), comps.tokenizer)  # LoRA: merged, plain HF
        if cfg.log.plot:
            from p3o.metrics import plot_run

            with contextlib.suppress(Exception):  # a plot must never fail a finished run
                plot_run(run_dir)
    dist.barrier()
    return run_dir


def _attach_adapters_and_reference(cfg: Any, comps: Components, needs: frozenset[str]) -> None:
    """LoRA adapters on the policy (`model.lora.r` > 0) and the frozen reference the objective may need."""
    import copy

    if cfg.model.lora.r:
        from p3o.models.lora import AdaptersOff, apply_lora, is_lora

        if not is_lora(comps.policy):  # same seed on every rank: identical adapters
            comps.policy = apply_lora(comps.policy, cfg.model.lora, seed=cfg.seed)
        if comps.ref_model is None and ("ref_logp" in needs or cfg.train.ref_model):
            comps.ref_model = AdaptersOff(comps.policy)  # the base itself, adapters disabled: no second copy
    else:
        comps.policy.requires_grad_(True)
    if "ref_logp" in needs and comps.ref_model is None:
        comps.ref_model = copy.deepcopy(comps.policy).eval().requires_grad_(False)


__all__ = ["evaluate", "run"]
