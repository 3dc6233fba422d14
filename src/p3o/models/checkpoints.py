"""Where a training run keeps its checkpoints, and the read-only lookups over that layout.

Below the trainer on purpose: evaluation (`p3o eval` on a run directory) finds a run's newest policy here without
importing `p3o.train`. Writing, pruning and restoring checkpoints stay in `p3o.train.checkpoint`.

Layout under a run directory::

    checkpoints/
      step_000020/          policy/ (weights + tokenizer), trainer_state.pt, meta.json (written last)
      latest                text file naming the newest complete checkpoint ("step_000040")

    latest_checkpoint("runs/mine")      # Path("runs/mine/checkpoints/step_000040"), or None
    list_checkpoints("runs/mine")       # complete checkpoints, oldest first
"""

from __future__ import annotations

import re
from pathlib import Path

__all__ = [
    "CKPT_DIR",
    "LATEST",
    "META_FILE",
    "POLICY_DIR",
    "STATE_FILE",
    "checkpoint_root",
    "checkpoint_step",
    "is_complete_checkpoint",
    "latest_checkpoint",
    "list_checkpoints",
]

CKPT_DIR = "checkpoints"
LATEST = "latest"
STATE_FILE = "trainer_state.pt"
POLICY_DIR = "policy"
META_FILE = "meta.json"
_STEP_RE = re.compile(r"^step_(\d+)$")


def checkpoint_step(path: str | Path) -> int | None:
    """The step of a ``step_XXXXXX`` directory name, else None."""
    m = _STEP_RE.match(Path(path).name)
    return int(m.group(1)) if m else None


def is_complete_checkpoint(path: str | Path) -> bool:
    """True when ``path`` is a finished checkpoint (meta.json, trainer_state.pt and policy/ present)."""
    path = Path(path)
    return (
        checkpoint_step(path) is not None
        and (path / META_FILE).is_file()
        and (path / STATE_FILE).is_file()
        and (path / POLICY_DIR).is_dir()
    )


def checkpoint_root(run_dir: str | Path) -> Path:
    """The ``checkpoints/`` directory of a run (``run_dir`` itself when it already is one)."""
    run_dir = Path(run_dir)
    return run_dir if run_dir.name == CKPT_DIR and not (run_dir / CKPT_DIR).is_dir() else run_dir / CKPT_DIR


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first (incomplete and temporary directories are skipped)."""
    root = checkpoint_root(run_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and is_complete_checkpoint(p)]
    return sorted(found, key=lambda p: checkpoint_step(p) or 0)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of a run: the ``latest`` pointer when it names a complete one, else a scan."""
    root = checkpoint_root(run_dir)
    pointer = root / LATEST
    if pointer.is_file():
        try:
            target = root / pointer.read_text().strip()
        except OSError:
            target = None
        if target is not None and target.parent == root and is_complete_checkpoint(target):
            # The pointer is only a hint: a newer complete directory (pointer write lost in a crash) still wins.
            newer = [p for p in list_checkpoints(root) if (checkpoint_step(p) or 0) > (checkpoint_step(target) or 0)]
            return newer[-1] if newer else target
    found = list_checkpoints(root)
    return found[-1] if found else None
