"""The synthetic training loop: S seeds of the toy policy trained at once with one objective in one regime
(:func:`run_synthetic`), exact J(θ) recorded at every step."""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from typing import Any

import torch
from torch import Tensor

from p3o.advantages import group_advantages
from p3o.experiments.synthetic.config import SyntheticConfig
from p3o.experiments.synthetic.env import (
    STREAM_NOISE,
    STREAM_PERM,
    STREAM_SAMPLE,
    Task,
    expected_reward,
    gen,
    init_params,
    make_task,
)
from p3o.experiments.synthetic.losses import batch_diagnostics, objective_loss
from p3o.experiments.synthetic.sampler import Batch, engine_logits, rows_of, sample_batch, token_logp
from p3o.objectives import get_objective


class _Adam:  # torch.optim.Adam rounds otherwise (806 of 20,480 entries differ after one step): results would change
    """Element-wise Adam (or SGD) on one (S, ...) tensor with an optional per-seed gradient-norm clip.

    Every seed's slice is an independent run: Adam's moments are element-wise and the clip norm is per seed.
    """

    def __init__(self, cfg: SyntheticConfig, like: Tensor) -> None:
        self.cfg = cfg
        self.m = torch.zeros_like(like)
        self.v = torch.zeros_like(like)
        self.t = 0

    def step(self, theta: Tensor, grad: Tensor) -> tuple[Tensor, Tensor]:
        """Return (θ − lr·update, per-seed grad norm (S,) before clipping)."""
        norms = grad.reshape(grad.shape[0], -1).norm(dim=-1)
        if self.cfg.grad_clip > 0:
            scale = (self.cfg.grad_clip / norms.clamp(min=1e-12)).clamp(max=1.0)
            grad = grad * scale.reshape(-1, *([1] * (grad.dim() - 1)))
        if self.cfg.optimizer == "sgd":
            return theta - self.cfg.lr * grad, norms
        b1, b2 = self.cfg.betas
        self.t += 1
        self.m.mul_(b1).add_(grad, alpha=1 - b1)
        self.v.mul_(b2).addcmul_(grad, grad, value=1 - b2)
        mhat = self.m / (1 - b1**self.t)
        vhat = self.v / (1 - b2**self.t)
        return theta - self.cfg.lr * mhat / (vhat.sqrt() + 1e-8), norms


def _entropy_table(log_pi: Tensor, batch: Batch, rows: Tensor) -> Tensor:
    ent = -(log_pi.exp() * log_pi).sum(-1, keepdim=True).expand_as(log_pi)  # (S,P,T,C,V), constant over v
    return token_logp(ent, batch, rows)


def run_synthetic(cfg: SyntheticConfig) -> dict[str, Any]:
    """Train S seeds of the toy policy with objective ``cfg.objective`` in ``cfg``'s regime; exact metrics.

    Per step k (``cfg.steps`` of them): J(θ) is recorded exactly, a batch of P·G sequences is sampled from the
    engine at θ_{u−L} (u = optimizer updates so far), group advantages are computed once, then E epochs × M
    shuffled mini-batches each take one optimizer step on Σ_s loss_s (seeds are independent).

    Returns a JSON-ready dict:
        ``config``: the config; ``seeds``: list of S seeds; ``wall_s``;
        ``per_seed``: lists of S floats — ``base_reward`` J(θ_0), ``final_reward`` J(θ_K), ``mean_reward``
        (mean of J over the K+1 evaluations), ``last_third_reward`` (mean over the last third), ``max_reward``,
        ``mean_ess``, ``p10_ess`` (10th percentile over the seed's updates), ``min_ess``;
        ``per_seed_curves`` (if ``cfg.per_seed_curves``): ``reward`` (K+1)×S exact J, ``ess`` K×S (step means);
        ``curves``: per-step means over seeds (length K, ``reward`` K+1): reward, reward_p10/p90, ess, ess_p10,
        kl_weight (1 − ESS), m_mean, m_above_0.5, m_below_0.1, clip_0.2, batch_reward, grad_norm, and the
        objective's own stats (``obj_<name>``: clipfrac, capped_frac, kl_weight, masked_frac, …);
        ``summary``: cell means of the per-seed numbers and of the curves;
        ``params`` (if ``cfg.save_params``): list of (S, P, T, V+1, V) tensors θ_0..θ_U, one per update.
    """
    cfg.validate()
    threads = torch.get_num_threads()
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)  # tiny tensors: one thread is ~10x faster than contended intra-op threads
    try:
        return _run(cfg)
    finally:
        torch.set_num_threads(threads)


