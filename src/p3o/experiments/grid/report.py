"""A finished grid as a markdown report with PNG figures, and the papers' claims tested on it.

For every regime: a figure (reward mean ± spread over seeds, smoothed; ESS; KL weight) and a table (final and
peak reward, final pass@1, ESS, KL weight, collapses, wall time). Each claim of the experiment file gets its own
table and a verdict computed from the runs (never written by hand).

    summary = collect(exp); write_report(summary, Path("docs/results/lm.md"), command="p3o compare ...")
"""

from __future__ import annotations

import math
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from p3o.experiments.grid.analysis import mean_std
from p3o.experiments.grid.collect import METRIC_LABELS, GridSummary, RunSummary, load_json
from p3o.experiments.grid.figures import plot_overview, plot_regime
from p3o.experiments.grid.peak import expected_best_of_k, expected_max_normal
from p3o.experiments.grid.spec import DECISIVE_KINDS, Claim, Experiment
from p3o.experiments.stats.paired import t_ppf
from p3o.experiments.stats.prereg import Preregistration, verdict_file
from p3o.experiments.stats.verdicts import (
    Decision,
    decide,
    family_lines,
    record_counts,
    records_table,
    rule_text,
)

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


def peak_final_table(summary: GridSummary, regime: str) -> str:
    """Peak and final held-out pass@1 of one regime, mean ± sample std over seeds: the final evaluation (the
    study's ``eval:`` block), the last in-loop evaluation, and the best in-loop evaluation after step 0 (the MinPRO
    paper reports its best checkpoint) with the step it fell on. Empty when no run evaluated in the loop."""
    cells = [(arm.label, summary.cell(regime, arm.label)) for arm in summary.exp.objectives]
    cells = [(label, cell) for label, cell in cells if label in summary.exp.objectives_in(regime)]
    if not any(r.evals for _, cell in cells for r in cell):
        return ""
    start = [v for _, cell in cells for r in cell for st, v in r.evals if st == 0]
    rows = [
        "| objective | seeds | final pass@1 (final evaluation) | final pass@1 (in-loop) | peak pass@1 (in-loop) "
        "| peak − final (in-loop) | peak step (mean) |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, cell in cells:

        def f(metric: str, _cell: list[RunSummary] = cell) -> str:
            return _fmt(*mean_std([r.metrics.get(metric, math.nan) for r in _cell]))

        gap = mean_std([r.metrics.get("eval_peak", math.nan) - r.metrics.get("eval_final", math.nan) for r in cell])
        at = mean_std([r.metrics.get("eval_peak_step", math.nan) for r in cell])[0]
        rows.append(
            f"| {label} | {len(cell)} | {f('pass@1')} | {f('eval_final')} | {f('eval_peak')} | {_fmt(*gap)} "
            f"| {f'{at:.0f}' if math.isfinite(at) else '–'} |"
        )
    steps = sorted({st for _, cell in cells for r in cell for st, _ in r.evals})
    note = (
        f"In-loop evaluations at steps {', '.join(map(str, steps))} (held-out problems, one sample each); "
        f"step 0, the starting policy, scores {np.mean(start):.3f} on average and is not a candidate for the peak."
        if start
        else f"In-loop evaluations at steps {', '.join(map(str, steps))}."
    )
    note += " " + peak_bias_note(summary, cells, start, steps)
    tested = [r.metrics["eval_peak_test"] for _, cell in cells for r in cell if "eval_peak_test" in r.metrics]
    if tested:
        lines = ["", "", "| objective | seeds | peak on validation (in-loop) | its checkpoint on test | step (mean) |"]
        lines.append("|---|---|---|---|---|")
        for label, cell in cells:
            val = mean_std([r.metrics.get("eval_peak_val", math.nan) for r in cell])
            test = mean_std([r.metrics.get("eval_peak_test", math.nan) for r in cell])
            at = mean_std([r.metrics.get("eval_peak_test_step", math.nan) for r in cell])[0]
            step = f"{at:.0f}" if math.isfinite(at) else "–"
            lines.append(f"| {label} | {len(cell)} | {_fmt(*val)} | {_fmt(*test)} | {step} |")
        note += "\n".join(lines)
    return "\n".join(rows) + "\n\n" + note


def peak_bias_note(summary: GridSummary, cells: list[tuple[str, list[RunSummary]]], start: list[float],
                   steps: list[int]) -> str:  # fmt: skip
    """The selection bias of an in-loop peak (:func:`p3o.experiments.grid.peak.expected_best_of_k`): how far the
    best of the k evaluations after step 0 sits above step 0 in expectation with no learning at all ("" when the
    step-0 score or the number of problems is unknown)."""
    k = len([st for st in steps if st > 0])
    n = [r.metrics["eval_problems"] for _, cell in cells for r in cell if "eval_problems" in r.metrics]
    if not start or not n or k < 1:
        return ""
    p0, n0 = float(np.mean(start)), int(max(n))
    bias = expected_best_of_k(min(max(p0, 0.0), 1.0), n0, k)
    return (
        f"Selection bias: with no learning at all, the best of these {k} evaluations on {n0} problems sits "
        f"{bias:+.3f} above step 0 in expectation (SE √(p0(1 − p0)/n) = {bias / expected_max_normal(k):.3f} × "
        f"E[max of {k} normals] = {expected_max_normal(k):.3f}), so the in-loop peak (`eval_peak`) is biased upward "
        "by about that much; `eval_peak_test` chooses the step on these evaluations and scores its checkpoint on "
        "disjoint test problems."
        if k > 1
        else ""
    )


#: MinPRO's diagnostics in the MinPRO paper's tables 7 (the prefix factor m_t) and 8 (effective weight per decile).
M_KEYS = ("m_mean", "m_median", "m_frac_above_0.5", "m_frac_above_0.2", "m_frac_above_0.1", "m_frac_above_0.05")


def minpro_stats_tables(summary: GridSummary, regime: str) -> str:
    """The MinPRO paper's tables 7 and 8 for one regime, each run's per-step means averaged over its steps, then
    over seeds: the data's m_t (the monitor's ``offpolicy/m_mean``, min of the earlier ratios, every arm) and, for
    the arms of the minpro objective, their own m_t's distribution and the effective weight per decile of relative
    position (the paper at n = 4: mean 0.301, 22 % above 0.5; weights 0.25 → 0.20). Empty without such stats."""
    cells = [(a.label, summary.cell(regime, a.label)) for a in summary.exp.objectives]
    cells = [(label, cell) for label, cell in cells if cell and label in summary.exp.objectives_in(regime)]

    def f(cell: list[RunSummary], key: str) -> str:
        m, _, n = mean_std([r.metrics.get(key, math.nan) for r in cell])
        return "–" if n == 0 or not math.isfinite(m) else f"{m:.3f}"

    data = [(label, cell) for label, cell in cells if any("offpolicy/m_mean" in r.metrics for r in cell)]
    own = [(label, cell) for label, cell in cells if any("weight_decile_0" in r.metrics for r in cell)]
    if not data and not own:
        return ""
    rows = [
        "| objective | data's mean m_t (monitor) | mean m_t | median m_t | m_t > 0.5 | m_t > 0.2 | m_t > 0.1 "
        "| m_t > 0.05 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    ablation = {label for label, cell in cells if any(_including(r) for r in cell)}
    for label, cell in cells:
        if (label, cell) in data or (label, cell) in own:
            own_m = " | ".join("n/a" if label in ablation else f(cell, k) for k in M_KEYS)
            rows.append(f"| {label} | {f(cell, 'offpolicy/m_mean')} | {own_m} |")
    out = ["Table 7 (the prefix factor m_t):", "", *rows]
    if ablation:
        out += [
            "",
            f"n/a: {', '.join(sorted(ablation))} weight each token by a statistic of ρ_1 … ρ_t (the paper's ablation, "
            "`prefix_scope: including`): no prefix factor multiplies ρ_t, and the w_t/ρ_t they log in its place is "
            "unbounded where ρ_t is small, so only the data's m_t and their weights (table 8) are shown.",
        ]
    if own:
        deciles = " | ".join(f"{10 * d}–{10 * d + 10} %" for d in range(10))
        out += ["", "Table 8 (effective token weight per decile of relative position):", ""]
        out += [f"| objective | {deciles} |", "|---" * 11 + "|"]
        for label, cell in own:
            out.append(f"| {label} | " + " | ".join(f(cell, f"weight_decile_{d}") for d in range(10)) + " |")
    return "\n".join(out)


def _including(run: RunSummary) -> bool:
    """Whether a run weighted tokens by the paper's prefix-statistic ablation (minpro ``prefix_scope: including``)."""
    return run.config.get("objective.prefix_scope") == "including"


def run_records(summary: GridSummary) -> list[dict[str, Any]]:
    """Every run's record for the verdict file (:meth:`RunSummary.record`), in the grid's order; runs without
    metrics are left out."""
    return [r.record() for r in summary.runs if r.curves]


def paired_values(
    summary: GridSummary, regime: str, a: str, b: str, metric: str
) -> tuple[list[float], list[float], list[int]]:
    """Per-seed values of `metric` for objectives a and b in `regime`, over the seeds both have (seed order), and
    those seeds (the verdict file stores them beside the values)."""
    by_seed = {
        obj: {r.spec.seed: r.metrics.get(metric, math.nan) for r in summary.cell(regime, obj)} for obj in (a, b)
    }
    seeds = [s for s in summary.exp.seeds if s in by_seed[a] and s in by_seed[b]]
    return [by_seed[a][s] for s in seeds], [by_seed[b][s] for s in seeds], seeds


def unfinished_arms(summary: GridSummary) -> dict[str, list[str]]:
    """regime -> the objectives run there with fewer finished runs with metrics (:meth:`GridSummary.cell`) than the
    study's seeds: arms a stopped study did not complete. Empty for a finished grid."""
    exp = summary.exp
    out: dict[str, list[str]] = {}
    for regime in exp.regimes:
        for obj in exp.objectives_in(regime.label):
            if len(summary.cell(regime.label, obj)) < len(exp.seeds):
                out.setdefault(regime.label, []).append(obj)
    return out


def _complete_claims(summary: GridSummary) -> tuple[list[Claim], dict[str, Any], list[str]]:
    """The claims and baseline families restricted to finished arms, and one line per comparison left out.

    A comparison needs every seed of both arms: a regime where A or a plain B is unfinished is dropped from the
    claim (the claim is dropped without regimes), an unfinished member from its family (a family without
    members is dropped). Nothing changes in a finished grid."""
    exp = summary.exp
    missing = unfinished_arms(summary)
    if not missing:
        return list(exp.claims), dict(exp.baselines), []
    every = {o for objs in missing.values() for o in objs}
    families = {
        name: replace(fam, members=[m for m in fam.members if m not in every]) for name, fam in exp.baselines.items()
    }
    notes: list[str] = []
    claims: list[Claim] = []
    for claim in exp.claims:
        if claim.kind not in DECISIVE_KINDS:
            claims.append(claim)
            continue
        a, b = claim.objectives[0], claim.objectives[1]
        fam = exp.baselines.get(b)
        regimes = []
        for regime in claim.regimes:
            gone = missing.get(regime, [])
            if a in gone or (fam is None and b in gone):
                notes.append(f"({claim.id}) {a} vs {b} in {regime}: not run (unfinished arm: {a if a in gone else b})")
                continue
            if fam is not None:
                notes += [
                    f"({claim.id}) {a} vs {m} in {regime}: not run (unfinished arm)" for m in fam.members if m in gone
                ]
                if not families[b].members:
                    continue
            regimes.append(regime)
        if regimes:
            claims.append(replace(claim, regimes=regimes))
    return claims, {k: v for k, v in families.items() if v.members}, notes


def grid_decisions(summary: GridSummary, *, exploratory: bool = False) -> list[Decision]:
    """Every decisive claim × regime of the grid (:func:`p3o.experiments.stats.verdicts.decide` on its runs); a
    comparison with an unfinished arm has no verdict (:func:`_complete_claims`)."""
    exp = summary.exp
    claims, families, _ = _complete_claims(summary)
    return decide(
        claims,
        exp.primary,
        lambda *key: paired_values(summary, *key),
        families=families,
        selection=summary.selection,
        exploratory=exploratory,
    )


def _base_eval(exp: Experiment) -> tuple[dict[str, Any], float]:
    """``out_dir/base_eval.json`` ({} if none) and its pass@1 (NaN if none): the one reader of that file."""
    base = load_json(exp.out_dir / "base_eval.json") or {}
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


def _grid_lines(summary: GridSummary) -> list[str]:
    """The "Testbed and grid" section (and the runs without metrics)."""
    exp = summary.exp
    finished = [r for r in summary.runs if r.curves]
    total_s = sum(r.seconds for r in summary.runs if math.isfinite(r.seconds))
    lines = ["## Testbed and grid", ""]
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
    return lines


def _calibration_lines(summary: GridSummary) -> list[str]:
    """The "Calibration" section (empty when the experiment names no calibration objective)."""
    exp = summary.exp
    if not exp.calibration:
        return []
    lines = [
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
    return lines + ([gains, ""] if gains else [])


def _verdict_lines(exp: Experiment, decisions: list[Decision], not_run: list[str] | None = None) -> list[str]:
    """The "Verdicts" section of a grid's report (:func:`verdict_section` of its decisions' records)."""
    return verdict_section([d.to_dict() for d in decisions], not_run)


def verdict_section(
    records: list[dict[str, Any]], not_run: list[str] | None = None, *, digits: int = 3, source: str = ""
) -> list[str]:
    """The "Verdicts" section from verdict records (``*.verdicts.json``): today's decision rule in words
    (:func:`p3o.experiments.stats.verdicts.rule_text`), the verdict table with each record's ``p_adj`` and label,
    the baseline families' choices, and the comparisons left without a verdict because an arm did not finish
    (``not_run``). ``source``: the sentence saying where the section was rendered from ("" for ``p3o compare``).
    ``p3o compare`` and the summary's regeneration of a report from its verdict file render it alike."""
    if not records:
        return (
            ["## Verdicts", "", "No comparison could be decided:", "", *[f"- {x}" for x in not_run], ""]
            if not_run
            else []
        )
    metric = next((r["metric"] for r in records if r.get("role", "primary") == "primary"), "")
    lines = [
        "## Verdicts",
        "",
        "The decision rule (`primary:` in the experiment file): "
        + rule_text(records, METRIC_LABELS.get(metric, ""))
        + " Computed by `p3o.experiments.stats`; primary verdicts (in-study, this study's Holm family): "
        f"{record_counts(records)}." + (f" {source}" if source else ""),
        "",
        records_table(records, digits),
        "",
        *family_lines(records),
    ]
    if not_run:
        lines += ["", "Comparisons without a verdict (an arm did not finish every seed):", ""]
        lines += [f"- {line}" for line in not_run]
    if family_lines(records):
        lines.append("")
    return lines


def _claim_lines(summary: GridSummary, decisions: list[Decision]) -> list[str]:
    """The "Claims" section: each claim's text, its table, and its verdicts or computed sentences."""
    exp = summary.exp
    if not exp.claims:
        return []
    lines = ["## Claims", ""]
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
    return lines


def _figure_lines(summary: GridSummary, figure_dir: Path, rel: Path) -> list[str]:
    """The overview figure and one section per regime (figure and table); writes the PNGs into ``figure_dir``."""
    exp = summary.exp
    overview = plot_overview(summary, figure_dir / f"{exp.name}-overview.png")
    lines = ["## Overview", "", f"![final reward and pass@1 per regime]({rel / overview.name})", ""]
    lines += ["## Results per regime", ""]
    for arm in exp.regimes:
        fig = plot_regime(summary, arm.label, figure_dir / f"{exp.name}-{arm.label}.png")
        lines += [f"### {arm.label}", "", f"Overrides: {_kv(arm.overrides) or '(none)'}", ""]
        lines += [f"![{arm.label}]({rel / fig.name})", "", regime_table(summary, arm.label), ""]
        peak = peak_final_table(summary, arm.label)
        if peak:
            lines += ["#### Peak and final held-out pass@1", "", peak, ""]
        tables = minpro_stats_tables(summary, arm.label)
        if tables:
            lines += ["#### MinPRO's statistics per arm (the MinPRO paper's tables 7 and 8)", "", tables, ""]
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
    rel = Path(os.path.relpath(figure_dir.resolve(), report_path.parent.resolve()))
    lines = [f"# Experiment `{exp.name}`", ""]
    if command:
        lines += [f"Generated by `{command}`" + (f" from `{exp.source}`." if exp.source else "."), ""]
    if preregistration is not None:
        lines += preregistration.lines(exp.source)
    if exp.description.strip():
        lines += [exp.description.strip(), ""]
    decisions = grid_decisions(summary) if decisions is None else decisions
    not_run = _complete_claims(summary)[2]
    lines += _grid_lines(summary) + _calibration_lines(summary) + _verdict_lines(exp, decisions, not_run)
    lines += _claim_lines(summary, decisions) + _figure_lines(summary, figure_dir, rel)
    return "\n".join(lines).rstrip() + "\n"


def _kv(overrides: dict[str, Any]) -> str:
    return ", ".join(f"`{k}={v}`" for k, v in overrides.items())


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
    decisions = grid_decisions(summary, exploratory=exploratory)  # once: the table and the verdict file show the same
    text = render_report(summary, figure_dir, report_path, command, decisions, preregistration)
    report_path.parent.mkdir(parents=True, exist_ok=True)
    report_path.write_text(text)
    records = [d.to_dict() for d in decisions]
    runs = run_records(summary)
    report_path.with_suffix(".verdicts.json").write_text(verdict_file(preregistration, records, runs=runs))
    return report_path
