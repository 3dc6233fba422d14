"""The console progress bar of a training run: steps done, rate, and live reward / ESS columns (rich).

with ProgressBar(cfg.steps) as bar:
    bar.update(step, {"reward_mean": 0.4, "ess": 0.93})
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from p3o.metrics.logger import to_number

__all__ = ["ProgressBar"]


class ProgressBar:
    """A rich progress bar over training steps with live reward and ESS columns.

    Disabled (every method a no-op, nothing printed) when ``enabled=False`` or stderr is not a terminal.
    ``console`` (a ``rich.console.Console``) replaces the default stderr console.

        with ProgressBar(cfg.steps) as bar:
            for step in range(1, cfg.steps + 1):
                ...
                bar.update(step, {"reward_mean": r, "ess": e})
    """

    def __init__(
        self,
        total: int,
        *,
        enabled: bool = True,
        description: str = "train",
        start: int = 0,
        console: Any = None,
    ) -> None:
        self.total = total
        self._progress = None
        self._task = None
        if not enabled:
            return
        from rich.console import Console

        console = console if console is not None else Console(stderr=True)
        if not console.is_terminal:
            return
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("reward {task.fields[reward]}"),
            TextColumn("ESS {task.fields[ess]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
            transient=False,
        )
        self._task = self._progress.add_task(description, total=total, completed=start, reward="-", ess="-")
        self._progress.start()

    @property
    def enabled(self) -> bool:
        """True when the bar is drawn."""
        return self._progress is not None

    def update(self, step: int, metrics: Mapping[str, Any] | None = None) -> None:
        """Set the bar to ``step`` completed steps and show ``reward_mean`` and ``ess`` from ``metrics``."""
        if self._progress is None:
            return
        fields: dict[str, str] = {}
        for key, name in (("reward_mean", "reward"), ("ess", "ess")):
            value = to_number(metrics.get(key)) if metrics and key in metrics else None
            if isinstance(value, int | float):
                fields[name] = f"{value:.3f}"
        self._progress.update(self._task, completed=step, **fields)

    def close(self) -> None:
        """Stop drawing (idempotent)."""
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
