"""Training: the one update step (``step.py``), the sync / stale / async / reuse loops (``loop.py``), the batch
sources (``sources.py``: the prompt stream, the producer and the sources), checkpoints (``checkpoint.py``) and the
``p3o train`` command (``cli.py``).

    from p3o.config import load_config
    from p3o.train import run
    run_dir = run(load_config(["--config", "quick"]))
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from p3o.config import TrainConfig

__all__ = ["run"]


def run(cfg: TrainConfig) -> Path:
    """Run the training job ``cfg`` in-process and return its run directory (imports the loop lazily)."""
    from p3o.train.loop import run as _run  # heavy: torch start-up; `import p3o.train.cli` stays light

    return _run(cfg)
