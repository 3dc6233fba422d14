"""The probe's summaries and renderings: per (objective, lag) and per ESS-bin means of the per-batch rows, the
markdown tables (cosine, norm ratio, gain, where the gradient reverses, exact KL), the 2×2 figure and the doc block
that ``p3o probe --update-doc`` rewrites."""

from __future__ import annotations

import itertools
import math
import re
from pathlib import Path
from typing import Any

from p3o.experiments.summary.blocks import write_block

#: Batch-ESS bins of the cosine-vs-ESS summary.
ESS_BINS = (0.0, 0.5, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99, 0.995, 0.999, 0.99999, 1.0001)


def nanmean(xs: list[float]) -> float:
    v = [x for x in xs if x == x]
    return sum(v) / len(v) if v else math.nan


def summarise(
    cols: dict[str, list], mean_dirs: dict[tuple[str, int], list[tuple[float, float]]] | None = None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Per (objective, lag) and per (objective, ESS bin) means of the probe's per-batch rows.

    Per-batch means (ess, cos, norm_ratio, cos_exact, gain, zero_frac) are taken over the SIGNAL batches (at least
    one group with reward spread: elsewhere every objective but P3O has an exactly zero gradient, and P3O only its
    KL term); ``no_signal_frac`` is the share of the other batches. With ``mean_dirs``: ``cos_of_mean`` and
    ``norm_of_mean`` = mean over (traj, point) of cos(mean_b d_b, g_ref) and ‖mean_b d_b‖/‖g_ref‖ over ALL batches
    (what a step summing them would follow; the bias, with the per-batch noise averaged out).

    Returns (cells, bins): cells hold objective, lag, n (signal batches), the means above; bins hold objective,
    ess_lo, ess_hi, n, ess, cos, norm_ratio (signal batches).
    """
    idx: dict[tuple[str, int], list[int]] = {}
    for i, (o, lag) in enumerate(zip(cols["objective"], cols["lag"])):
        idx.setdefault((o, lag), []).append(i)
    cells = []
    for (o, lag), ii in idx.items():
        sig = [i for i in ii if cols["signal"][i] > 0]
        cell: dict[str, Any] = {"objective": o, "lag": lag, "n": len(sig)}
        for key in ("ess", "cos", "norm_ratio", "cos_exact", "gain"):
            cell[key] = nanmean([cols[key][i] for i in sig])
        cell["zero_frac"] = nanmean([cols["zero"][i] for i in sig])
        cell["no_signal_frac"] = 1 - len(sig) / len(ii)
        if mean_dirs is not None:
            cell["cos_of_mean"] = nanmean([c for c, _ in mean_dirs.get((o, lag), [])])
            cell["norm_of_mean"] = nanmean([r for _, r in mean_dirs.get((o, lag), [])])
        cells.append(cell)
    bins = []
    objectives = list(dict.fromkeys(cols["objective"]))
    for o in objectives:
        rows = [i for i, oo in enumerate(cols["objective"]) if oo == o and cols["signal"][i] > 0]
        for lo, hi in itertools.pairwise(ESS_BINS):
            ii = [i for i in rows if lo <= cols["ess"][i] < hi]
            if ii:
                bins.append(
                    {
                        "objective": o,
                        "ess_lo": lo,
                        "ess_hi": min(hi, 1.0),
                        "n": len(ii),
                        "ess": nanmean([cols["ess"][i] for i in ii]),
                        "cos": nanmean([cols["cos"][i] for i in ii]),
                        "norm_ratio": nanmean([cols["norm_ratio"][i] for i in ii]),
                    }
                )
    return cells, bins


def markdown_table(result: dict[str, Any], key: str = "cos") -> str:
    """A markdown table of cell means: one row per objective, one column per lag (header: L and mean ESS)."""
    cells = result["cells"]
    lags = sorted({c["lag"] for c in cells})
    objectives = list(dict.fromkeys(c["objective"] for c in cells))
    by = {(c["objective"], c["lag"]): c for c in cells}
    ess = {lag: nanmean([by[(o, lag)]["ess"] for o in objectives if (o, lag) in by]) for lag in lags}
    head = "| objective | " + " | ".join(f"L={lag} (ESS {ess[lag]:.3f})" for lag in lags) + " |"
    sep = "|---|" + "---:|" * len(lags)
    rows = [head, sep]
    for o in objectives:
        vals = [by[(o, lag)][key] if (o, lag) in by else math.nan for lag in lags]
        rows.append(f"| `{o}` | " + " | ".join(f"{v:.3f}" for v in vals) + " |")
    return "\n".join(rows)


def reversal_table(result: dict[str, Any]) -> str:
    """Where each objective's gradient reverses: the smallest lag L at which the cosine of the mean direction with
    g_ref (the estimator's bias, per-batch noise averaged out) turns negative, the smallest at which the mean
    per-batch cosine does, and the cosine of the mean at the largest lag probed."""
    cells = result["cells"]
    lags = sorted({c["lag"] for c in cells})
    by = {(c["objective"], c["lag"]): c for c in cells}
    ess = {lag: nanmean([c["ess"] for c in cells if c["lag"] == lag]) for lag in lags}

    def first(o: str, key: str) -> str:
        lag = next((lag for lag in lags if (o, lag) in by and by[(o, lag)].get(key, math.nan) < 0), None)
        return f"L={lag} (ESS {ess[lag]:.3f})" if lag is not None else f"none up to L={lags[-1]}"

    rows = [
        f"| objective | mean direction reverses at | mean per-batch cosine < 0 at | cos of the mean at L={lags[-1]} |",
        "|---|---|---|---:|",
    ]
    for o in dict.fromkeys(c["objective"] for c in cells):
        last = by.get((o, lags[-1]), {}).get("cos_of_mean", math.nan)
        rows.append(f"| `{o}` | {first(o, 'cos_of_mean')} | {first(o, 'cos')} | {last:.3f} |")
    return "\n".join(rows)


def kl_table(result: dict[str, Any]) -> str:
    """The synthetic probe's exact divergences per lag (means over trajectories and probe points; per token, over the
    contexts π_b visits): KL(π_θ‖π_b), KL(π_b‖π_θ), χ²(π_b‖π_θ), and the expectation on π_b's samples of each P3O KL
    estimator — k3 (the paper's) is χ² − KL(π_b‖π_θ), not KL(π_θ‖π_b); k3_is is KL(π_θ‖π_b) exactly."""
    kl = result.get("kl") or {}
    lags = sorted(set(kl.get("lag", [])))
    rows = [
        "| lag L | KL(π_θ‖π_b) | KL(π_b‖π_θ) | χ²(π_b‖π_θ) | E_b[k3] | E_b[k3_is] | E_b[k2] | E_b[k3] / KL(π_θ‖π_b) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for lag in lags:
        ii = [i for i, x in enumerate(kl["lag"]) if x == lag]
        m = {k: nanmean([kl[k][i] for i in ii]) for k in ("kl", "kl_rev", "chi2", "e_k3", "e_k3_is", "e_k2")}
        ratio = m["e_k3"] / m["kl"] if m["kl"] > 0 else math.nan
        rows.append(
            f"| {lag} | {m['kl']:.3g} | {m['kl_rev']:.3g} | {m['chi2']:.3g} | {m['e_k3']:.3g} | {m['e_k3_is']:.3g} | "
            f"{m['e_k2']:.3g} | {ratio:.3f} |"
        )
    return "\n".join(rows)


def plot_probe(result: dict[str, Any], path: str | Path) -> None:
    """2×2 PNG: mean per-batch cosine vs L, norm ratio vs L, cosine vs batch ESS (binned), ΔJ/ΔJ_ref vs L."""
    import matplotlib  # heavy start-up: only when drawing

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # heavy start-up: only when drawing

    cells, bins = result["cells"], result["ess_bins"]
    objectives = list(dict.fromkeys(c["objective"] for c in cells))
    lags = sorted({c["lag"] for c in cells})
    xs = {lag: i for i, lag in enumerate(lags)}
    gain_ref = nanmean(result["points"]["gain_ref"])
    rows = -(-len(objectives) // 6)  # legend rows below the panels
    fig, axes = plt.subplots(2, 2, figsize=(12, 8.5 + 0.25 * rows))
    (a, b), (c, d) = axes
    cmap = plt.get_cmap("tab10" if len(objectives) <= 10 else "tab20")
    for n, o in enumerate(objectives):
        cc = sorted((x for x in cells if x["objective"] == o), key=lambda x: x["lag"])
        colour = cmap(n % cmap.N)
        style = {"color": colour, "marker": "os^D"[n // cmap.N % 4], "ms": 4, "label": _short(o)}
        a.plot([xs[x["lag"]] for x in cc], [x["cos"] for x in cc], **style)
        a.plot([xs[x["lag"]] for x in cc], [x["cos_of_mean"] for x in cc], color=colour, ls=":", lw=1)
        b.plot([xs[x["lag"]] for x in cc], [x["norm_ratio"] for x in cc], **style)
        if math.isfinite(gain_ref):
            d.plot([xs[x["lag"]] for x in cc], [x["gain"] / gain_ref for x in cc], **style)
        else:
            d.plot([xs[x["lag"]] for x in cc], [x["norm_of_mean"] for x in cc], **style)
        bb = [x for x in bins if x["objective"] == o]
        c.plot([max(1 - x["ess"], 1e-4) for x in bb], [x["cos"] for x in bb], **style)
    ess_by_lag = {lag: nanmean([x["ess"] for x in cells if x["lag"] == lag]) for lag in lags}
    for ax in (a, b, d):
        ax.set_xticks(range(len(lags)))
        ax.set_xticklabels([f"{lag}\n{ess_by_lag[lag]:.2f}" for lag in lags], fontsize=8)
        ax.set_xlabel("lag L  /  mean batch ESS")
        ax.grid(alpha=0.3)
    a.set_ylabel("cos(d, g_ref)")
    a.set_title("per-batch cosine (solid) and cosine of the mean direction (dotted)")
    b.set_ylabel("‖d‖ / ‖g_ref‖")
    b.set_yscale("log")
    b.set_title("norm ratio")
    c.set_xscale("log")
    c.set_xlabel("1 − batch ESS (binned; 1e-4 = on-policy)")
    c.set_ylabel("cos(d, g_ref)")
    c.set_title("per-batch cosine against the batch's ESS")
    c.grid(alpha=0.3)
    if math.isfinite(gain_ref):
        d.set_ylabel("ΔJ / ΔJ(g_ref)")
        d.set_title(f"one fixed step (η = {result['config']['step_size']}): gain relative to g_ref's")
    else:
        d.set_ylabel("‖mean_b d_b‖ / ‖g_ref‖")
        d.set_title("norm of the mean direction (no exact J for this instrument)")
    d.axhline(0, color="k", lw=0.5)
    handles, labels = a.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=6, fontsize=8)
    fig.suptitle(
        f"Gradient probe — {result['instrument']}; {len(result['rows']['cos'])} batch×objective gradients",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0.02 * rows + 0.01, 1, 1))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _short(spec: str) -> str:
    return re.sub(r"clip_eps_(low|high)=", "", spec)


def update_doc(path: str | Path, result: dict[str, Any], command: str, block: str = "probe") -> None:
    """Replace the text between ``<!-- {block}:begin -->`` and ``<!-- {block}:end -->`` in ``path`` (appended when
    missing) with the probe's tables (cosine, cosine of the mean, norm ratio, ΔJ) and the command that made them."""
    pts = result["points"]
    conf = result["config"]
    lm = "run_dir" in conf
    if lm:
        where = (
            f"reward at the probe points {min(pts['J']):.2f}–{max(pts['J']):.2f}; the run's engine: precision "
            f"{conf['precision']}, temperature {conf['temperature']} ({conf['logprob_mode']} log-probs)"
        )
    else:
        where = (
            f"cos(g_ref, ∇J) {nanmean(pts['ref_exact_cos']):.3f}; J at the probe points "
            f"{min(pts['J']):.2f}–{max(pts['J']):.2f}; engine noise σ = {conf['noise']}, temperature "
            f"{conf['temperature']} ({conf['logprob_mode']} log-probs)"
        )
    gain_block = []
    if not lm:
        gain_block = [
            f"**One-step gain** ΔJ of a step of length η = {conf['step_size']} "
            f"(g_ref's own: {nanmean(pts['gain_ref']):.4f}, exact ∇J's: {nanmean(pts['gain_exact']):.4f}):",
            "",
            markdown_table(result, "gain"),
            "",
        ]
    body = [
        f"Generated by `{command}` in {result['wall_s']:.0f} s on the {result['instrument']} "
        f"({len(result['rows']['cos'])} batch × objective gradients; reference precision: mean cos between the two "
        f"halves of g_ref {nanmean(pts['ref_half_cos']):.3f}; {where}). "
        f"Per-batch means are over the batches with reward spread (share without: "
        f"{nanmean([c['no_signal_frac'] for c in result['cells']]):.2f}).",
        "",
        "**Mean per-batch cosine** cos(d, g_ref):",
        "",
        markdown_table(result, "cos"),
        "",
        "**Cosine of the mean direction** (bias only: the batches' mean gradient against g_ref):",
        "",
        markdown_table(result, "cos_of_mean"),
        "",
        "**Norm ratio** ‖d‖/‖g_ref‖:",
        "",
        markdown_table(result, "norm_ratio"),
        "",
        *gain_block,
        "**Fraction of zero gradients** among the signal batches (every token clipped or masked):",
        "",
        markdown_table(result, "zero_frac"),
        "",
        "**Where the gradient reverses** (P3O's rows: each `kl_estimator`; `p3o` is k3, the paper's):",
        "",
        reversal_table(result),
    ]
    if result.get("kl"):
        body += [
            "",
            "**Exact per-context KL** at the probe points (per token, over the contexts π_b visits; π_b = the "
            "parameters L updates back, engine noise aside). P3O's KL term is k3 on π_b's tokens: its expectation "
            "is χ²(π_b‖π_θ) − KL(π_b‖π_θ), not KL(π_θ‖π_b):",
            "",
            kl_table(result),
        ]
    write_block(path, block, "\n".join(body))