@dataclasses.dataclass
class _Loop:
    """The state of one synthetic run: the table θ (S, P, T, V+1, V), its optimizer, the noise streams, the last
    L + 1 tables (the engine samples from the oldest) and the per-step records."""

    cfg: SyntheticConfig
    task: Task
    theta: Tensor
    opt: _Adam
    gens: dict[int, list[torch.Generator]]
    history: deque[Tensor]
    saved: list[Tensor]
    ref_log_pi: Tensor | None
    needs: frozenset[str]
    rewards: list[Tensor]
    curves: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    seed_ess_steps: list[Tensor] = dataclasses.field(default_factory=list)
    seed_ess_all: list[Tensor] = dataclasses.field(default_factory=list)

    @classmethod
    def start(cls, cfg: SyntheticConfig) -> _Loop:
        """θ_0, the task and the streams of every seed; J(θ_0) recorded."""
        seeds = cfg.seed_list()
        task = make_task(cfg)
        theta = init_params(cfg)
        needs = frozenset(get_objective(cfg.objective).inputs_needed(cfg.hyper))  # which inputs it reads
        return cls(
            cfg=cfg,
            task=task,
            theta=theta,
            opt=_Adam(cfg, theta),
            gens={k: [gen(s, k) for s in seeds] for k in (STREAM_SAMPLE, STREAM_NOISE, STREAM_PERM)},
            history=deque([theta.clone()], maxlen=cfg.lag + 1),
            saved=[theta.clone()] if cfg.save_params else [],
            ref_log_pi=torch.log_softmax(theta, -1) if "ref_logp" in needs else None,
            needs=needs,
            rewards=[expected_reward(theta, task)],
        )

    def add(self, key: str, value: float) -> None:
        self.curves.setdefault(key, []).append(value)

    def sample(self) -> tuple[Batch, Tensor]:
        """One rollout batch from the engine at θ_{u−L} and its group advantages (S, P·G)."""
        cfg = self.cfg
        theta_b = self.history[0]
        shape = (cfg.prompts, cfg.group, cfg.length)
        u = torch.stack([torch.rand(shape, generator=g) for g in self.gens[STREAM_SAMPLE]])
        eps = torch.stack([torch.randn(self.theta.shape[1:], generator=g) for g in self.gens[STREAM_NOISE]])
        samp, rec = engine_logits(theta_b, cfg, eps)
        batch = sample_batch(samp, rec, self.task, cfg.group, u)
        adv, _ = group_advantages(batch.rewards.reshape(-1), batch.group_ids.reshape(-1), **cfg.advantage)
        return batch, adv.reshape(self.theta.shape[0], cfg.prompts * cfg.group)

    def update(self, batch: Batch, adv: Tensor, rows: Tensor, snap: Tensor | None, old_all: Tensor | None) -> Any:
        """One optimizer update on the mini-batch ``rows`` (S, n): (grad norms (S,), diagnostics, objective stats)."""
        cfg, needs = self.cfg, self.needs
        th = self.theta.detach().requires_grad_(True)
        log_pi = torch.log_softmax(th, -1)
        logp = token_logp(log_pi, batch, rows)
        roll = rows_of(batch.rollout_logp, rows)
        loss, st = objective_loss(
            cfg.objective,
            cfg.hyper,
            logp,
            roll,
            rows_of(adv, rows),
            prox_logp=None if "prox_logp" not in needs else rows_of(snap, rows),
            old_logp=None if "old_logp" not in needs else rows_of(old_all, rows),
            ref_logp=None if self.ref_log_pi is None else token_logp(self.ref_log_pi, batch, rows),
            entropy=None if "entropy" not in needs else _entropy_table(log_pi, batch, rows),
        )
        (grad,) = torch.autograd.grad(loss, th)
        self.theta, gn = self.opt.step(self.theta.detach(), grad)
        self.history.append(self.theta.clone())
        if cfg.save_params:
            self.saved.append(self.theta.clone())
        return gn, batch_diagnostics(logp.detach() - roll), st

    def step(self) -> None:
        """One global step: a batch, E epochs × M shuffled mini-batches of updates, then the step's records."""
        cfg = self.cfg
        n_rows = cfg.prompts * cfg.group
        batch, adv = self.sample()
        step_diag: dict[str, list[Tensor]] = {}
        step_obj: dict[str, list[Tensor]] = {}
        gnorms = []
        old_all = None
        for epoch in range(cfg.epochs):
            with torch.no_grad():
                wants = "prox_logp" in self.needs or "old_logp" in self.needs
                snap = token_logp(torch.log_softmax(self.theta, -1), batch) if wants else None
                if epoch == 0:
                    old_all = snap
            perm = torch.stack([torch.randperm(n_rows, generator=g) for g in self.gens[STREAM_PERM]])
            for chunk in torch.arange(n_rows).chunk(cfg.mini_batches):
                gn, diag, st = self.update(batch, adv, perm[:, chunk], snap, old_all)
                gnorms.append(gn)
                for key, val in diag.items():
                    step_diag.setdefault(key, []).append(val)
                for key, val in st.items():
                    step_obj.setdefault(key, []).append(val)
        with torch.no_grad():
            self.rewards.append(expected_reward(self.theta, self.task))
        self.record(batch, step_diag, step_obj, gnorms)

    def record(
        self, batch: Batch, step_diag: dict[str, list[Tensor]], step_obj: dict[str, list[Tensor]], gnorms: list[Tensor]
    ) -> None:
        """The step's curve points (means over seeds and updates)."""
        ess_u = torch.stack(step_diag["ess"], 1)  # (S, updates)
        self.seed_ess_steps.append(ess_u.mean(1))
        self.seed_ess_all.append(ess_u)
        self.add("ess", float(ess_u.mean()))
        self.add("ess_p10", float(torch.quantile(ess_u.flatten(), 0.1)))
        self.add("kl_weight", float(1 - ess_u.mean()))
        for key in ("m_mean", "m_above_0.5", "m_below_0.1", "clip_0.2"):
            self.add(key, float(torch.stack(step_diag[key]).mean()))
        self.add("batch_reward", float(batch.rewards.mean()))
        self.add("grad_norm", float(torch.stack(gnorms).mean()))
        for key, vals in step_obj.items():
            self.add(f"obj_{key}", float(torch.stack(vals).mean()))


