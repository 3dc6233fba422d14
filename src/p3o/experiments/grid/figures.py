"""The LM grid's figures: per regime, curves over steps (mean over seeds, band = min..max) of the reward, ESS, KL
weight, clip-band share and prefix factor; and one overview of grouped bars per metric."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from p3o.experiments.grid.analysis import Curves, aggregate_seeds
from p3o.experiments.grid.collect import METRIC_LABELS, REWARD_KEY, GridSummary


def _plot_band(ax: Any, runs: list[Curves], key: str, window: int, label: str, color: Any) -> bool:
    agg = aggregate_seeds(runs, key, window)
    if agg is None:
        return False
    ax.plot(agg.steps, agg.mean, color=color, label=label, lw=1.6)
    if (agg.n > 1).any():
        ax.fill_between(agg.steps, agg.low, agg.high, color=color, alpha=0.15, lw=0)
    return True


def plot_regime(summary: GridSummary, regime: str, path: Path) -> Path:
    """Five panels for one regime (mean over seeds, band = min..max, smoothed): reward, ESS, KL weight, the share of
    tokens with |ρ − 1| > 0.2 (``band_frac``: the same statistic for every objective, so like is compared with like)
    and the prefix factor m_t."""
    import matplotlib  # heavy start-up: only when drawing

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # heavy start-up: only when drawing

    exp = summary.exp
    panels = [
        (REWARD_KEY, "reward (mean over seeds, band = min–max)"),
        ("ess", "ESS"),
        ("kl_weight", "KL weight"),
        ("band_frac", "share of tokens with |ρ − 1| > 0.2"),
        ("m_mean", "mean prefix factor m_t"),
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(20, 3.8))
    colors = plt.get_cmap("tab10")
    for (key, title), ax in zip(panels, axes):
        drawn = False
        for i, arm in enumerate(exp.objectives):
            if arm.label not in exp.objectives_in(regime):
                continue
            curves = [r.curves for r in summary.cell(regime, arm.label)]
            drawn |= _plot_band(ax, curves, key, exp.analysis.smooth, arm.label, colors(i % 10))
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if not drawn:
            ax.text(0.5, 0.5, "not reported", ha="center", va="center", transform=ax.transAxes, color="grey")
    if axes[0].get_legend_handles_labels()[0]:
        axes[0].legend(fontsize=8, loc="best")
    n_seeds = len(exp.seeds)
    fig.suptitle(f"{exp.name} — regime {regime} ({n_seeds} seed{'s' * (n_seeds > 1)}, smoothed {exp.analysis.smooth})")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_overview(summary: GridSummary, path: Path, metrics: tuple[str, ...] = ("final_reward", "pass@1")) -> Path:
    """Grouped bars, one panel per metric: mean over seeds (error bar = sample std) per regime and objective."""
    import matplotlib  # heavy start-up: only when drawing

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # heavy start-up: only when drawing

    exp = summary.exp
    regimes, objectives = [a.label for a in exp.regimes], [a.label for a in exp.objectives]
    width = 0.8 / len(objectives)
    panel_w = max(5.0, 0.9 * len(regimes) * max(1, len(objectives)) ** 0.5 + 2)
    fig, axes = plt.subplots(1, len(metrics), figsize=(panel_w * len(metrics), 3.8), squeeze=False)
    colors = plt.get_cmap("tab10")
    x = np.arange(len(regimes))
    for metric, ax in zip(metrics, axes[0]):
        for j, obj in enumerate(objectives):
            stats = [summary.stat(reg, obj, metric) for reg in regimes]
            means = [s[0] for s in stats]
            stds = [s[1] if s[2] > 1 else 0.0 for s in stats]
            offset = (j - (len(objectives) - 1) / 2) * width
            ax.bar(x + offset, means, width, yerr=stds, label=obj, color=colors(j % 10))
        ax.set_xticks(x, regimes)
        ax.set_title(f"{METRIC_LABELS.get(metric, metric)} (mean ± sd over {len(exp.seeds)} seeds)", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].legend(fontsize=8, ncol=min(4, len(objectives)))
    fig.suptitle(exp.name)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
