"""Arguments of the cluster tests' short runs (imported by name: `from cluster_args import ray_args`)."""

from __future__ import annotations

from pathlib import Path

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
