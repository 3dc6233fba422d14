"""`p3o train`: train a policy from the embedded defaults, a preset and dotted overrides.

    p3o train                                              # the main job: P3O on the built-in task, tiny model
    p3o train --config quick --objective.name grpo --objective.clip_eps 0.4
    p3o train --run_dir runs/x --resume                    # continue from the latest good checkpoint
    torchrun --nproc_per_node 2 -m p3o train --rollout.prompts_per_step 8   # data parallel (gloo on CPU)

Bad options print one line naming the key and exit with status 2.
"""

from __future__ import annotations

import os
import sys
import time
import typing
from typing import Any

# Before torch loads OpenMP: idle worker threads sleep instead of spinning. On a shared or oversubscribed CPU,
# spinning threads made 2-thread steps ~20x slower than 1-thread ones; sleeping costs little on an idle machine.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from p3o.errors import P3OError


def _summary(run_dir: str, wall_s: float) -> str:
    """A few lines for the console: where the run is, and how the reward moved."""
    from p3o.metrics import read_metrics

    lines = [f"run directory: {run_dir}  ({wall_s:.1f} s)"]
    try:
        rows = read_metrics(run_dir)
    except P3OError:
        rows = []
    rewards = [r["reward_mean"] for r in rows if isinstance(r.get("reward_mean"), int | float)]
    if rewards:
        k = max(1, min(5, len(rewards) // 4 or 1))
        first, last = sum(rewards[:k]) / k, sum(rewards[-k:]) / k
        lines.append(f"reward_mean: first {k} steps {first:.3f} -> last {k} steps {last:.3f}")
    return "\n".join(lines)


def ess_scope_warning(cfg: Any, world_size: int = 1) -> str | None:
    """The warning for a P3O run whose ESS set (a micro-batch) is smaller than its optimizer step, else None.

    P3O's e_B is taken per micro-batch by default (all-reduced over the data-parallel ranks), so with
    `update.micro_batch_size` below the sequences one rank trains per optimizer step the memory setting changes the
    objective. An explicit `objective.scope` (micro-batch, step or sequence) is a choice and silences it.
    """
    from p3o.objectives import get_objective

    name = cfg.objective.name
    rec = get_objective(name)
    # the record says whether the loss couples rows through a per-micro-batch statistic (M2PO's is step-wide)
    per_micro = rec.coupling != "row" and "m2po_threshold" not in rec.needs
    if not per_micro or "scope" in cfg.objective.hyper:
        return None
    per_rank = cfg.rollout.prompts_per_step * cfg.rollout.group_size // max(1, world_size)
    per_step = -(-per_rank // cfg.update.num_mini_batches)  # rows of this rank's largest mini-batch
    if cfg.update.micro_batch_size >= per_step:
        return None
    fix = (
        "--objective.scope step takes one ESS per optimizer step (an extra no-grad pass, ~20% of a step on the tiny "
        "model), --objective.scope micro-batch keeps this and silences the warning"
        if "scope" in rec.hypers and "step" in typing.get_args(rec.hypers["scope"].type)
        else f"{name} has no step scope; raise update.micro_batch_size to make it step-wide"
    )
    return (
        f"p3o train: warning: {name}'s ESS is taken per micro-batch of {cfg.update.micro_batch_size} sequences, fewer "
        f"than the {per_step} of an optimizer step{' per rank' if world_size > 1 else ''}, so "
        f"update.micro_batch_size is part of the objective; {fix}"
    )


def main(argv: list[str] | None = None, *, remote_source: Any = None) -> int:
    """Entry point of `p3o train` (see the module docstring); returns the exit status. `remote_source`: what builds
    the rollout workers' batch source (`p3o.cli` passes `p3o.cluster.RaySource`)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    from p3o.config import config_help, load_config

    if any(a in {"-h", "--help"} for a in argv):
        print("usage: p3o train [--config PRESET_OR_YAML] [--resume] [--key value ...]\n")
        print(config_help())
        return 0
    try:
        cfg = load_config(argv)
        from p3o.rollout.capabilities import check_rollout_backend

        # a setting this machine's rollout backend cannot run stops here, before any model loads
        check_rollout_backend(
            engine=cfg.rollout.engine,
            kv_cache_dtype=cfg.rollout.kv_cache_dtype,
            model_name=cfg.model.name,
            device=cfg.model.device,
        )
        from p3o import dist
        from p3o.train.checkpoint import run_outputs
        from p3o.train.loop import run

        world = int(os.environ.get("WORLD_SIZE", "1"))
        warning = ess_scope_warning(cfg, world)
        refused = run_outputs(cfg.run_dir) and not (cfg.ckpt.resume or cfg.overwrite)  # run() stops with one line
        if warning and not refused and os.environ.get("RANK", "0") == "0":
            print(warning, file=sys.stderr)

        t0 = time.perf_counter()
        run_dir = run(cfg, remote_source=remote_source)
        if dist.is_main():
            print(_summary(str(run_dir), time.perf_counter() - t0))
        dist.destroy()
    except P3OError as err:
        print(f"p3o train: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