def _run(cfg: SyntheticConfig) -> dict[str, Any]:
    t0 = time.perf_counter()
    loop = _Loop.start(cfg)
    for _k in range(cfg.steps):
        loop.step()
    return _results(loop, t0)


def _results(loop: _Loop, t0: float) -> dict[str, Any]:
    """The JSON-ready result of a finished run (see :func:`run_synthetic`)."""
    cfg = loop.cfg
    rew = torch.stack(loop.rewards)  # (K+1, S)
    ess_seed = torch.stack(loop.seed_ess_steps)  # (K, S)
    s_n = rew.shape[1]
    ess_full = torch.cat(loop.seed_ess_all, 1) if loop.seed_ess_all else torch.ones(s_n, 1)  # (S, U)
    third = max(1, (cfg.steps + 1) // 3)
    per_seed = {
        "base_reward": rew[0],
        "final_reward": rew[-1],
        "mean_reward": rew.mean(0),
        "last_third_reward": rew[-third:].mean(0),
        "max_reward": rew.max(0).values,
        "mean_ess": ess_full.mean(1),
        "p10_ess": torch.quantile(ess_full, 0.1, dim=1),
        "min_ess": ess_full.min(1).values,
    }
    curves = {"reward": [float(x) for x in rew.mean(1)], **loop.curves}
    curves["reward_p10"] = [float(x) for x in torch.quantile(rew, 0.1, dim=1)]
    curves["reward_p90"] = [float(x) for x in torch.quantile(rew, 0.9, dim=1)]
    summary: dict[str, float] = {f"{k}": float(v.mean()) for k, v in per_seed.items()}
    summary["ess_p10_all"] = float(torch.quantile(ess_full.flatten(), 0.1))
    keys = ("kl_weight", "m_mean", "m_above_0.5", "m_below_0.1", "clip_0.2")
    for key in (*keys, "obj_clipfrac", "obj_trunc_frac", "obj_capped_frac", "obj_masked_frac", "obj_kl_weight"):
        if curves.get(key):
            summary[key] = sum(curves[key]) / len(curves[key])
    wall = time.perf_counter() - t0
    summary["wall_s"] = wall
    out: dict[str, Any] = {
        "instrument": "synthetic tabular autoregressive toy (not a language model)",
        "config": _jsonable(dataclasses.asdict(cfg)),
        "seeds": cfg.seed_list(),
        "wall_s": wall,
        "per_seed": {k: [float(x) for x in v] for k, v in per_seed.items()},  # full precision: exact pairing
        "curves": {k: [round(x, 6) for x in v] for k, v in curves.items()},
        "summary": summary,
    }
    if cfg.per_seed_curves:
        out["per_seed_curves"] = {
            "reward": [[round(float(x), 5) for x in row] for row in rew],
            "ess": [[round(float(x), 5) for x in row] for row in ess_seed],
        }
    if cfg.save_params:
        out["params"] = loop.saved
        out["task"] = loop.task
    return out


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x
