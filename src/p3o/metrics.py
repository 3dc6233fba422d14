"""Run metrics: one JSON line per step (always), TensorBoard / W&B when available, a rich progress bar, and plots.

    logger = MetricsLogger("runs/x", config=to_dict(cfg))
    logger.log(1, {"reward_mean": 0.4, "ess": 0.93})   # appends {"step": 1, "reward_mean": 0.4, ...}
    logger.close()
    plot_run("runs/x")                                  # -> runs/x/plot.png

Command line: ``p3o plot RUN_DIR [--out PNG]``.

``metrics.jsonl`` is strict JSON: NaN and ±inf are written as ``null``. TensorBoard (``torch.utils.tensorboard``)
is used when importable; Weights & Biases only when installed *and* configured (``WANDB_MODE`` or
``WANDB_API_KEY`` set, or a wandb entry in ``~/.netrc``) — it never prompts.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from p3o.errors import DataError, P3OError

__all__ = [
    "METRICS_FILE",
    "PANELS",
    "MetricsLogger",
    "ProgressBar",
    "format_metrics",
    "main",
    "plot_run",
    "read_metrics",
    "smooth",
]

METRICS_FILE = "metrics.jsonl"

Switch = bool | Literal["auto"]


def _to_number(value: Any) -> Any:
    """JSON-safe scalar: tensors / numpy scalars -> Python numbers; NaN and ±inf -> None; str and None pass."""
    if value is None or isinstance(value, str):
        return value
    if hasattr(value, "item") and callable(value.item):  # torch / numpy scalar
        if getattr(value, "numel", lambda: 1)() != 1:
            raise TypeError(f"metric is not a scalar (shape {tuple(getattr(value, 'shape', ()))})")
        value = value.item()
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    raise TypeError(f"metric value of type {type(value).__name__} is not a number")


def _wandb_configured() -> bool:
    """True when W&B can run without prompting: WANDB_MODE or WANDB_API_KEY set, or credentials in ~/.netrc."""
    if os.environ.get("WANDB_MODE") or os.environ.get("WANDB_API_KEY"):
        return True
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    try:
        return "api.wandb.ai" in netrc.read_text()
    except OSError:
        return False


class MetricsLogger:
    """Append-only metrics sink for one run directory.

    Args:
        run_dir: the run directory (created); metrics go to ``run_dir/metrics.jsonl``.
        config: the resolved config as a dict (sent to TensorBoard as text and to W&B as its config).
        enabled: False makes every method a no-op (e.g. on data-parallel ranks other than 0).
        tensorboard: "auto" (when installed), True (required; error when missing) or False.
        wandb: "auto" (installed and configured), True (required; offline mode when not configured) or False.
        wandb_project: W&B project name.
        truncate_after: when resuming from a checkpoint at this step, drop existing lines with ``step`` greater than it
            so the file has no duplicate steps; None keeps the file as it is.

    Each :meth:`log` call writes one line ``{"step": step, **metrics}`` and flushes it, so the file is readable while
    the run goes on and survives a crash up to the last completed step.
    """

    def __init__(
        self,
        run_dir: str | Path,
        config: Mapping[str, Any] | None = None,
        *,
        enabled: bool = True,
        tensorboard: Switch = "auto",
        wandb: Switch = "auto",
        wandb_project: str = "p3o",
        truncate_after: int | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / METRICS_FILE
        self.enabled = enabled
        self._fh = None
        self._tb = None
        self._wandb = None
        if not enabled:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if truncate_after is not None and self.path.exists():
            kept = [r for r in read_metrics(self.path) if int(r.get("step", 0)) <= truncate_after]
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
            tmp.replace(self.path)
        self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self._tb = self._open_tensorboard(tensorboard, config)
        self._wandb = self._open_wandb(wandb, config, wandb_project)

    def _open_tensorboard(self, mode: Switch, config: Mapping[str, Any] | None) -> Any:
        if mode is False:
            return None
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            if mode is True:
                raise P3OError("log.tensorboard: true needs TensorBoard: pip install 'p3o[tensorboard]'") from None
            return None
        writer = SummaryWriter(log_dir=str(self.run_dir / "tensorboard"))
        if config:
            import yaml

            text = yaml.safe_dump(dict(config), sort_keys=False)
            writer.add_text("config", "```\n" + text + "\n```", 0)
        return writer

    def _open_wandb(self, mode: Switch, config: Mapping[str, Any] | None, project: str) -> Any:
        if mode is False:
            return None
        try:
            import wandb
        except ImportError:
            if mode is True:
                raise P3OError("log.wandb: true needs Weights & Biases: pip install 'p3o[wandb]'") from None
            return None
        configured = _wandb_configured()
        if mode == "auto" and not configured:
            return None
        kwargs: dict[str, Any] = {} if configured else {"mode": "offline"}  # never prompt for a login
        return wandb.init(
            project=project, dir=str(self.run_dir), name=self.run_dir.name, config=dict(config or {}), **kwargs
        )

    @property
    def backends(self) -> list[str]:
        """Active sinks, e.g. ["jsonl", "tensorboard"]."""
        if not self.enabled:
            return []
        return ["jsonl"] + (["tensorboard"] if self._tb else []) + (["wandb"] if self._wandb else [])

    def log(self, step: int, metrics: Mapping[str, Any]) -> dict[str, Any]:
        """Write one record ``{"step": step, **metrics}``; values are numbers (0-d tensors accepted), str or None.

        Returns the record as written (NaN / inf replaced by None).
        """
        record: dict[str, Any] = {"step": int(step)}
        for k, v in metrics.items():
            if k == "step":
                continue
            try:
                record[str(k)] = _to_number(v)
            except TypeError as err:
                raise TypeError(f"metric '{k}': {err}") from None
        if not self.enabled or self._fh is None:
            return record
        self._fh.write(json.dumps(record) + "\n")
        self._fh.flush()
        numeric = {k: v for k, v in record.items() if k != "step" and isinstance(v, int | float)}
        if self._tb is not None:
            for k, v in numeric.items():
                self._tb.add_scalar(k, v, int(step))
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(numeric, step=int(step))
        return record

    def close(self) -> None:
        """Flush and close every sink (idempotent)."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """Records of ``run_dir/metrics.jsonl`` (or of that file given directly), in file order.

    A torn last line (a crash mid-write) is ignored; a malformed line elsewhere raises DataError naming the line.
    """
    path = Path(run_dir)
    if path.is_dir():
        path = path / METRICS_FILE
    if not path.is_file():
        raise DataError(f"{path}: no metrics file")
    lines = path.read_text(encoding="utf-8").splitlines()
    records: list[dict[str, Any]] = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            if not isinstance(rec, dict):
                raise ValueError("not a JSON object")
        except ValueError as err:
            if i == len(lines):
                break  # torn final line
            raise DataError(f"{path}:{i}: malformed metrics line ({err})") from None
        records.append(rec)
    return records


def format_metrics(step: int, metrics: Mapping[str, Any], keys: Sequence[str] | None = None) -> str:
    """One plain log line, e.g. ``step 12 reward_mean=0.412 ess=0.93`` (for logs when there is no progress bar)."""
    keys = list(keys) if keys is not None else [k for k in metrics if k != "step"]
    parts = [f"step {step}"]
    for k in keys:
        if k not in metrics:
            continue
        v = _to_number(metrics[k]) if not isinstance(metrics[k], str) else metrics[k]
        parts.append(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}")
    return " ".join(parts)


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
            value = _to_number(metrics.get(key)) if metrics and key in metrics else None
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


# Panels of plot_run: (title, y label, [(metric key, legend label)]). Lag is drawn as a min–max band around the mean.
PANELS: list[tuple[str, str, list[tuple[str, str]]]] = [
    (
        "Reward",
        "reward / accuracy",
        [("reward_mean", "reward"), ("accuracy", "accuracy"), ("eval_accuracy", "eval pass@1")],
    ),
    ("Effective sample size", "ESS / KL weight", [("ess", "ESS"), ("kl_weight", "KL weight = 1 − ESS")]),
    ("Policy lag", "versions", [("lag_mean", "mean"), ("lag_min", "min"), ("lag_max", "max")]),
    ("Response length", "tokens", [("response_len_mean", "mean length")]),
]

# One-line caption under each panel's title: what the curve is and what healthy looks like (docs/metrics.md).
CAPTIONS: dict[str, str] = {
    "Reward": "training batch per step (faint) and moving average; eval: held-out pass@1",
    "Effective sample size": "ESS of ratios π_θ/π_rollout: 1 = on-policy, falling = off-policy",
    "Policy lag": "policy updates between sampling and training (0 = on-policy)",
    "Response length": "mean tokens per response (capped at rollout.max_new_tokens)",
}


SMOOTHED = {"reward_mean", "accuracy"}

SmoothMode = Literal["trailing", "centred"]


def smooth(
    y: Sequence[float] | NDArray[np.float64], window: int, *, mode: SmoothMode = "trailing"
) -> NDArray[np.float64]:
    """Moving average of a curve over ``window`` points, NaN entries skipped; shape (S,) → (S,) float64.

    The one smoother of p3o (``plot.png``, the experiment report's figures and its statistics):

    * ``"trailing"``: s_t = mean of the finite y_{t−w+1 … t} — past points only, so a statistic read at step t
      (collapse detection, the report's first reward) never sees later steps;
    * ``"centred"``: s_t = mean of the finite y_{t−⌊w/2⌋ … t+⌊w/2⌋} — no lag, for drawing a curve.

    Windows are cut at the ends of the curve (they average what exists, no bias towards 0); a point whose window
    holds no finite value is NaN. ``window`` ≤ 1 returns a copy.
    """
    y = np.asarray(y, dtype=np.float64)
    if window <= 1 or y.size == 0:
        return y.copy()
    if mode not in ("trailing", "centred"):
        raise ValueError(f"smooth: unknown mode {mode!r}; known: trailing, centred")
    finite = np.isfinite(y)
    vals = np.concatenate([[0.0], np.cumsum(np.where(finite, y, 0.0))])
    cnt = np.concatenate([[0], np.cumsum(finite)])
    t = np.arange(y.size)
    if mode == "trailing":
        lo, hi = np.maximum(t + 1 - window, 0), t + 1
    else:
        half = window // 2
        lo, hi = np.maximum(t - half, 0), np.minimum(t + half + 1, y.size)
    total, count = vals[hi] - vals[lo], cnt[hi] - cnt[lo]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def _series(records: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]] | None:
    """(steps, values) of ``key``; None values become NaN (gaps). None when the key never has a number."""
    xs, ys = [], []
    for i, r in enumerate(records):
        if key in r:
            v = r[key]
            xs.append(float(r.get("step", i)))
            ys.append(float(v) if isinstance(v, int | float) and not isinstance(v, bool) else math.nan)
    if not any(math.isfinite(y) for y in ys):
        return None
    return xs, ys


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Draw reward/accuracy, ESS + KL weight, lag (min/mean/max) and response length of a run to a PNG.

    Each panel has a legend and a one-line caption (``CAPTIONS``; docs/metrics.md explains them). Panels whose
    metrics are all absent are skipped. ``out`` defaults to ``run_dir/plot.png``. Returns the PNG path.
    Raises DataError when the run has no metrics or none of the plotted ones.
    """
    # A bare Figure on the Agg canvas: no pyplot global state, works headless, leaves the user's backend alone.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    run_dir = Path(run_dir)
    records = read_metrics(run_dir)
    source = run_dir if run_dir.is_file() else run_dir / METRICS_FILE
    if not records:
        raise DataError(f"{source}: no metrics recorded yet")
    panels = []
    for title, ylabel, keys in PANELS:
        series = {k: (label, s) for k, label in keys if (s := _series(records, k)) is not None}
        if series:
            panels.append((title, ylabel, series))
    if not panels:
        known = ", ".join(k for _, _, keys in PANELS for k, _ in keys)
        raise DataError(f"{source}: none of the plotted metrics present ({known})")

    ncols = 1 if len(panels) == 1 else 2
    nrows = math.ceil(len(panels) / ncols)
    fig = Figure(figsize=(6 * ncols, 3.6 * nrows))
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    for ax, (title, ylabel, series) in zip(axes.flat, panels):
        if title == "Policy lag" and "lag_min" in series and "lag_max" in series:
            (xs, lo), (_, hi) = series["lag_min"][1], series["lag_max"][1]
            ax.fill_between(xs, lo, hi, alpha=0.25, label="min–max")
            series = {k: v for k, v in series.items() if k not in {"lag_min", "lag_max"}}
        if "reward_mean" in series and "accuracy" in series and series["reward_mean"][1] == series["accuracy"][1]:
            series = {k: v for k, v in series.items() if k != "accuracy"}  # 0/1 rewards: the same curve twice
        for key, (label, (xs, ys)) in series.items():
            if key in SMOOTHED and len(xs) > 20:
                # Per-step rewards of a small batch are noisy: draw them faint, with a centred moving average on top.
                (line,) = ax.plot(xs, ys, alpha=0.3, linewidth=0.8)
                ax.plot(
                    xs,
                    smooth(ys, max(5, len(ys) // 15), mode="centred"),
                    color=line.get_color(),
                    label=f"{label} (moving avg)",
                )
            elif key == "eval_accuracy":
                ax.plot(xs, ys, marker="o", markersize=4, linestyle="--", label=label)
            else:
                ax.plot(xs, ys, marker="." if len(xs) <= 50 else None, label=label)
        ax.set_title(title, pad=16)
        if title in CAPTIONS:
            ax.text(0.5, 1.015, CAPTIONS[title], transform=ax.transAxes, ha="center", va="bottom", fontsize=7.5)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize="small")
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    name = run_dir.parent.name if run_dir.is_file() else run_dir.name
    fig.suptitle(name or str(run_dir))
    fig.tight_layout()
    out_path = Path(out) if out is not None else (run_dir.parent if run_dir.is_file() else run_dir) / "plot.png"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_path, dpi=110)
    return out_path


def main(argv: list[str] | None = None) -> int:
    """``p3o plot RUN_DIR [--out PNG]``: draw a run's curves; prints the PNG path."""
    parser = argparse.ArgumentParser(prog="p3o plot", description="Draw reward / ESS / lag curves of a run to PNG.")
    parser.add_argument("run_dir", help="run directory containing metrics.jsonl (or the metrics.jsonl file)")
    parser.add_argument("--out", default=None, help="output PNG (default: RUN_DIR/plot.png)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    run_dir = Path(args.run_dir)
    if not run_dir.exists():
        raise P3OError(f"{run_dir}: no such run directory")
    if run_dir.is_dir() and not (run_dir / METRICS_FILE).is_file():
        raise P3OError(f"{run_dir}: no {METRICS_FILE} in this directory")
    out = plot_run(run_dir, args.out)
    print(out)
    return 0
