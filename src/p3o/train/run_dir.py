"""The run directory's own bookkeeping: what a training run writes there, what counts as an earlier run, what
``--overwrite`` removes.

A fresh run refuses a directory holding an earlier run's outputs (`earlier_run`: one that completed a step) unless
``--overwrite``, which deletes exactly `RUN_OUTPUTS` plus the config files, the grid runner's DONE marker and the
doctor's plot (`clear_run_outputs`); a start that died before its first step left no run, and the next start clears
its leftovers. The checkpoints themselves (layout, atomic saves, resume) are `p3o.train.checkpoint`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from p3o.models.checkpoints import CKPT_DIR

__all__ = ["RUN_OUTPUTS", "clear_run_outputs", "earlier_run", "run_outputs"]

# What a training run writes into its run directory (besides config.yaml): a fresh run refuses a directory holding
# any of them, `--overwrite` removes exactly these (plus config.yaml and the grid runner's DONE marker).
RUN_OUTPUTS = (CKPT_DIR, "final", "metrics.jsonl", "plot.png", "tensorboard", "wandb")


def run_outputs(run_dir: str | Path) -> list[str]:
    """Names of an earlier run's outputs present in ``run_dir``: files, and directories that are not empty.

    A missing directory, an empty one or one holding only ``config.yaml`` (or files p3o does not write) gives [].
    """
    run_dir = Path(run_dir)
    found = []
    for name in RUN_OUTPUTS:
        path = run_dir / name
        if path.is_file() or (path.is_dir() and any(path.iterdir())):
            found.append(name)
    return found


def earlier_run(run_dir: str | Path) -> list[str]:
    """The outputs of an earlier run in `run_dir` (`run_outputs`) when it completed a step — a
    checkpoint, final/, or a metrics.jsonl row past step 0 — else []. A start that died before its first step
    (killed while a base was being built, an engine that failed to start) left no run: the next start is not
    refused, and it clears those leftovers."""
    outputs = run_outputs(run_dir)
    if not outputs or {CKPT_DIR, "final"} & set(outputs):
        return outputs
    metrics = Path(run_dir) / "metrics.jsonl"
    if metrics.is_file():
        for line in metrics.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue  # a torn line of a killed run
            if isinstance(row, dict) and isinstance(row.get("step"), int | float) and row["step"] >= 1:
                return outputs
    return []


def clear_run_outputs(run_dir: str | Path) -> list[str]:
    """Delete an earlier run's outputs from ``run_dir`` (``RUN_OUTPUTS``, config.yaml, config_history.jsonl, DONE,
    and the ``p3o doctor`` plot of it, doctor.png); other files stay.

    Returns the names removed. This is what ``--overwrite`` does before a fresh run starts.
    """
    run_dir = Path(run_dir)
    removed = []
    for name in (*RUN_OUTPUTS, "config.yaml", "config_history.jsonl", "DONE", "doctor.png"):
        path = run_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
        else:
            continue
        removed.append(name)
    return removed
