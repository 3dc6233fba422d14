"""Aggregate a finished grid into a markdown report with PNG figures, and test the papers' claims on it.

For every regime: a figure (reward mean ± spread over seeds, smoothed; ESS; KL weight) and a table (final and
peak reward, final pass@1, ESS, KL weight, collapses, wall time). Each claim of the experiment file gets its own
table and a verdict computed from the runs (never written by hand).

    summary = collect(exp); write_report(exp, summary, Path("docs/results-lm.md"), command="p3o compare ...")
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from p3o.errors import DataError
from p3o.experiments.analysis import (
    CollapseInfo,
    Curves,
    aggregate_seeds,
    detect_collapse,
    final_value,
    mean_std,
    read_curves,
    smooth,
)
from p3o.experiments.prereg import Preregistration, verdict_file
from p3o.experiments.spec import DECISIVE_KINDS, Claim, Experiment, RunSpec, expand, flatten
from p3o.experiments.stats import t_ppf
from p3o.experiments.verdicts import Decision, FamilyNote, decisions_table, tested_count, verdict_counts
from p3o.experiments.verdicts import decide as decide_claims

REWARD_KEY = "reward_mean"
METRIC_LABELS = {
    "final_reward": "final reward",
    "peak_reward": "peak reward",
    "pass@1": "final pass@1",
    "final_accuracy": "final accuracy",
    "collapsed": "collapse rate",
    "late_eval": "held-out accuracy over the last third",
}


@dataclass
class RunSummary:
    """The numbers of one finished (or partly finished) run."""

    spec: RunSpec
    curves: Curves
    config: dict[str, Any]
    eval: dict[str, Any] | None
    collapse: CollapseInfo | None
    metrics: dict[str, float] = field(default_factory=dict)
    seconds: float = math.nan


@dataclass
class GridSummary:
    """All runs of an experiment, by (regime, objective)."""

    exp: Experiment
    runs: list[RunSummary]

    def cell(self, regime: str, objective: str) -> list[RunSummary]:
        """The test seeds of one (regime, objective) that have metrics (selection runs of baseline families are not
        test runs: see :meth:`selection`)."""
        seeds = set(self.exp.seeds)
        return [
            r
            for r in self.runs
            if r.spec.regime == regime and r.spec.objective == objective and r.curves and r.spec.seed in seeds
        ]

    def selection(self, regime: str, objective: str, metric: str) -> list[float]:
        """`metric` of the runs of `objective` in `regime` on the selection seeds of the baseline families."""
        seeds = {s for f in self.exp.baselines.values() for s in f.selection_seeds} - set(self.exp.seeds)
        return [
            r.metrics.get(metric, math.nan)
            for r in self.runs
            if r.spec.regime == regime and r.spec.objective == objective and r.curves and r.spec.seed in seeds
        ]

    def stat(self, regime: str, objective: str, metric: str) -> tuple[float, float, int]:
        """Mean, sample std and count over seeds of a per-run metric."""
        return mean_std([r.metrics.get(metric, math.nan) for r in self.cell(regime, objective)])


def _load_yaml(path: Path) -> dict[str, Any]:
    try:
        raw = yaml.safe_load(path.read_text()) if path.is_file() else None
    except (yaml.YAMLError, OSError):
        raw = None
    return flatten(raw) if isinstance(raw, dict) else {}


def _load_json(path: Path) -> dict[str, Any] | None:
    try:
        raw = json.loads(path.read_text()) if path.is_file() else None
    except (json.JSONDecodeError, OSError):
        return None
    return raw if isinstance(raw, dict) else None


def summarize_run(spec: RunSpec, exp: Experiment) -> RunSummary:
    """Read one run directory (metrics.jsonl, config.yaml, eval.json, DONE) and compute its summary numbers."""
    a = exp.analysis
    try:
        curves = read_curves(spec.run_dir / "metrics.jsonl")
    except DataError as err:  # a corrupt file (not a torn last line): this run is left out, loudly, not the report
        print(f"p3o compare: warning: {err}; run left out of the report", file=sys.stderr)
        curves = {}
    config = _load_yaml(spec.run_dir / "config.yaml")
    ev = _load_json(spec.run_dir / "eval.json")
    done = _load_json(spec.run_dir / "DONE") or {}
    summary = RunSummary(spec, curves, config, ev, None)
    seconds = done.get("seconds")
    if isinstance(seconds, (int, float)):
        summary.seconds = float(seconds)
    elif "time_s" in curves and np.isfinite(curves["time_s"]).any():
        summary.seconds = float(np.nanmax(curves["time_s"]))
    if not curves:
        return summary
    m = summary.metrics
    m["steps"] = float(curves["step"].size)
    if REWARD_KEY in curves:
        reward = curves[REWARD_KEY]
        summary.collapse = detect_collapse(
            reward, drop=a.collapse_drop, window=a.smooth, min_peak=a.min_peak, noise_z=a.noise_z
        )
        m["final_reward"] = final_value(reward, a.final_frac)
        m["first_reward"] = float(smooth(reward, a.smooth)[min(a.smooth, reward.size) - 1])
        m["peak_reward"] = summary.collapse.peak
        m["collapsed"] = float(summary.collapse.collapsed)
    if "accuracy" in curves:
        m["final_accuracy"] = final_value(curves["accuracy"], a.final_frac)
    if "eval_accuracy" in curves:
        ev_curve = curves["eval_accuracy"]
        ok = np.isfinite(ev_curve)
        if ok.any():
            steps = curves["step"][ok]
            late = steps >= steps.max() * 2.0 / 3.0
            m["late_eval"] = float(ev_curve[ok][late].mean())
            m["first_eval"] = float(ev_curve[ok][0])
            m["delta_eval"] = float(ev_curve[ok][-1] - ev_curve[ok][0])
    for key in (
        "ess",
        "kl_weight",
        "capped_frac",
        "band_frac",
        "clipfrac",
        "trunc_frac",
        "approx_kl",
        "ratio_max",
        "lag_mean",
        "m_mean",
        "m_frac_above_0_5",
        "m_frac_below_0_1",
    ):
        if key in curves and np.isfinite(curves[key]).any():
            m[key] = float(np.nanmean(curves[key]))
            m[f"min_{key}"] = float(np.nanmin(curves[key]))
            m[f"max_{key}"] = float(np.nanmax(curves[key]))
            m[f"p10_{key}"] = float(np.nanpercentile(curves[key], 10))
    if ev is not None:
        passk = ev.get("pass_at_k", {})
        if isinstance(passk, dict) and "1" in {str(k) for k in passk}:
            m["pass@1"] = float({str(k): v for k, v in passk.items()}["1"])
    return summary


def collect(exp: Experiment) -> GridSummary:
    """Summaries of every run of the grid (runs without metrics yet are kept, with empty curves)."""
    return GridSummary(exp, [summarize_run(spec, exp) for spec in expand(exp)])


# ---------------------------------------------------------------------------------------------- figures


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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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


# ---------------------------------------------------------------------------------------------- tables


def _fmt(mean: float, std: float, n: int, digits: int = 3) -> str:
    if n == 0 or not math.isfinite(mean):
        return "–"
    return f"{mean:.{digits}f} ± {std:.{digits}f}" if n > 1 else f"{mean:.{digits}f}"


def regime_table(summary: GridSummary, regime: str) -> str:
    """Markdown table of one regime: one row per objective, mean ± sample std over seeds."""
    head = (
        "| objective | seeds | final reward | peak reward | final pass@1 | mean ESS | min ESS | mean KL weight "
        "| collapsed | wall s/run |\n|---|---|---|---|---|---|---|---|---|---|"
    )
    rows = [head]
    for arm in summary.exp.objectives:
        if arm.label not in summary.exp.objectives_in(regime):
            continue
        cell = summary.cell(regime, arm.label)

        def f(metric: str, digits: int = 3, _cell: list[RunSummary] = cell) -> str:
            return _fmt(*mean_std([r.metrics.get(metric, math.nan) for r in _cell]), digits=digits)

        collapsed = sum(1 for r in cell if r.collapse is not None and r.collapse.collapsed)
        secs = mean_std([r.seconds for r in cell])[0]
        rows.append(
            f"| {arm.label} | {len(cell)}/{len(summary.exp.seeds)} | {f('final_reward')} | {f('peak_reward')} "
            f"| {f('pass@1')} | {f('ess')} | {f('min_ess')} | {f('kl_weight')} | {collapsed}/{len(cell)} "
            f"| {f'{secs:.0f}' if math.isfinite(secs) else '–'} |"
        )
    return "\n".join(rows)


# ---------------------------------------------------------------------------------------------- claims


def _claim_table(summary: GridSummary, claim: Claim) -> str:
    families = summary.exp.baselines
    named = [m for o in [*claim.objectives, *claim.reference] for m in (families[o].members if o in families else [o])]
    objectives = list(dict.fromkeys(named))
    metric = claim.metric
    head = "| regime | " + " | ".join(objectives) + " |\n|---|" + "---|" * len(objectives)
    rows = [head]
    for regime in claim.regimes:
        cells = []
        for obj in objectives:
            if metric == "collapsed":
                runs = summary.cell(regime, obj)
                k = sum(1 for r in runs if r.collapse is not None and r.collapse.collapsed)
                drops = [r.collapse.drop for r in runs if r.collapse is not None]
                worst = f", worst drop {max(drops):.0%}" if drops else ""
                cells.append(f"{k}/{len(runs)} collapsed{worst}")
            else:
                cells.append(_fmt(*summary.stat(regime, obj, metric)))
        rows.append(f"| {regime} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _se(std: float, n: int) -> float:
    return std / math.sqrt(n) if n > 1 else math.nan


def claim_verdict(summary: GridSummary, claim: Claim) -> list[str]:
    """One sentence per regime saying what the runs show about the claim (computed, mean ± sample std)."""
    metric, label = claim.metric, METRIC_LABELS.get(claim.metric, claim.metric)
    out = []
    for regime in claim.regimes:
        stats = {o: summary.stat(regime, o, metric) for o in [*claim.objectives, *claim.reference]}
        if any(n == 0 for _, _, n in stats.values()) and claim.kind != "collapse":
            missing = [o for o, (_, _, n) in stats.items() if n == 0]
            out.append(f"**{regime}**: no finished runs of {', '.join(missing)} — not tested.")
            continue
        if claim.kind == "spread":
            means = {o: stats[o][0] for o in claim.objectives}
            lo, hi = min(means, key=means.get), max(means, key=means.get)
            ses = [_se(stats[o][1], stats[o][2]) for o in claim.objectives]
            noise = 2 * max((s for s in ses if math.isfinite(s)), default=math.nan)
            sentence = (
                f"**{regime}**: {label} spans {means[hi] - means[lo]:.3f} across {', '.join(claim.objectives)} "
                f"(best {hi} {means[hi]:.3f}, worst {lo} {means[lo]:.3f}; largest 2·SE {noise:.3f})"
            )
            for ref in claim.reference:
                m = stats[ref][0]
                where = (
                    "above every setting"
                    if m > means[hi]
                    else "below every setting"
                    if m < means[lo]
                    else ("inside their range")
                )
                sentence += f"; {ref} {m:.3f} is {where}"
            out.append(sentence + ".")
        elif claim.kind == "collapse":
            parts = []
            for o in claim.objectives:
                runs = summary.cell(regime, o)
                k = sum(1 for r in runs if r.collapse is not None and r.collapse.collapsed)
                parts.append(f"{o} {k}/{len(runs)}")
            out.append(
                f"**{regime}**: runs that collapsed (fell > {summary.exp.analysis.collapse_drop:.0%} below their "
                f"peak, beyond batch noise, and stayed there): " + ", ".join(parts) + "."
            )
        elif claim.kind == "rank":
            order = sorted(claim.objectives, key=lambda o: -stats[o][0] if math.isfinite(stats[o][0]) else math.inf)
            ranking = " > ".join(f"{o} {stats[o][0]:.3f}" for o in order)
            sentence = f"**{regime}**: {ranking}"
            if claim.expected:
                top = set(order[: len(claim.expected)])
                others = [o for o in order if o not in claim.expected]
                verb = "is" if len(claim.expected) == 1 else "are"
                sentence += (
                    f"; {' and '.join(claim.expected)} "
                    + (verb if top == set(claim.expected) else f"{verb} not")
                    + (" the best" if len(claim.expected) == 1 else f" the top {len(claim.expected)}")
                )
                if others:
                    best_exp = max(claim.expected, key=lambda o: stats[o][0])
                    best_other = others[0]
                    (m1, s1, n1), (m2, s2, n2) = stats[best_exp], stats[best_other]
                    se = math.sqrt(_se(s1, n1) ** 2 + _se(s2, n2) ** 2)
                    if math.isfinite(se):
                        gap = m1 - m2
                        sig = "beyond" if abs(gap) > 2 * se else "within"
                        sentence += f" (best expected − best other = {gap:+.3f}, {sig} 2·SE {2 * se:.3f})"
            out.append(sentence + ".")
    return out


def paired_values(summary: GridSummary, regime: str, a: str, b: str, metric: str) -> tuple[list[float], list[float]]:
    """Per-seed values of `metric` for objectives a and b in `regime`, over the seeds both have (seed order)."""
    by_seed = {
        obj: {r.spec.seed: r.metrics.get(metric, math.nan) for r in summary.cell(regime, obj)} for obj in (a, b)
    }
    seeds = [s for s in summary.exp.seeds if s in by_seed[a] and s in by_seed[b]]
    return [by_seed[a][s] for s in seeds], [by_seed[b][s] for s in seeds]


def decide(summary: GridSummary, *, exploratory: bool = False) -> list[Decision]:
    """Every decisive claim × regime of the grid (:func:`p3o.experiments.verdicts.decide` on its runs)."""
    exp = summary.exp
    return decide_claims(
        exp.claims,
        exp.primary,
        lambda *key: paired_values(summary, *key),
        families=exp.baselines,
        selection=summary.selection,
        exploratory=exploratory,
    )


def _base_eval(exp: Experiment) -> tuple[dict[str, Any], float]:
    """``out_dir/base_eval.json`` ({} if none) and its pass@1 (NaN if none): the one reader of that file."""
    base = _load_json(exp.out_dir / "base_eval.json") or {}
    return base, float({str(k): v for k, v in (base.get("pass_at_k") or {}).items()}.get("1", math.nan))


def _base_line(exp: Experiment) -> str:
    base, p1 = _base_eval(exp)
    if math.isnan(p1):
        return " (no base evaluation found)"
    return f" ({p1:.3f} on {base.get('n_problems', '?')} × {base.get('n_samples', '?')} samples)"


def base_pass1(exp: Experiment) -> float:
    """The base policy's pass@1 under the experiment's final evaluation (``out_dir/base_eval.json``; NaN if none)."""
    return _base_eval(exp)[1]


def seed_gains(summary: GridSummary, objective: str) -> str:
    """One line per regime: the calibration objective's Δ pass@1 vs the base on every seed (seed: Δ), and how many
    seeds gained at least 0.05, so a reader sees the spread behind the mean."""
    base = base_pass1(summary.exp)
    lines = []
    for arm in summary.exp.regimes:
        cell = sorted(summary.cell(arm.label, objective), key=lambda r: r.spec.seed)
        gains = [(r.spec.seed, r.metrics.get("pass@1", math.nan) - base) for r in cell]
        gains = [(s, g) for s, g in gains if math.isfinite(g)]
        if not gains:
            continue
        each = ", ".join(f"{s}: {g:+.3f}" for s, g in gains)
        n_ok = sum(g >= 0.05 for _, g in gains)
        lines.append(f"- **{arm.label}**, Δ pass@1 vs base by seed: {each} ({n_ok}/{len(gains)} seeds ≥ +0.05)")
    return "\n".join(lines)


def calibration_table(summary: GridSummary, objective: str) -> str:
    """How off-policy each regime makes the data: the calibration objective's runs, every seed pooled.

    Columns: lr; mean and 10th percentile of the per-step ESS (all steps of all seeds); its minimum; the share of
    tokens with |ρ − 1| > 0.2 (``band_frac``: what a GRPO clip at ε = 0.2 would act on); MinPRO's prefix factor
    m_t of the same ratios (mean, share > 0.5, share < 0.1); the final pass@1 and its change from the base policy's
    pass@1 under the same evaluation (``out_dir/base_eval.json``, written by ``p3o compare``): mean ± sample std
    over seeds and the 95 % t-interval of that mean (Δ_s = pass@1_s − base; the base is one evaluation, so its own
    sampling noise is common to every seed and not in the interval).
    """
    base_p1 = base_pass1(summary.exp)
    head = (
        "| regime | seeds | lr | mean ESS | p10 ESS | min ESS | \\|ρ−1\\| > 0.2 | mean m_t | m_t > 0.5 | m_t < 0.1 | "
        "final pass@1 | Δ pass@1 vs base |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    rows = [head]
    for arm in summary.exp.regimes:
        cell = summary.cell(arm.label, objective)
        if not cell:
            continue
        ess = np.concatenate([r.curves["ess"][np.isfinite(r.curves["ess"])] for r in cell if "ess" in r.curves])
        lr = cell[0].config.get("optim.lr", summary.exp.base.get("optim.lr", "?"))

        def mean(metric: str, digits: int = 3, _cell: list[RunSummary] = cell) -> str:
            m, s, n = mean_std([r.metrics.get(metric, math.nan) for r in _cell])
            return (
                "–"
                if n == 0
                else f"{m:.{digits}f}"
                + (f" ± {s:.{digits}f}" if n > 1 and metric.startswith(("delta", "pass")) else "")
            )

        deltas = [r.metrics.get("pass@1", math.nan) - base_p1 for r in cell]
        dm, ds, dn = mean_std(deltas)
        delta = "–" if dn == 0 or not math.isfinite(dm) else f"{dm:+.3f} ± {ds:.3f}"
        if dn > 1 and math.isfinite(dm):
            half = t_ppf(0.975, dn - 1) * ds / math.sqrt(dn)
            delta += f" [{dm - half:+.3f}, {dm + half:+.3f}]"
        p10 = f"{np.percentile(ess, 10):.4f}" if ess.size else "–"
        mess = f"{ess.mean():.4f}" if ess.size else "–"
        mn = f"{ess.min():.4f}" if ess.size else "–"
        rows.append(
            f"| {arm.label} | {len(cell)} | {lr} | {mess} | {p10} | {mn} | {mean('band_frac', 4)} | "
            f"{mean('m_mean')} | {mean('m_frac_above_0_5')} | {mean('m_frac_below_0_1', 4)} | "
            f"{mean('pass@1')} | {delta} |"
        )
    return "\n".join(rows)


# ---------------------------------------------------------------------------------------------- report


def _testbed(summary: GridSummary) -> list[str]:
    cfg = next((r.config for r in summary.runs if r.config), {})
    ev = next((r.eval for r in summary.runs if r.eval), None)
    keys = [
        "model.name",
        "task.name",
        "task.difficulty",
        "steps",
        "rollout.prompts_per_step",
        "rollout.group_size",
        "rollout.max_new_tokens",
        "rollout.temperature",
        "optim.lr",
        "update.num_mini_batches",
    ]
    lines = []
    shown = {k: cfg.get(k, summary.exp.base.get(k)) for k in keys}
    shown = {k: v for k, v in shown.items() if v is not None}
    if shown:
        lines.append(
            "- Common settings (before regime overrides): " + ", ".join(f"`{k}={v}`" for k, v in shown.items())
        )
    if ev and ev.get("num_params"):
        lines.append(f"- Policy size: {int(ev['num_params']) / 1e6:.2f} M parameters")
    if ev:
        lines.append(
            f"- Final evaluation: {ev.get('n_problems', '?')} `{ev.get('split', 'test')}` problems × "
            f"{ev.get('n_samples', '?')} samples at temperature {ev.get('temperature', '?')}"
            + (f", `{ev['engine']}` engine for the base and every run" if ev.get("engine") else "")
        )
    return lines


def render_report(
    summary: GridSummary,
    figure_dir: Path,
    report_path: Path,
    command: str | None = None,
    decisions: list[Decision] | None = None,
    preregistration: Preregistration | None = None,
) -> str:
    """The markdown text of the report; writes the figures into `figure_dir` (linked relative to the report)."""
    exp = summary.exp
    rel = Path(_relpath(figure_dir, report_path.parent))
    lines = [f"# Experiment `{exp.name}`", ""]
    if command:
        lines += [f"Generated by `{command}`" + (f" from `{exp.source}`." if exp.source else "."), ""]
    if preregistration is not None:
        lines += preregistration.lines(exp.source)
    if exp.description.strip():
        lines += [exp.description.strip(), ""]
    finished = [r for r in summary.runs if r.curves]
    total_s = sum(r.seconds for r in summary.runs if math.isfinite(r.seconds))
    lines += ["## Testbed and grid", ""]
    lines += _testbed(summary)
    lines += [
        "- Objectives: " + ", ".join(f"`{a.label}`" for a in exp.objectives),
        "- Regimes: "
        + "; ".join(
            f"`{a.label}` ({_kv(a.overrides)}" + (f"; only {', '.join(a.objectives)}" if a.objectives else "") + ")"
            for a in exp.regimes
        ),
        f"- Seeds: {', '.join(map(str, exp.seeds))}; runs with metrics: {len(finished)}/{len(summary.runs)}; "
        f"training time summed over runs {total_s / 60:.1f} min",
        f"- Final reward = mean of the last {exp.analysis.final_frac:.0%} of steps; curves smoothed over "
        f"{exp.analysis.smooth} steps; a *collapse* is a fall of more than {exp.analysis.collapse_drop:.0%} below "
        f"the run's smoothed peak, and more than {exp.analysis.noise_z:g} standard errors of its step-to-step batch "
        f"noise, that lasts to the end (peaks below {exp.analysis.min_peak} are not counted).",
        "",
    ]
    missing = [r.spec for r in summary.runs if not r.curves]
    if missing:
        lines += [
            "Runs without metrics (failed or not run): "
            + ", ".join(f"{s.regime}/{s.objective}/seed{s.seed}" for s in missing),
            "",
        ]
    if exp.calibration:
        lines += [
            "## Calibration",
            "",
            f"Every regime's `{exp.calibration}` runs, all seeds pooled (see `calibration_table`): how far each "
            "regime moves the ratios π_θ / π_rollout at this learning rate, and whether training moved held-out "
            "pass@1 from the base policy's"
            + _base_line(exp)
            + ". ESS columns pool every step of every seed; the other columns are means over seeds (± sample std).",
            "",
            calibration_table(summary, exp.calibration),
            "",
        ]
        gains = seed_gains(summary, exp.calibration)
        lines += [gains, ""] if gains else []
    decisions = decide(summary) if decisions is None else decisions
    if decisions:
        pr = exp.primary
        lines += [
            "## Verdicts",
            "",
            f"The decision rule (`primary:` in the experiment file): metric **{pr.metric}** "
            f"({METRIC_LABELS.get(pr.metric, pr.metric)}), paired by seed; {1 - pr.alpha:.0%} paired-t intervals; "
            f"Holm's correction over the {tested_count(decisions)} tested primary "
            f"verdicts at family-wise α = {pr.alpha:g}; margin δ = {pr.margin:g}: *tracks* is TOST within ±δ and is "
            "contradicted only by an interval entirely outside [−δ, δ]; an effect below δ is *negligible*. "
            "*identical* asks for exactly equal per-seed values. Secondary metrics"
            + (f" ({', '.join(pr.secondary)})" if pr.secondary else "")
            + " get their verdicts beside the primary one, labelled secondary (their own Holm family). Computed by "
            f"`p3o.experiments.stats`; primary verdicts: {verdict_counts(decisions)}.",
            "",
            decisions_table(decisions),
            "",
            *FamilyNote.of(decisions).lines,
        ]
        if FamilyNote.of(decisions).lines:
            lines.append("")
    if exp.claims:
        lines += ["## Claims", ""]
        for claim in exp.claims:
            lines += [f"### ({claim.id}) {claim.title}", ""]
            if claim.text.strip():
                lines += [claim.text.strip(), ""]
            lines += [f"Metric: {METRIC_LABELS.get(claim.metric, claim.metric)} (mean ± sample std over seeds).", ""]
            lines += [_claim_table(summary, claim), ""]
            if claim.kind in DECISIVE_KINDS:
                lines += [
                    f"- **{d.regime}**"
                    + (f" vs {d.pair[1]}" if d.baseline else "")
                    + f": {d.verdict} (see the verdict table)"
                    for d in decisions
                    if d.claim is claim and d.role == "primary"
                ]
            else:
                lines += [f"- {s}" for s in claim_verdict(summary, claim)]
            lines += [""]
    overview = plot_overview(summary, figure_dir / f"{exp.name}-overview.png")
    lines += ["## Overview", "", f"![final reward and pass@1 per regime]({rel / overview.name})", ""]
    lines += ["## Results per regime", ""]
    for arm in exp.regimes:
        fig = plot_regime(summary, arm.label, figure_dir / f"{exp.name}-{arm.label}.png")
        lines += [f"### {arm.label}", "", f"Overrides: {_kv(arm.overrides) or '(none)'}", ""]
        lines += [f"![{arm.label}]({rel / fig.name})", "", regime_table(summary, arm.label), ""]
    return "\n".join(lines).rstrip() + "\n"


def _kv(overrides: dict[str, Any]) -> str:
    return ", ".join(f"`{k}={v}`" for k, v in overrides.items())


def _relpath(target: Path, start: Path) -> str:
    import os

    return os.path.relpath(target.resolve(), start.resolve())


def write_report(
    summary: GridSummary,
    report_path: Path,
    *,
    figure_dir: Path | None = None,
    command: str | None = None,
    preregistration: Preregistration | None = None,
) -> Path:
    """Write the report (default figures: `<report dir>/figures/`) and its ``.verdicts.json`` (with the
    ``preregistration`` record; None: not recorded) and return the report's path."""
    figure_dir = figure_dir or report_path.parent / "figures"
    exploratory = preregistration is not None and preregistration.exploratory
    decisions = decide(summary, exploratory=exploratory)  # once: the table and the verdict file show the same
    text = render_report(summary, figure_dir, report_path, command, decisions, preregistration)
    report_path.parent.mkdir(parents=True, exist_ok=True)
    report_path.write_text(text)
    records = [d.to_dict() for d in decisions]
    report_path.with_suffix(".verdicts.json").write_text(verdict_file(preregistration, records))
    return report_path


def write_block(path: str | Path, block: str, body: str) -> None:
    """Replace the text between ``<!-- {block}:begin -->`` and ``<!-- {block}:end -->`` lines of ``path`` with
    ``body`` (the markers are appended first when missing; the rest of the file is kept byte for byte)."""
    p = Path(path)
    begin, end = f"<!-- {block}:begin -->", f"<!-- {block}:end -->"
    text = p.read_text() if p.is_file() else ""
    if begin not in text or end not in text:
        text += f"\n{begin}\n{end}\n"
    pre, rest = text.split(begin, 1)
    p.write_text(f"{pre}{begin}\n{body}\n{end}{rest.split(end, 1)[1]}")
