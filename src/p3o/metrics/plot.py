"""Curves of a run: the one smoother (`smooth`), `plot_run` (reward, ESS, lag, length to PNG) and ``p3o plot``.

    plot_run("runs/x")                                  # -> runs/x/plot.png
    smooth(rewards, 10, mode="centred")                 # (S,) -> (S,) moving average, NaN skipped

Command line: ``p3o plot RUN_DIR [--out PNG]``.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from p3o.errors import DataError, P3OError
from p3o.metrics.logger import METRICS_FILE, read_metrics
from p3o.options import config_field as _f
from p3o.options import parse_or_help

__all__ = ["CAPTIONS", "PANELS", "SmoothMode", "main", "plot_run", "smooth"]


# Panels of plot_run: (title, y label, [(metric key, legend label)]). Lag is drawn as a min–max band around the mean.
# A key with one `*` stands for every recorded key of that shape, its label's `{}` for what the `*` matched
# (`task/*/accuracy`: one curve per task of a task mixture).
PANELS: list[tuple[str, str, list[tuple[str, str]]]] = [
    (
        "Reward",
        "reward / accuracy",
        [("reward_mean", "reward"), ("accuracy", "accuracy"), ("eval_accuracy", "eval pass@1")],
    ),
    ("Effective sample size", "ESS / KL weight", [("ess", "ESS"), ("kl_weight", "KL weight = 1 − ESS")]),
    ("Policy lag", "versions", [("lag_mean", "mean"), ("lag_min", "min"), ("lag_max", "max")]),
    ("Response length", "tokens", [("response_len_mean", "mean length")]),
    (
        "Agent episodes",
        "per episode",
        [
            ("episode/turns", "turns"),
            ("episode/tool_calls", "tool calls"),
            ("episode/tool_errors", "tool errors"),
            ("episode/parse_errors", "malformed calls"),
            ("episode/env_errors", "environment errors"),
            ("episode/env_timeouts", "environment timeouts"),
        ],
    ),
    ("Episode ends", "episodes per batch", [("episode/stop_*", "{}")]),
    (
        "Episode tokens",
        "share",
        [
            ("episode/obs_share", "observation tokens"),
            ("episode/multi_version", "episodes over ≥ 2 versions"),
            ("episode/cut", "cut by a limit"),
        ],
    ),
    (
        "Tasks",
        "accuracy / pass@1",
        [("task/*/accuracy", "{} accuracy"), ("task/*/eval_accuracy", "{} eval pass@1")],
    ),
]

# One-line caption under each panel's title: what the curve is and what healthy looks like (docs/metrics.md).
CAPTIONS: dict[str, str] = {
    "Reward": "training batch per step (faint) and moving average; eval: held-out pass@1",
    "Effective sample size": "ESS of ratios π_θ/π_rollout: 1 = on-policy, falling = off-policy",
    "Policy lag": "policy updates between sampling and training (0 = on-policy)",
    "Response length": "mean tokens per response (capped at rollout.max_new_tokens)",
    "Agent episodes": "agent runs: turns, tool calls, tool and environment errors per episode (p3o docs agents)",
    "Episode ends": "agent runs: why each episode ended (done, max_turns, length, turn_length, context, env_*)",
    "Episode tokens": "observation share of tokens (never trained), episodes spanning versions, cut by a limit",
    "Tasks": "task mixture: training accuracy and held-out pass@1 of each task (p3o docs tasks)",
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


def _expand(records: list[dict[str, Any]], keys: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """``keys`` with each ``pre*post`` key replaced by the recorded keys of that shape (the `*` matching no ``/``),
    in order of the matched name, their labels' ``{}`` filled with it."""
    out: list[tuple[str, str]] = []
    for key, label in keys:
        if "*" not in key:
            out.append((key, label))
            continue
        pre, _, post = key.partition("*")
        names = {
            k[len(pre) : len(k) - len(post)]
            for r in records
            for k in r
            if k.startswith(pre) and k.endswith(post) and len(k) > len(pre) + len(post)
        }
        out += [(f"{pre}{n}{post}", label.format(n)) for n in sorted(names) if "/" not in n]
    return out


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Draw reward/accuracy, ESS + KL weight, lag (min/mean/max) and response length of a run to a PNG.

    Each panel has a legend and a one-line caption (``CAPTIONS``; docs/metrics.md explains them). Panels whose
    metrics are all absent are skipped. ``out`` defaults to ``run_dir/plot.png``. Returns the PNG path.
    Raises DataError when the run has no metrics or none of the plotted ones.
    """
    # A bare Figure on the Agg canvas: no pyplot global state, works headless, leaves the user's backend alone.
    # heavy: matplotlib start-up (~0.8 s), only when a plot is drawn (p3o.metrics is imported by every command)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    run_dir = Path(run_dir)
    records = read_metrics(run_dir)
    source = run_dir if run_dir.is_file() else run_dir / METRICS_FILE
    if not records:
        raise DataError(f"{source}: no metrics recorded yet")
    panels = []
    for title, ylabel, keys in PANELS:
        series = {k: (label, s) for k, label in _expand(records, keys) if (s := _series(records, k)) is not None}
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
        task_colors: dict[str, str] = {}  # a task's training and held-out curves share a colour
        for key, (label, (xs, ys)) in series.items():
            kw = {}
            if key.startswith("task/"):
                kw["color"] = task_colors.setdefault(key.split("/")[1], f"C{len(task_colors)}")
            if (key in SMOOTHED or key.endswith("/accuracy")) and len(xs) > 20:
                # Per-step rewards of a small batch are noisy: draw them faint, with a centred moving average on top.
                (line,) = ax.plot(xs, ys, alpha=0.3, linewidth=0.8, **kw)
                ax.plot(
                    xs,
                    smooth(ys, max(5, len(ys) // 15), mode="centred"),
                    color=line.get_color(),
                    label=f"{label} (moving avg)",
                )
            elif key.endswith("eval_accuracy"):
                ax.plot(xs, ys, marker="o", markersize=4, linestyle="--", label=label, **kw)
            else:
                ax.plot(xs, ys, marker="." if len(xs) <= 50 else None, label=label, **kw)
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


@dataclass
class PlotOptions:
    """Options of ``p3o plot`` (parsed, typed and documented by the same mechanism as ``p3o train``)."""

    run_dir: str = _f("", "run directory containing metrics.jsonl, or the metrics.jsonl file (RUN_DIR)")
    out: str | None = _f(None, "output PNG (null: RUN_DIR/plot.png)")


USAGE = "usage: p3o plot RUN_DIR [--out PNG]"


def main(argv: list[str] | None = None) -> int:
    """``p3o plot RUN_DIR [--out PNG]``: draw a run's curves; prints the PNG path."""
    argv = sys.argv[1:] if argv is None else list(argv)
    about = "draw reward / ESS / lag curves of a run to PNG"
    args = parse_or_help(
        argv, PlotOptions, USAGE, about, arguments=[("RUN_DIR", "= --run_dir")], positional=["run_dir"]
    )
    if args is None:
        return 0
    if not args.run_dir:
        raise P3OError("expected a run directory (p3o plot RUN_DIR)")
    run_dir = Path(args.run_dir)
    if not run_dir.exists():
        raise P3OError(f"{run_dir}: no such run directory")
    if run_dir.is_dir() and not (run_dir / METRICS_FILE).is_file():
        raise P3OError(f"{run_dir}: no {METRICS_FILE} in this directory")
    out = plot_run(run_dir, args.out)
    print(out)
    return 0
