"""The synthetic gradient probe: for a saved trajectory of the toy policy, every objective's first-update
gradient on batches L updates stale (or from a mismatched engine) against a high-sample on-policy gradient g_ref,
with the exact ∇J and the exact one-step gain beside it (see :mod:`p3o.experiments.probe`)."""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor

from p3o.advantages import group_advantages
from p3o.errors import ConfigError
from p3o.experiments.probe.tables import summarise
from p3o.experiments.synthetic.config import SyntheticConfig, parse_objective
from p3o.experiments.synthetic.env import Task, context_divergences, expected_reward
from p3o.experiments.synthetic.losses import batch_diagnostics, objective_loss
from p3o.experiments.synthetic.sampler import engine_logits, sample_batch, token_logp
from p3o.experiments.synthetic.train import run_synthetic
from p3o.options import config_field

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
BATCH_COLUMNS = (
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
POINT_COLUMNS = ("traj", "k", "J", "ref_half_cos", "ref_exact_cos", "gain_ref", "gain_exact")
#: Exact divergences per (traj, point, lag) of the synthetic probe (:func:`synthetic.context_divergences`).
KL_COLUMNS = ("traj", "point", "lag", "kl", "kl_rev", "chi2", "e_k3", "e_k3_is", "e_k2")


def columns(names: tuple[str, ...]) -> dict[str, list]:
    """An empty column store: one list per name."""
    return {k: [] for k in names}


def objective_spec(spec: str) -> tuple[str, str, dict[str, Any]]:
    """(spec, objective name, hyper-parameters) of a spec (:func:`p3o.experiments.synthetic.parse_objective`)."""
    return (spec, *parse_objective(spec))


def default_trajectory() -> SyntheticConfig:
    return SyntheticConfig(objective="p3o", seeds=4, steps=192, lr=0.03, threshold=5, per_seed_curves=False)


@dataclass
class ProbeKnobs:
    """The settings of a synthetic probe that ``p3o probe`` takes as options: each declared once, here, with its help
    text and bounds (:func:`p3o.options.config_field`); ``ProbeOptions`` inherits them."""

    points: int = config_field(4, "probe points per trajectory", ge=1)
    batches: int = config_field(64, "batches per (trajectory, point, lag)", ge=1)
    ref_groups: int = config_field(2048, "groups per prompt for g_ref", ge=1)
    step_size: float = config_field(0.5, "η of the fixed-length step", gt=0)
    noise: float = config_field(0.0, "engine logit noise of the probe batches", ge=0)
    temperature: float = config_field(1.0, "engine temperature of the batches", gt=0)
    logprob_mode: Literal["raw", "processed"] = config_field("raw", "log-probs of the probe batches")
    seed: int = config_field(0, "seed of the probe batches")


@dataclass
class ProbeConfig(ProbeKnobs):
    """Settings of a synthetic probe run.

    ``trajectory``: the SyntheticConfig whose run provides θ_0..θ_U (its ``seeds`` trajectories are probed
    independently; ``save_params`` is forced on). ``points`` probe points per trajectory, evenly spaced in
    [max(lags), U]; ``batches`` B engine batches per (trajectory, point, lag); ``ref_groups`` R groups per prompt for
    g_ref; ``step_size`` η of the fixed-length step; engine knobs ``noise`` σ, ``temperature``, ``logprob_mode``
    for the probe batches (the trajectory's own regime is separate).
    """

    objectives: tuple[str, ...] = config_field(DEFAULT_OBJECTIVES, "objective specs probed")
    lags: tuple[int, ...] = config_field(DEFAULT_LAGS, "lags L (optimizer updates) of the stale batches")
    trajectory: SyntheticConfig = field(
        default_factory=default_trajectory, metadata={"help": "the run whose parameters are probed"}
    )


def cosine(a: Tensor, b: Tensor) -> Tensor:
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
        "half_cos": cosine(halves[0][None], halves[1])[0],
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
    out = _Collect(columns(BATCH_COLUMNS), columns(POINT_COLUMNS), columns(KL_COLUMNS), {})
    ecfg = dataclasses.replace(tcfg, noise=cfg.noise, temperature=cfg.temperature, logprob_mode=cfg.logprob_mode)
    for j in range(tcfg.seeds):
        task_j = Task(task_all.targets[j : j + 1], task_all.reward, task_all.threshold)
        for k in ks:
            ref = _probe_point(cfg, params[k][j], task_j, j, k, tcfg.group, out)
            for lag in lags:
                _probe_lag(cfg, ecfg, params, task_j, ref, (j, k, lag), out)
            if log is not None:
                log(
                    f"traj {j} point k={k}: J {float(ref['J']):.3f}, g_ref half-cos {float(ref['half_cos']):.3f} "
                    f"[{time.perf_counter() - t0:.0f}s]"
                )
    cells, bins = summarise(out.rows, out.mean_dirs)
    return {
        "instrument": "synthetic tabular autoregressive toy (not a language model)",
        "config": {**dataclasses.asdict(cfg), "trajectory": dataclasses.asdict(tcfg)},
        "trajectory_reward": traj["curves"]["reward"],
        "rows": out.rows,
        "points": out.points,
        "cells": cells,
        "ess_bins": bins,
        "kl": out.kl,
        "wall_s": time.perf_counter() - t0,
    }


@dataclass
class _Collect:
    """What a probe accumulates: per-batch rows, per-point rows, exact divergences and each cell's mean directions."""

    rows: dict[str, list]
    points: dict[str, list]
    kl: dict[str, list]
    mean_dirs: dict[tuple[str, int], list[tuple[float, float]]]


def _probe_point(
    cfg: ProbeConfig, theta_k: Tensor, task_j: Task, j: int, k: int, group: int, out: _Collect
) -> dict[str, Tensor]:
    """g_ref at θ_k of trajectory j (:func:`reference_gradient`), with its row of the point table."""
    ref = reference_gradient(theta_k, task_j, group, cfg.ref_groups, _gen(cfg.seed, j, k, -1))
    g_ref, j0 = ref["g"], ref["J"]
    gains = _step_gain(theta_k, torch.stack([g_ref, ref["exact"]]), task_j, cfg.step_size, j0)
    for key, val in (
        ("traj", j),
        ("k", k),
        ("J", float(j0)),
        ("ref_half_cos", float(ref["half_cos"])),
        ("ref_exact_cos", float(cosine(g_ref[None], ref["exact"])[0])),
        ("gain_ref", float(gains[0])),
        ("gain_exact", float(gains[1])),
    ):
        out.points[key].append(val)
    return ref


def _probe_lag(
    cfg: ProbeConfig,
    ecfg: SyntheticConfig,
    params: list[Tensor],
    task_j: Task,
    ref: dict[str, Tensor],
    where: tuple[int, int, int],
    out: _Collect,
) -> None:
    """B engine batches at θ_{k−L} of trajectory j and every objective's gradient on them at θ_k."""
    j, k, lag = where
    theta_k = params[k][j]
    g_n, b_n = ecfg.group, cfg.batches
    gen = _gen(cfg.seed, j, k, lag)
    theta_b = params[k - lag][j].expand(b_n, *theta_k.shape)
    eps = torch.randn((b_n, *theta_k.shape), generator=gen)
    u = torch.rand((b_n, theta_k.shape[0], g_n, theta_k.shape[1]), generator=gen)
    samp, rec = engine_logits(theta_b, ecfg, eps)
    exact = context_divergences(theta_k, params[k - lag][j])
    for key, val in (("traj", j), ("point", k), ("lag", lag), *((n, float(x)) for n, x in exact.items())):
        out.kl[key].append(val)
    batch = sample_batch(samp, rec, _expand_task(task_j, b_n), g_n, u)
    adv, _ = group_advantages(batch.rewards.reshape(-1), batch.group_ids.reshape(-1))
    adv = adv.reshape(b_n, -1)
    signal = (adv != 0).any(-1).float()  # batches with reward spread in at least one group
    with torch.no_grad():
        logp_k = token_logp(torch.log_softmax(theta_k, -1).expand(b_n, *theta_k.shape), batch)
    ess = batch_diagnostics(logp_k - batch.rollout_logp)["ess"]
    g_ref, j0 = ref["g"], ref["J"]
    for spec, name, hyper in [objective_spec(spec) for spec in cfg.objectives]:
        rep = theta_k.detach().expand(b_n, *theta_k.shape).clone().requires_grad_(True)
        logp = token_logp(torch.log_softmax(rep, -1), batch)
        loss, _ = objective_loss(name, hyper, logp, batch.rollout_logp, adv, prox_logp=logp_k, old_logp=logp_k)
        (grad,) = torch.autograd.grad(loss, rep)
        d = -grad.reshape(b_n, -1)
        dm = d.mean(0)
        out.mean_dirs.setdefault((spec, lag), []).append(
            (float(cosine(dm[None], g_ref)[0]), float(dm.norm() / g_ref.norm().clamp(min=1e-30)))
        )
        for key, vals in (
            ("ess", ess),
            ("signal", signal),
            ("cos", cosine(d, g_ref)),
            ("norm_ratio", d.norm(dim=-1) / g_ref.norm().clamp(min=1e-30)),
            ("gain", _step_gain(theta_k, d, task_j, cfg.step_size, j0)),
            ("cos_exact", cosine(d, ref["exact"])),
            ("zero", (d.norm(dim=-1) == 0).float()),
        ):
            out.rows[key].extend(round(float(x), 6) for x in vals)
        out.rows["traj"].extend([j] * b_n)
        out.rows["point"].extend([k] * b_n)
        out.rows["lag"].extend([lag] * b_n)
        out.rows["batch"].extend(range(b_n))
        out.rows["objective"].extend([spec] * b_n)
