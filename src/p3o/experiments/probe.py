"""Gradient probe: how well does each off-policy estimator point where the on-policy gradient points?

For a saved trajectory θ_0, θ_1, …, θ_U (one entry per optimizer update) take a probe point k and a lag L, draw
batches from the rollout engine at θ_{k−L}, and compute every objective's gradient at θ_k — the gradient of the
FIRST optimizer update on that batch (π_prox = π_θold = π_θk) — as an ascent direction d = −∇_θ loss. Compare it
with a high-sample ON-POLICY gradient at θ_k,

    g_ref = E_{groups ∼ π_θk}[ (1/(N·T)) Σ_i A_i Σ_t ∇_θ log π_θk(y_it) ]    (group-relative A, many fresh groups)

which every objective reduces to on-policy (ratios ≡ 1; equal response lengths make all aggregations agree):

    cos(d, g_ref),   ‖d‖ / ‖g_ref‖,   ΔJ = J(θ_k + η·d/‖d‖) − J(θ_k)   (one step of fixed length η)

plotted against the batch's ESS (Kong's ESS of π_θk/π_b over its tokens) and L. The "cosine of the mean"
(the mean of a cell's batch gradients against g_ref) isolates the estimator's bias from its per-batch noise.

Instrument: the synthetic tabular autoregressive toy of :mod:`p3o.experiments.synthetic` (exact J and exact ∇J by
dynamic programming; g_ref from thousands of fresh groups). The cosine with the exact ∇J is reported too (the
group-normalised policy gradient is not exactly ∇J: the per-group std scales each prompt).

Usage::

    p3o probe --out runs/probe/probe.json --plot docs/figures/probe-synthetic.png --update-doc docs/probe.md
    python -c "from p3o.experiments.probe import ProbeConfig, probe_synthetic; r = probe_synthetic(ProbeConfig())"
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from p3o.advantages import group_advantages
from p3o.errors import ConfigError
from p3o.experiments.report import write_block
from p3o.experiments.synthetic import (
    SyntheticConfig,
    Task,
    batch_diagnostics,
    context_divergences,
    engine_logits,
    expected_reward,
    objective_loss,
    parse_objective,
    run_synthetic,
    sample_batch,
    token_logp,
)
from p3o.objectives import effective_sample_size

#: Objectives probed by default (name[:key=value...] specs of :func:`p3o.experiments.synthetic.parse_objective`).
#: p3o_two_anchor is left out: at the first update of a batch π_prox = π_θ, so it coincides with p3o. ``p3o-pg``
#: (the preset ``p3o`` with ``kl_estimator=none``: P3O without its KL term) separates the two halves of its gradient;
#: ``p3o-k3_is`` and ``p3o-k2`` are P3O with the other KL estimators (beyond the paper; ``p3o`` is k3, the paper's).
#: Then the objectives of issue 21 at their reference defaults (``dro-0.1``: DRO needs a β) and GRPO ε = 0.2 with
#: three rollout corrections (IcePop, sequence TIS, Geo-RS): with a correction the ratio is anchored at π_θold, which
#: at the first update on a batch is π_θk, so the clip is idle and the correction's weight π_θk/π_b does the work.
DEFAULT_OBJECTIVES = (
    "p3o",
    "p3o-k3_is",
    "p3o-k2",
    "grpo",
    "dapo",
    "gspo:clip_eps_low=2e-3:clip_eps_high=2e-3",
    "cispo",
    "minpro",
    "m2po",
    "decoupled_ppo",
    "p3o-pg",
    "gmpo",
    "sapo",
    "dppo",
    "topr",
    "dro-0.1",
    "gpg",
    "kl_cov",
    "clip_cov",
    "grpo-tm-icepop",
    "grpo-tm-seq-tis",
    "grpo-tm-geo-rs",
)
DEFAULT_LAGS = (0, 1, 2, 4, 8, 16, 32, 64, 96)
#: Columns of the per-batch table and of the per-probe-point table (synthetic and LM probes write the same ones).
_BATCH_COLUMNS = (
    "traj",
    "point",
    "lag",
    "batch",
    "objective",
    "ess",
    "signal",
    "cos",
    "norm_ratio",
    "cos_exact",
    "gain",
    "zero",
)
_POINT_COLUMNS = ("traj", "k", "J", "ref_half_cos", "ref_exact_cos", "gain_ref", "gain_exact")
#: Exact divergences per (traj, point, lag) of the synthetic probe (:func:`synthetic.context_divergences`).
_KL_COLUMNS = ("traj", "point", "lag", "kl", "kl_rev", "chi2", "e_k3", "e_k3_is", "e_k2")


def _columns(names: tuple[str, ...]) -> dict[str, list]:
    """An empty column store: one list per name."""
    return {k: [] for k in names}


def _spec(spec: str) -> tuple[str, str, dict[str, Any]]:
    """(spec, objective name, hyper-parameters) of a spec (:func:`p3o.experiments.synthetic.parse_objective`)."""
    return (spec, *parse_objective(spec))


ESS_BINS = (0.0, 0.5, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99, 0.995, 0.999, 0.99999, 1.0001)


def _default_trajectory() -> SyntheticConfig:
    return SyntheticConfig(objective="p3o", seeds=4, steps=192, lr=0.03, threshold=5, per_seed_curves=False)


@dataclass
class ProbeConfig:
    """Settings of a synthetic probe run.

    ``trajectory``: the SyntheticConfig whose run provides θ_0..θ_U (its ``seeds`` trajectories are probed
    independently; ``save_params`` is forced on). ``points`` probe points per trajectory, evenly spaced in
    [max(lags), U]; ``batches`` B engine batches per (trajectory, point, lag); ``ref_groups`` R groups per prompt for
    g_ref; ``step_size`` η of the fixed-length step; engine knobs ``noise`` σ, ``temperature``, ``logprob_mode``
    for the probe batches (the trajectory's own regime is separate).
    """

    objectives: tuple[str, ...] = DEFAULT_OBJECTIVES
    lags: tuple[int, ...] = DEFAULT_LAGS
    points: int = 4
    batches: int = 64
    ref_groups: int = 2048
    step_size: float = 0.5
    noise: float = 0.0
    temperature: float = 1.0
    logprob_mode: str = "raw"
    seed: int = 0
    trajectory: SyntheticConfig = field(default_factory=_default_trajectory)


def _cos(a: Tensor, b: Tensor) -> Tensor:
    """Row-wise cosine of a (B, D) with b (D,) (or (B, D)); NaN where a row is exactly zero."""
    na = a.norm(dim=-1)
    nb = b.norm(dim=-1)
    c = (a * b).sum(-1) / (na * nb).clamp(min=1e-30)
    return torch.where(na > 0, c, torch.full_like(c, math.nan))


def _gen(*key: int) -> torch.Generator:
    h = 0
    for k in key:
        h = (h * 1_000_003 + int(k) + 1) % (2**62)
    return torch.Generator().manual_seed(h)


def reference_gradient(theta: Tensor, task: Task, group: int, groups: int, gen: torch.Generator) -> dict[str, Tensor]:
    """High-sample on-policy group policy gradient at θ (ascent direction) and its own precision.

        g_ref = (1/R) Σ_r (1/(N·T)) Σ_{i,t} A_{r,i} ∇ log π_θ(y_{r,i,t})      (R fresh batches of N = P·G)

    computed as two halves (g_1, g_2 over R/2 batches each); returns ``g`` = (g_1 + g_2)/2 (D,), ``half_cos`` =
    cos(g_1, g_2) (how precise g_ref is), ``exact`` = ∇J(θ) (D,) by differentiating the dynamic programme, and
    ``J`` = J(θ).

    Args:
        theta: (P, T, V+1, V) one policy table; task: its targets with a leading seed axis of size 1.
    """
    halves = []
    for _ in range(2):
        r = max(1, groups // 2)
        th = theta.detach().clone().requires_grad_(True)
        rep = th.expand(r, *th.shape)
        u = torch.rand((r, th.shape[0], group, th.shape[1]), generator=gen)
        with torch.no_grad():
            batch = sample_batch(rep, rep, _expand_task(task, r), group, u)
        adv, _ = group_advantages(batch.rewards.reshape(-1), batch.group_ids.reshape(-1))
        logp = token_logp(torch.log_softmax(rep, -1), batch)  # (R, N, T)
        loss = -(adv.reshape(logp.shape[:2])[..., None] * logp).mean()
        (g,) = torch.autograd.grad(loss, th)
        halves.append(-g.flatten())
    th = theta.detach().clone().requires_grad_(True)
    j = expected_reward(th[None], task)
    (gj,) = torch.autograd.grad(j.sum(), th)
    return {
        "g": (halves[0] + halves[1]) / 2,
        "half_cos": _cos(halves[0][None], halves[1])[0],
        "exact": gj.flatten(),
        "J": j.detach()[0],
    }


def _expand_task(task: Task, n: int) -> Task:
    return Task(task.targets.expand(n, *task.targets.shape[1:]), task.reward, task.threshold)


def _step_gain(theta: Tensor, dirs: Tensor, task: Task, eta: float, j0: Tensor) -> Tensor:
    """ΔJ of one step of length η along each row of ``dirs`` (B, D) from θ (P, T, V+1, V); NaN for zero rows."""
    b = dirs.shape[0]
    norm = dirs.norm(dim=-1, keepdim=True)
    unit = torch.where(norm > 0, dirs / norm.clamp(min=1e-30), torch.zeros_like(dirs))
    with torch.no_grad():
        new = theta[None] + eta * unit.reshape(b, *theta.shape)
        gain = expected_reward(new, _expand_task(task, b)) - j0
    return torch.where(norm[:, 0] > 0, gain, torch.full_like(gain, math.nan))


def probe_synthetic(cfg: ProbeConfig, *, log: Any = None) -> dict[str, Any]:
    """Run the gradient probe on the synthetic instrument.

    Returns a JSON-ready dict: ``config``; ``rows`` — columns (lists of equal length, one entry per batch ×
    objective): traj, point, lag, batch, objective, ess, cos, norm_ratio, cos_exact, gain (ΔJ), zero (1 when the
    gradient is exactly 0, e.g. no reward spread); ``points`` — per (traj, point): k, J, ref_half_cos,
    ref_exact_cos, gain_ref, gain_exact; ``cells`` — per (objective, lag): mean ess, cos (nan-mean), norm_ratio,
    cos_of_mean, cos_exact, gain, zero_frac, n; ``ess_bins`` — per (objective, ESS bin): mean cos, norm_ratio, n;
    ``wall_s``.
    """
    t0 = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _probe(cfg, t0, log)
    finally:
        torch.set_num_threads(threads)


def _probe(cfg: ProbeConfig, t0: float, log: Any) -> dict[str, Any]:
    lags = sorted(set(cfg.lags))
    tcfg = dataclasses.replace(cfg.trajectory, save_params=True, per_seed_curves=False)
    traj = run_synthetic(tcfg)
    params: list[Tensor] = traj["params"]
    task_all: Task = traj["task"]
    n_updates = len(params) - 1
    lo = max(lags)
    if n_updates < lo:
        raise ConfigError(f"probe: trajectory has {n_updates} updates, fewer than the largest lag {lo}")
    ks = sorted({round(lo + (n_updates - lo) * i / max(1, cfg.points - 1)) for i in range(cfg.points)})
    specs = [_spec(spec) for spec in cfg.objectives]
    ecfg = dataclasses.replace(tcfg, noise=cfg.noise, temperature=cfg.temperature, logprob_mode=cfg.logprob_mode)
    g_n, b_n = tcfg.group, cfg.batches
    cols = _columns(_BATCH_COLUMNS)
    points = _columns(_POINT_COLUMNS)
    kl_rows = _columns(_KL_COLUMNS)
    mean_dirs: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for j in range(tcfg.seeds):
        task_j = Task(task_all.targets[j : j + 1], task_all.reward, task_all.threshold)
        for k in ks:
            theta_k = params[k][j]
            ref = reference_gradient(theta_k, task_j, g_n, cfg.ref_groups, _gen(cfg.seed, j, k, -1))
            g_ref, j0 = ref["g"], ref["J"]
            gains = _step_gain(theta_k, torch.stack([g_ref, ref["exact"]]), task_j, cfg.step_size, j0)
            for key, val in (
                ("traj", j),
                ("k", k),
                ("J", float(j0)),
                ("ref_half_cos", float(ref["half_cos"])),
                ("ref_exact_cos", float(_cos(g_ref[None], ref["exact"])[0])),
                ("gain_ref", float(gains[0])),
                ("gain_exact", float(gains[1])),
            ):
                points[key].append(val)
            for lag in lags:
                gen = _gen(cfg.seed, j, k, lag)
                theta_b = params[k - lag][j].expand(b_n, *theta_k.shape)
                eps = torch.randn((b_n, *theta_k.shape), generator=gen)
                u = torch.rand((b_n, theta_k.shape[0], g_n, theta_k.shape[1]), generator=gen)
                samp, rec = engine_logits(theta_b, ecfg, eps)
                exact = context_divergences(theta_k, params[k - lag][j])
                for key, val in (("traj", j), ("point", k), ("lag", lag), *((n, float(x)) for n, x in exact.items())):
                    kl_rows[key].append(val)
                task_b = _expand_task(task_j, b_n)
                batch = sample_batch(samp, rec, task_b, g_n, u)
                adv, _ = group_advantages(batch.rewards.reshape(-1), batch.group_ids.reshape(-1))
                adv = adv.reshape(b_n, -1)
                signal = (adv != 0).any(-1).float()  # batches with reward spread in at least one group
                with torch.no_grad():
                    logp_k = token_logp(torch.log_softmax(theta_k, -1).expand(b_n, *theta_k.shape), batch)
                ess = batch_diagnostics(logp_k - batch.rollout_logp)["ess"]
                for spec, name, hyper in specs:
                    rep = theta_k.detach().expand(b_n, *theta_k.shape).clone().requires_grad_(True)
                    logp = token_logp(torch.log_softmax(rep, -1), batch)
                    loss, _ = objective_loss(
                        name, hyper, logp, batch.rollout_logp, adv, prox_logp=logp_k, old_logp=logp_k
                    )
                    (grad,) = torch.autograd.grad(loss, rep)
                    d = -grad.reshape(b_n, -1)
                    cos = _cos(d, g_ref)
                    ratio = d.norm(dim=-1) / g_ref.norm().clamp(min=1e-30)
                    gain = _step_gain(theta_k, d, task_j, cfg.step_size, j0)
                    dm = d.mean(0)
                    mean_dirs.setdefault((spec, lag), []).append(
                        (float(_cos(dm[None], g_ref)[0]), float(dm.norm() / g_ref.norm().clamp(min=1e-30)))
                    )
                    zero = (d.norm(dim=-1) == 0).float()
                    for key, vals in (
                        ("ess", ess),
                        ("signal", signal),
                        ("cos", cos),
                        ("norm_ratio", ratio),
                        ("gain", gain),
                        ("cos_exact", _cos(d, ref["exact"])),
                        ("zero", zero),
                    ):
                        cols[key].extend(round(float(x), 6) for x in vals)
                    cols["traj"].extend([j] * b_n)
                    cols["point"].extend([k] * b_n)
                    cols["lag"].extend([lag] * b_n)
                    cols["batch"].extend(range(b_n))
                    cols["objective"].extend([spec] * b_n)
            if log is not None:
                log(
                    f"traj {j} point k={k}: J {float(j0):.3f}, g_ref half-cos {float(ref['half_cos']):.3f} "
                    f"[{time.perf_counter() - t0:.0f}s]"
                )
    cells, bins = summarise(cols, mean_dirs)
    return {
        "instrument": "synthetic tabular autoregressive toy (not a language model)",
        "config": {**dataclasses.asdict(cfg), "trajectory": dataclasses.asdict(tcfg)},
        "trajectory_reward": traj["curves"]["reward"],
        "rows": cols,
        "points": points,
        "cells": cells,
        "ess_bins": bins,
        "kl": kl_rows,
        "wall_s": time.perf_counter() - t0,
    }


def _nanmean(xs: list[float]) -> float:
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
            cell[key] = _nanmean([cols[key][i] for i in sig])
        cell["zero_frac"] = _nanmean([cols["zero"][i] for i in sig])
        cell["no_signal_frac"] = 1 - len(sig) / len(ii)
        if mean_dirs is not None:
            cell["cos_of_mean"] = _nanmean([c for c, _ in mean_dirs.get((o, lag), [])])
            cell["norm_of_mean"] = _nanmean([r for _, r in mean_dirs.get((o, lag), [])])
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
                        "ess": _nanmean([cols["ess"][i] for i in ii]),
                        "cos": _nanmean([cols["cos"][i] for i in ii]),
                        "norm_ratio": _nanmean([cols["norm_ratio"][i] for i in ii]),
                    }
                )
    return cells, bins


def markdown_table(result: dict[str, Any], key: str = "cos") -> str:
    """A markdown table of cell means: one row per objective, one column per lag (header: L and mean ESS)."""
    cells = result["cells"]
    lags = sorted({c["lag"] for c in cells})
    objectives = list(dict.fromkeys(c["objective"] for c in cells))
    by = {(c["objective"], c["lag"]): c for c in cells}
    ess = {lag: _nanmean([by[(o, lag)]["ess"] for o in objectives if (o, lag) in by]) for lag in lags}
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
    ess = {lag: _nanmean([c["ess"] for c in cells if c["lag"] == lag]) for lag in lags}

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
        m = {k: _nanmean([kl[k][i] for i in ii]) for k in ("kl", "kl_rev", "chi2", "e_k3", "e_k3_is", "e_k2")}
        ratio = m["e_k3"] / m["kl"] if m["kl"] > 0 else math.nan
        rows.append(
            f"| {lag} | {m['kl']:.3g} | {m['kl_rev']:.3g} | {m['chi2']:.3g} | {m['e_k3']:.3g} | {m['e_k3_is']:.3g} | "
            f"{m['e_k2']:.3g} | {ratio:.3f} |"
        )
    return "\n".join(rows)


def plot_probe(result: dict[str, Any], path: str | Path) -> None:
    """2×2 PNG: mean per-batch cosine vs L, norm ratio vs L, cosine vs batch ESS (binned), ΔJ/ΔJ_ref vs L."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells, bins = result["cells"], result["ess_bins"]
    objectives = list(dict.fromkeys(c["objective"] for c in cells))
    lags = sorted({c["lag"] for c in cells})
    xs = {lag: i for i, lag in enumerate(lags)}
    gain_ref = _nanmean(result["points"]["gain_ref"])
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
    ess_by_lag = {lag: _nanmean([x["ess"] for x in cells if x["lag"] == lag]) for lag in lags}
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
            f"cos(g_ref, ∇J) {_nanmean(pts['ref_exact_cos']):.3f}; J at the probe points "
            f"{min(pts['J']):.2f}–{max(pts['J']):.2f}; engine noise σ = {conf['noise']}, temperature "
            f"{conf['temperature']} ({conf['logprob_mode']} log-probs)"
        )
    gain_block = []
    if not lm:
        gain_block = [
            f"**One-step gain** ΔJ of a step of length η = {conf['step_size']} "
            f"(g_ref's own: {_nanmean(pts['gain_ref']):.4f}, exact ∇J's: {_nanmean(pts['gain_exact']):.4f}):",
            "",
            markdown_table(result, "gain"),
            "",
        ]
    body = [
        f"Generated by `{command}` in {result['wall_s']:.0f} s on the {result['instrument']} "
        f"({len(result['rows']['cos'])} batch × objective gradients; reference precision: mean cos between the two "
        f"halves of g_ref {_nanmean(pts['ref_half_cos']):.3f}; {where}). "
        f"Per-batch means are over the batches with reward spread (share without: "
        f"{_nanmean([c['no_signal_frac'] for c in result['cells']]):.2f}).",
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


# ----------------------------------------------------------------------------------------------- language model


def probe_lm(
    run_dir: str | Path,
    *,
    objectives: tuple[str, ...] = DEFAULT_OBJECTIVES,
    lags: tuple[int, ...] = (0, 1, 2, 4),
    points: int = 2,
    batches: int = 8,
    ref_batches: int = 16,
    seed: int = 0,
    log: Any = None,
    components: Any = None,
) -> dict[str, Any]:
    """The probe on a real training run of the project's language model, from checkpoints written every step.

    ``run_dir`` holds ``config.yaml`` and ``checkpoints/step_XXXXXX`` of ``p3o train --ckpt.every 1
    --ckpt.keep_last 1000`` (θ_s = the policy after s global steps; θ_0 = the base model the config names). For each
    probe point k (``points`` of them, evenly spaced over the steps ≥ max(lags)) and lag L (in GLOBAL steps — one
    optimizer update each when the run used one mini-batch): ``batches`` batches of the run's shape (prompts_per_step
    random training prompts × group_size) are generated by the run's own rollout engine (its precision, temperature
    and log-prob mode) holding θ_{k−L}; every objective's gradient over all trainable parameters is taken at θ_k
    (the first update on the batch: π_prox = π_θold = π_θk, trainer temperature of the run) and compared with
    g_ref: the mean over ``ref_batches`` fresh on-policy batches (fp32 engine at θ_k, T = 1) of the group policy
    gradient, aggregated as the objective aggregates (``token-mean`` or ``seq-mean-token-mean``; responses have
    different lengths here). ΔJ is not computed (no exact J for the LM: ``gain`` is NaN). ``components`` replaces
    ``build_components(config)`` (tests pass fakes; its policy must hold θ_0).

    Returns the same structure as :func:`probe_synthetic` (``instrument`` names the model). Runs on one CPU thread
    (the model is tiny; contended intra-op threads are many times slower on a shared machine).
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _probe_lm(Path(run_dir), objectives, tuple(lags), points, batches, ref_batches, seed, log, components)
    finally:
        torch.set_num_threads(threads)


def _probe_lm(
    run_dir: Path,
    objectives: tuple[str, ...],
    lags_in: tuple[int, ...],
    points: int,
    batches: int,
    ref_batches: int,
    seed: int,
    log: Any,
    components: Any,
) -> dict[str, Any]:
    import copy

    from p3o.config import load_config
    from p3o.logprobs import token_logprobs
    from p3o.objectives import ObjectiveInputs, get_objective, objective_defaults, reduce_tokens
    from p3o.rollout.factory import make_engine
    from p3o.train.checkpoint import checkpoint_step, list_checkpoints, load_policy_weights
    from p3o.train.stream import PromptStream, make_producer, stream_seed
    from p3o.train.wiring import build_components

    t0 = time.perf_counter()
    cfg = load_config(["--config", str(run_dir / "config.yaml")])
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, device="cpu"))
    comps = build_components(cfg) if components is None else components
    policy = comps.policy
    base_state = {k: v.detach().clone() for k, v in policy.state_dict().items()}
    ckpts: dict[int, Path] = {}
    for p in list_checkpoints(run_dir):
        step = checkpoint_step(p)
        if step is not None:
            ckpts[step] = p / "policy"
    avail = {0, *ckpts}
    lags = sorted(set(lags_in))
    cands = [k for k in sorted(ckpts) if all(k - lag in avail for lag in lags)]
    if not cands:
        raise ConfigError(f"probe: {run_dir} has no checkpoint k with every k − L available (L in {lags})")
    ks = sorted({cands[round((len(cands) - 1) * i / max(1, points - 1))] for i in range(points)})

    def set_weights(model: torch.nn.Module, step: int) -> None:
        if step == 0:
            model.load_state_dict(base_state)
        else:
            load_policy_weights(model, ckpts[step])

    specs = [_spec(spec) for spec in objectives]
    aggs = {spec: {**objective_defaults(name), **hyper}.get("agg", "token-mean") for spec, name, hyper in specs}
    aggs = {k: v if v in ("token-mean", "seq-mean-token-mean") else "token-mean" for k, v in aggs.items()}
    params = [p for p in policy.parameters() if p.requires_grad]
    ro = cfg.rollout
    # The run's own batches (its prompts per step, group size, rewards, advantage settings): the trainer's producer
    # over a prompt stream of this probe's seed; batch index = a hash of (point, lag, batch), lag −1 for g_ref.
    produce = make_producer(
        ro, cfg.loop, cfg.advantage, seed, comps, PromptStream(len(comps.prompts), ro.prompts_per_step, seed)
    )

    def draw(engine: Any, key: tuple[int, ...]) -> Any:
        batch, _ = produce(stream_seed(*key) % 2**40, engine)
        return batch

    def logps(r: Any, temperature: float) -> Tensor:
        lp, _ = token_logprobs(
            policy,
            r.prompt_ids,
            r.prompt_mask,
            r.response_ids,
            r.mask,
            temperature=temperature,
            chunk_size=cfg.train.chunk_size,
        )
        return lp

    def flat(grads: tuple[Tensor | None, ...]) -> Tensor:
        return torch.cat([(torch.zeros_like(p) if g is None else g).reshape(-1) for p, g in zip(params, grads)])

    cols = _columns(_BATCH_COLUMNS)
    points_out = _columns(_POINT_COLUMNS)
    mean_dirs: dict[tuple[str, int], list[tuple[float, float]]] = {}
    behaviour = copy.deepcopy(policy)
    for k in ks:
        set_weights(policy, k)
        ref_engine = make_engine(
            "hf",
            policy,
            comps.tokenizer,
            precision="fp32",
            temperature=1.0,
            max_new_tokens=ro.max_new_tokens,
            logprob_mode="processed",
            seed=seed,
        )
        sums = {a: [torch.zeros(sum(p.numel() for p in params)) for _ in range(2)] for a in set(aggs.values())}
        rewards = []
        for i in range(ref_batches):
            r = draw(ref_engine, (k, -1, i))
            rewards.append(float(r.rewards.mean()))
            lp = logps(r, 1.0)
            per_token = -(r.advantages[:, None] * lp)
            for a in sums:
                loss = reduce_tokens(per_token, r.mask, a)
                sums[a][i % 2] += -flat(torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True))
        g_refs = {a: (h[0] + h[1]) / ref_batches for a, h in sums.items()}
        half = _nanmean([float(_cos(h[0][None], h[1])[0]) for h in sums.values()])
        for key, val in (
            ("traj", 0),
            ("k", k),
            ("J", sum(rewards) / len(rewards)),
            ("ref_half_cos", half),
            ("ref_exact_cos", math.nan),
            ("gain_ref", math.nan),
            ("gain_exact", math.nan),
        ):
            points_out[key].append(val)
        for lag in lags:
            set_weights(behaviour, k - lag)
            engine = comps.make_engine(behaviour)
            acc = {spec: [] for spec, _, _ in specs}
            for b in range(batches):
                r = draw(engine, (k, lag, b))
                lp = logps(r, cfg.train.temperature)
                lp_k = lp.detach()
                ess = float(effective_sample_size(lp_k - r.rollout_logp, r.mask))
                signal = float((r.advantages != 0).any())
                for spec, name, hyper in specs:
                    inputs = ObjectiveInputs(lp, r.rollout_logp, r.mask, r.advantages, prox_logp=lp_k, old_logp=lp_k)
                    loss, _ = get_objective(name)(inputs, **hyper)
                    d = -flat(torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True))
                    g_ref = g_refs[aggs[spec]]
                    acc[spec].append(d)
                    vals = {
                        "ess": ess,
                        "signal": signal,
                        "cos": float(_cos(d[None], g_ref)[0]),
                        "norm_ratio": float(d.norm() / g_ref.norm().clamp(min=1e-30)),
                        "cos_exact": math.nan,
                        "gain": math.nan,
                        "zero": float(d.norm() == 0),
                    }
                    for key, val in vals.items():
                        cols[key].append(round(val, 6) if val == val else val)
                    for key, val in (("traj", 0), ("point", k), ("lag", lag), ("batch", b), ("objective", spec)):
                        cols[key].append(val)
            for spec, _, _ in specs:
                dm = torch.stack(acc[spec]).mean(0)
                g_ref = g_refs[aggs[spec]]
                mean_dirs.setdefault((spec, lag), []).append(
                    (float(_cos(dm[None], g_ref)[0]), float(dm.norm() / g_ref.norm().clamp(min=1e-30)))
                )
            if log is not None:
                log(f"point k={k} lag {lag}: {batches} batches [{time.perf_counter() - t0:.0f}s]")
    cells, bins = summarise(cols, mean_dirs)
    return {
        "instrument": f"language model {cfg.model.name} on task {cfg.task.name} (run {run_dir})",
        "config": {
            "run_dir": str(run_dir),
            "objectives": list(objectives),
            "lags": lags,
            "points": points,
            "batches": batches,
            "ref_batches": ref_batches,
            "seed": seed,
            "step_size": math.nan,
            "precision": cfg.rollout.precision,
            "temperature": cfg.rollout.temperature,
            "logprob_mode": cfg.rollout.logprob_mode,
        },
        "rows": cols,
        "points": points_out,
        "cells": cells,
        "ess_bins": bins,
        "wall_s": time.perf_counter() - t0,
    }


# ----------------------------------------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    """Arguments of ``p3o probe``."""
    d, t = ProbeConfig(), _default_trajectory()
    p = argparse.ArgumentParser(
        prog="p3o probe",
        description="Gradient probe: cosine / norm ratio / one-step gain of each objective's gradient on stale "
        "batches against a high-sample on-policy gradient (synthetic tabular autoregressive toy).",
    )
    p.add_argument("--objectives", default=",".join(d.objectives), help="comma list of objective specs")
    p.add_argument(
        "--lags",
        default=None,
        help=f"comma list of lags L (default {','.join(map(str, d.lags))}; with --run-dir 0,1,2,4)",
    )
    p.add_argument("--points", type=int, default=d.points, help="probe points per trajectory")
    p.add_argument("--trajectories", type=int, default=t.seeds, help="independent trajectories (seeds)")
    p.add_argument("--batches", type=int, default=d.batches, help="batches per (trajectory, point, lag)")
    p.add_argument("--ref-groups", type=int, default=d.ref_groups, help="groups per prompt for g_ref")
    p.add_argument("--step-size", type=float, default=d.step_size, help="η of the fixed-length step")
    p.add_argument("--lr", type=float, default=t.lr, help="learning rate of the trajectory")
    p.add_argument("--steps", type=int, default=t.steps, help="steps of the trajectory")
    p.add_argument("--regime", default="on-policy", help="regime of the trajectory (synthetic regime spec)")
    p.add_argument("--trajectory-objective", default=t.objective, help="objective spec of the trajectory")
    p.add_argument("--noise", type=float, default=d.noise, help="engine logit noise of the probe batches")
    p.add_argument("--temperature", type=float, default=d.temperature, help="engine temperature of the batches")
    p.add_argument("--logprob-mode", default=d.logprob_mode, choices=["raw", "processed"])
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument(
        "--run-dir",
        type=Path,
        default=None,
        help="probe a language-model run instead (checkpoints of `p3o train --ckpt.every 1 --ckpt.keep_last 1000`)",
    )
    p.add_argument("--ref-batches", type=int, default=16, help="with --run-dir: on-policy batches for g_ref")
    p.add_argument("--out", type=Path, default=None, help="probe JSON (rows, points, cells, ess_bins)")
    p.add_argument("--plot", type=Path, default=None, help="PNG of the headline figure")
    p.add_argument("--update-doc", type=Path, default=None, help="markdown file whose probe block is regenerated")
    p.add_argument("--doc-block", default="probe", help="name of the block in --update-doc (<!-- NAME:begin -->)")
    return p


def main(argv: list[str] | None = None) -> int:
    """``p3o probe``: run the synthetic probe, print the cosine table, write --out / --plot / --update-doc."""
    from p3o.experiments.synthetic import parse_regime

    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    objectives = tuple(o for o in args.objectives.split(",") if o)
    if args.run_dir is not None:
        lags = tuple(int(x) for x in (args.lags or "0,1,2,4").split(",") if x)
        result = probe_lm(
            args.run_dir,
            objectives=objectives,
            lags=lags,
            points=args.points,
            batches=args.batches,
            ref_batches=args.ref_batches,
            seed=args.seed,
            log=lambda s: print(s, flush=True),
        )
        return _finish(args, argv, result)
    name, hyper = parse_objective(args.trajectory_objective)
    traj = dataclasses.replace(
        _default_trajectory(),
        objective=name,
        hyper=hyper,
        seeds=args.trajectories,
        lr=args.lr,
        steps=args.steps,
        **parse_regime(args.regime),
    )
    cfg = ProbeConfig(
        objectives=objectives,
        lags=tuple(int(x) for x in (args.lags or ",".join(map(str, DEFAULT_LAGS))).split(",") if x),
        points=args.points,
        batches=args.batches,
        ref_groups=args.ref_groups,
        step_size=args.step_size,
        noise=args.noise,
        temperature=args.temperature,
        logprob_mode=args.logprob_mode,
        seed=args.seed,
        trajectory=traj,
    )
    result = probe_synthetic(cfg, log=lambda s: print(s, flush=True))
    return _finish(args, argv, result)


def _finish(args: argparse.Namespace, argv: list[str], result: dict[str, Any]) -> int:
    """Print the cosine table; write --out, --plot, --update-doc."""
    print(markdown_table(result, "cos"))
    print(f"probe: {len(result['rows']['cos'])} gradients in {result['wall_s']:.0f}s")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result))
        print(f"wrote {args.out}")
    if args.plot:
        plot_probe(result, args.plot)
        print(f"wrote {args.plot}")
    if args.update_doc:
        update_doc(args.update_doc, result, "p3o probe " + " ".join(argv), args.doc_block)
        print(f"updated {args.update_doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
