"""Curves of finished runs: metrics.jsonl as arrays, collapse detection and aggregation over seeds.

Usage:

    curves = read_curves(run_dir / "metrics.jsonl")          # {"step": (S,), "reward_mean": (S,), ...}
    info = detect_collapse(curves["reward_mean"], drop=0.3)  # a fall from the peak that does not recover
    agg = aggregate_seeds([curves_seed0, curves_seed1], "reward_mean", smooth_window=5)

Reading and smoothing are `p3o.metrics.read_metrics` and `p3o.metrics.smooth` (re-exported here as `smooth`):
statistics use its trailing mean (past steps only), figures its centred one, as `plot.png` does.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from p3o.metrics import SmoothMode, smooth
from p3o.metrics import read_metrics as read_metric_lines

Curves = dict[str, NDArray[np.float64]]


def read_curves(path: str | Path) -> Curves:
    """One float64 array per numeric key of a run's metrics.jsonl, aligned on its steps (NaN where a line lacks it).

    The lines are read by :func:`p3o.metrics.read_metrics` (a torn last line of a killed run is skipped, any other
    malformed line raises DataError naming file:line). Steps come out sorted; when a step appears twice (a run
    resumed without truncating its file) the later line wins. Text values are left out. Returns {} for a missing or
    empty file (a run that failed before logging), so a report can list it as missing.

    Returns:
        {"step": (S,), key: (S,), ...}.
    """
    path = Path(path)
    if not path.is_file():
        return {}
    rows: dict[float, dict[str, Any]] = {}
    for i, row in enumerate(read_metric_lines(path)):
        step = row.get("step")
        rows[float(step) if isinstance(step, (int, float)) and not isinstance(step, bool) else float(i)] = row
    if not rows:
        return {}
    order = sorted(rows)
    keys = sorted({k for row in rows.values() for k, v in row.items() if _is_number(v)})
    out: Curves = {key: np.array([_to_float(rows[s].get(key)) for s in order], dtype=np.float64) for key in keys}
    out["step"] = np.array(order, dtype=np.float64)
    return out


def _is_number(v: object) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) or v is None


def _to_float(v: object) -> float:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    return math.nan


@dataclass
class CollapseInfo:
    """Result of collapse detection on one reward curve (indices refer to the curve's points)."""

    collapsed: bool
    peak: float
    peak_index: int
    final: float
    drop: float
    """(peak − final) / peak of the smoothed curve (0 when the peak is not positive)."""
    onset_index: int | None
    """First point after the peak from which the smoothed curve stays below the threshold to the end."""
    dipped: bool
    """The smoothed curve went below the threshold after the peak at some point (recovered or not)."""


def batch_noise(y: NDArray[np.float64]) -> float:
    """Robust per-step noise σ of a curve: 1.4826 · MAD(y_t − y_{t−1}) / √2 over finite neighbours (0 if < 3 points).

    First differences remove a slow trend; the MAD ignores a few genuine jumps, so a real collapse does not inflate
    its own noise estimate.
    """
    y = np.asarray(y, dtype=np.float64)
    d = np.diff(y)
    d = d[np.isfinite(d)]
    if d.size < 2:
        return 0.0
    return float(1.4826 * np.median(np.abs(d - np.median(d))) / math.sqrt(2.0))


def detect_collapse(
    rewards: NDArray[np.float64],
    *,
    drop: float = 0.3,
    window: int = 5,
    min_peak: float = 0.05,
    noise_z: float = 3.0,
) -> CollapseInfo:
    """Did the reward fall more than `drop` × peak below its peak, beyond batch noise, and stay there to the end?

    The curve is smoothed with a trailing mean of `window` points (so single noisy points neither make nor
    break a collapse); threshold τ = (1 − drop) · peak, lowered further to peak − noise_z · σ · √(2 / window) when
    the per-step noise σ (`batch_noise`) is large, so that a smoothed fall must exceed noise_z standard errors of a
    difference of two window means — the maximum of a noisy curve sits well above its level, and a fall from it to
    an ordinary value is not a collapse. Collapsed ⇔ peak ≥ min_peak and the smoothed curve is below τ from some
    point after the peak through its last point (a dip that comes back above τ is a recovery, not a collapse).

    Args:
        rewards: (S,) the run's per-step mean reward, in step order (NaN allowed).
    """
    raw = np.asarray(rewards, dtype=np.float64)
    s = smooth(raw, window, mode="trailing")
    finite = np.isfinite(s)
    if not finite.any():
        return CollapseInfo(False, math.nan, -1, math.nan, 0.0, None, False)
    peak_index = int(np.nanargmax(s))
    peak = float(s[peak_index])
    last = int(np.flatnonzero(finite)[-1])
    final = float(s[last])
    rel_drop = (peak - final) / peak if peak > 0 else 0.0
    if peak < min_peak:
        return CollapseInfo(False, peak, peak_index, final, rel_drop, None, False)
    threshold = min((1.0 - drop) * peak, peak - noise_z * batch_noise(raw) * math.sqrt(2.0 / window))
    after = s[peak_index + 1 : last + 1]
    below = np.where(np.isfinite(after), after < threshold, True)  # NaN gaps neither start nor end a fall
    dipped = bool((np.isfinite(after) & (after < threshold)).any())
    onset = None
    if below.size and below[-1]:
        above = np.flatnonzero(~below)
        start = int(above[-1]) + 1 if above.size else 0
        onset = peak_index + 1 + start
    return CollapseInfo(onset is not None, peak, peak_index, final, rel_drop, onset, dipped)


def final_value(y: NDArray[np.float64], frac: float = 0.2) -> float:
    """Mean of the finite values in the last ⌈frac · S⌉ points of a curve (NaN when there are none)."""
    y = np.asarray(y, dtype=np.float64)
    if y.size == 0:
        return math.nan
    tail = y[-max(1, math.ceil(frac * y.size)) :]
    tail = tail[np.isfinite(tail)]
    return float(tail.mean()) if tail.size else math.nan


@dataclass
class SeedAggregate:
    """A metric over seeds on a common step axis: mean and spread of the (smoothed) per-seed curves."""

    steps: NDArray[np.float64]
    mean: NDArray[np.float64]
    std: NDArray[np.float64]
    low: NDArray[np.float64]
    high: NDArray[np.float64]
    n: NDArray[np.int64]
    """(S,) how many seeds had a finite value at each step."""


def aggregate_seeds(
    runs: list[Curves], key: str, smooth_window: int = 1, *, mode: SmoothMode = "centred"
) -> SeedAggregate | None:
    """Align the seeds' curves of `key` on the union of their steps and take mean / population std / min / max.

    Each curve is smoothed first (`p3o.metrics.smooth` over `smooth_window` points; centred by default, as a
    figure's curve, like `plot.png`); a seed missing a step contributes nothing there. None when no run has `key`.
    """
    series = [
        (c["step"], smooth(c[key], smooth_window, mode=mode)) for c in runs if key in c and np.isfinite(c[key]).any()
    ]
    if not series:
        return None
    steps = np.unique(np.concatenate([s for s, _ in series]))
    grid = np.full((len(series), steps.size), np.nan)
    for i, (s, y) in enumerate(series):
        grid[i, np.searchsorted(steps, s)] = y
    n = np.isfinite(grid).sum(axis=0)
    with np.errstate(invalid="ignore"), _quiet():
        mean = np.nanmean(grid, axis=0)
        std = np.nanstd(grid, axis=0)
        low = np.nanmin(grid, axis=0)
        high = np.nanmax(grid, axis=0)
    return SeedAggregate(steps, mean, std, low, high, n.astype(np.int64))


class _quiet:
    """Silence numpy's 'Mean of empty slice' warnings for all-NaN columns (they give NaN, as intended)."""

    def __enter__(self) -> None:
        self._ctx = warnings.catch_warnings()
        self._ctx.__enter__()
        warnings.simplefilter("ignore", category=RuntimeWarning)

    def __exit__(self, *exc: object) -> None:
        self._ctx.__exit__(*exc)


def mean_std(values: list[float]) -> tuple[float, float, int]:
    """Mean, sample standard deviation (ddof 1; 0 for one value) and count of the finite values."""
    arr = np.array([v for v in values if v is not None and math.isfinite(v)], dtype=np.float64)
    if arr.size == 0:
        return math.nan, math.nan, 0
    return float(arr.mean()), float(arr.std(ddof=1)) if arr.size > 1 else 0.0, int(arr.size)
