"""Arguments of the cluster tests' short runs (imported by name: `from cluster_args import ray_args`)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

VERIFIER = f"{HERE / 'digits_verifier.py'}:digit_share"


def ray_args(run_dir: Path, **overrides: object) -> list[str]:
    """argv of a short run on the random tiny model (its tokenizer, the arithmetic prompts, a digit-share reward)."""
    base: dict[str, object] = {
        "run_dir": str(run_dir),
        "model.name": "tiny-random",
        "task.n_train": 64,
        "task.n_eval": 0,
        "task.verifier": VERIFIER,
        "steps": 4,
        "rollout.prompts_per_step": 4,
        "rollout.group_size": 2,
        "rollout.max_new_tokens": 12,
        "update.micro_batch_size": 8,
        "optim.lr": 1e-2,
        "log.progress": False,
        "log.plot": False,
        "log.tensorboard": False,
        "ckpt.every": 0,
        "log.eval_every": 0,
    }
    base.update(overrides)
    out: list[str] = []
    for k, v in base.items():
        out += [f"--{k}", str(v).lower() if isinstance(v, bool) else str(v)]
    return out


@contextmanager
def before_each_update(before: Callable[[Any], None]):
    """Call `before(batch)` ahead of every update of the training loop while the block runs (the loop's update is
    `p3o.train.step.UpdateStep.run`, or the function `p3o.train.loop.update` in trees that still have it)."""
    import p3o.train.loop as loop_mod

    if hasattr(loop_mod, "update"):
        real = loop_mod.update

        def wrapped_fn(policy: Any, optimizer: Any, scheduler: Any, batch: Any, *a: Any, **kw: Any) -> Any:
            before(batch)
            return real(policy, optimizer, scheduler, batch, *a, **kw)

        loop_mod.update = wrapped_fn
        try:
            yield
        finally:
            loop_mod.update = real
        return
    from p3o.train.step import UpdateStep

    real_run = UpdateStep.run

    def wrapped_run(self: Any, batch: Any, *a: Any, **kw: Any) -> Any:
        before(batch)
        return real_run(self, batch, *a, **kw)

    UpdateStep.run = wrapped_run
    try:
        yield
    finally:
        UpdateStep.run = real_run
