"""The console report of a training run: a bar on a terminal, a line every few steps elsewhere, findings as they fire.

with ProgressBar(cfg.steps, description="p3o") as bar:
    evaluate = bar.wrap_evaluation(evaluate)          # the bar shows the evaluation phase while it runs
    bar.update(step, {"reward_mean": 0.4, "ess": 0.93, "lag_mean": 1.2, "eval_accuracy": 0.81})

On a terminal (stderr): a rich bar ``p3o ━━━━ 19/20 reward 0.412 ESS 0.931 pass@1 0.812 0:01:02 0:00:03`` whose
phase column reads ``evaluating`` during a held-out evaluation. Without a terminal (a log file, CI, ``nohup``): one
line every ``every`` steps (default: about ten lines per run), at the last step and after each evaluation::

    p3o: step 20/400  reward 0.412  ESS 0.931  lag 1.80  pass@1 0.812  0.53 steps/s  11m57s left

Either way, an off-policy finding of the monitor (a metrics key ``offpolicy/finding_<name>`` turning 1) is printed
once, the first time it fires: ``p3o: finding at step 1: ratio_tails (cause: engine mismatch): <what to do>``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from p3o.metrics.advice import suggest
from p3o.metrics.logger import to_number
from p3o.metrics.rules import CAUSE_TEXT, CAUSES

__all__ = ["ProgressBar", "finding_line", "progress_line"]

_FINDING = "offpolicy/finding_"
_CAUSE = "offpolicy/cause_"


def _num(metrics: Mapping[str, Any] | None, key: str) -> float | None:
    value = to_number(metrics.get(key)) if metrics and key in metrics else None
    return float(value) if isinstance(value, int | float) else None


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


def progress_line(
    label: str, step: int, total: int, metrics: Mapping[str, Any] | None, rate: float | None, eval_acc: float | None
) -> str:
    """One progress line: step, reward, ESS, lag, held-out pass@1 (the last evaluation), steps/s and time left."""
    parts = [f"{label}: step {step}/{total}"]
    for key, name, fmt in (("reward_mean", "reward", ".3f"), ("ess", "ESS", ".3f"), ("lag_mean", "lag", ".2f")):
        value = _num(metrics, key)
        if value is not None:
            parts.append(f"{name} {value:{fmt}}")
    if eval_acc is not None:
        parts.append(f"pass@1 {eval_acc:.3f}")
    if rate:
        parts.append(f"{rate:.2f} steps/s")
        if step < total:
            parts.append(f"{_duration((total - step) / rate)} left")
    return "  ".join(parts)


def finding_line(
    label: str, step: int, name: str, cause_code: float | None, config: Mapping[str, Any] | None = None
) -> str:
    """The line printed when finding ``name`` first fires: its cause (the monitor's attribution) and what to do,
    fitted to the run's ``config`` (nested mapping) when given."""
    cause = next((c for c, code in CAUSES.items() if cause_code is not None and code == int(cause_code)), None)
    cause = cause or "undetermined"
    advice = suggest(name, cause, "p3o", config=config)
    return f"{label}: finding at step {step}: {name} (cause: {CAUSE_TEXT[cause]}): {advice}"


class ProgressBar:
    """The console report of a training run (see the module docstring).

    Args:
        total: the run's steps.
        enabled: False: nothing is printed at all (other ranks, ``log.progress false``).
        description: the bar's label (the objective's name: ``p3o``, ``grpo``).
        start: steps already done (a resumed run).
        console: a ``rich.console.Console`` for the bar (default: stderr's); its ``is_terminal`` picks bar or lines.
        every: without a terminal, a line every this many steps (None: ``max(1, total // 10)``).
        stream: where the lines go without a terminal (default: ``sys.stderr``).
        config: the run's config (nested mapping), which the findings' advice is fitted to.
    """

    def __init__(
        self,
        total: int,
        *,
        enabled: bool = True,
        description: str = "train",
        start: int = 0,
        console: Any = None,
        every: int | None = None,
        stream: TextIO | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        self.total = total
        self.config = config
        self.description = description
        self.every = max(1, every if every else total // 10)
        self._start, self._t0 = start, time.perf_counter()
        self._stream = stream
        self._progress: Any = None
        self._task: Any = None
        self._lines = False
        self._eval_acc: float | None = None
        self._fired: set[str] = set()
        self.findings: dict[str, int] = {}  # finding name -> the step it first fired at
        if not enabled:
            return
        console = console if console is not None else Console(stderr=True)
        if not console.is_terminal:
            self._lines = True
            return
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[phase]}"),
            TextColumn("reward {task.fields[reward]}"),
            TextColumn("ESS {task.fields[ess]}"),
            TextColumn("pass@1 {task.fields[pass1]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
            transient=False,
        )
        self._task = self._progress.add_task(
            description, total=total, completed=start, phase="", reward="-", ess="-", pass1="-"
        )
        self._progress.start()

    @property
    def enabled(self) -> bool:
        """True when the bar is drawn (a terminal)."""
        return self._progress is not None

    @property
    def lines(self) -> bool:
        """True when progress goes out as lines (enabled, no terminal)."""
        return self._lines

    def _print(self, text: str) -> None:
        if self._progress is not None:
            self._progress.console.print(text, soft_wrap=True, markup=False, highlight=False)
        elif self._lines:
            stream = self._stream if self._stream is not None else sys.stderr
            print(text, file=stream, flush=True)

    def update(self, step: int, metrics: Mapping[str, Any] | None = None) -> None:
        """Report ``step`` completed steps with ``metrics`` (a metrics row): the bar, or a line when one is due;
        a finding that fires for the first time is printed once."""
        if self._progress is None and not self._lines:
            return
        acc = _num(metrics, "eval_accuracy")
        if acc is not None:
            self._eval_acc = acc
        for key in sorted(metrics or {}):
            if key.startswith(_FINDING) and _num(metrics, key) == 1.0:
                name = key[len(_FINDING) :]
                if name not in self._fired:
                    self._fired.add(name)
                    self.findings[name] = step
                    self._print(finding_line(self.description, step, name, _num(metrics, _CAUSE + name), self.config))
        if self._progress is not None:
            fields: dict[str, str] = {}
            for key, name in (("reward_mean", "reward"), ("ess", "ess"), ("eval_accuracy", "pass1")):
                value = _num(metrics, key)
                if value is not None:
                    fields[name] = f"{value:.3f}"
            self._progress.update(self._task, completed=step, **fields)
            return
        if step % self.every == 0 or step == self.total or step == self._start + 1 or acc is not None:
            elapsed = time.perf_counter() - self._t0
            rate = (step - self._start) / elapsed if elapsed > 0 and step > self._start else None
            self._print(progress_line(self.description, step, self.total, metrics, rate, self._eval_acc))

    def wrap_evaluation(self, evaluate: Callable[..., Any]) -> Callable[..., Any]:
        """``evaluate`` with the bar's phase reading ``evaluating`` while it runs (unchanged without a bar). Its first
        argument is the policy version (= the completed steps) it evaluates, which labels the first result: "before
        training" only at version 0, "at step s" otherwise (a resumed run, ``log.eval_every 0``)."""

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            if self._progress is not None:
                self._progress.update(self._task, phase="evaluating held-out")
            try:
                out = evaluate(*args, **kwargs)
            finally:
                if self._progress is not None:
                    self._progress.update(self._task, phase="")
            acc = _num(out if isinstance(out, Mapping) else None, "eval_accuracy")
            if acc is not None:
                first = self._eval_acc is None
                self._eval_acc = acc
                if self._progress is not None:
                    self._progress.update(self._task, pass1=f"{acc:.3f}")
                elif self._lines and first:  # the first evaluation: the starting policy's, or a later step's
                    step = args[0] if args and isinstance(args[0], int) else None
                    when = "before training" if step == 0 else f"at step {step}" if step is not None else ""
                    count = _num(out if isinstance(out, Mapping) else None, "eval_problems")
                    on = f" on {count:.0f} problems" if count is not None else ""
                    self._print(f"{self.description}: held-out pass@1 {acc:.3f}{on} {when}".rstrip())
            return out

        return wrapped

    def close(self) -> None:
        """Stop drawing (idempotent)."""
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        self._lines = False

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
