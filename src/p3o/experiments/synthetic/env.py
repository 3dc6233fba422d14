"""The toy policy's world: hidden targets (:class:`Task`), the initial logits table, the exact expected reward
J(θ) by dynamic programming and the exact per-context divergences between two tables. Seed s fixes its task,
its table and its noise streams (:func:`gen`, ``STREAM_*``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from p3o.experiments.synthetic.config import SyntheticConfig


@dataclass
class Task:
    """Hidden targets of S seeds: ``targets`` (S, P, T, V+1) long, τ[s, p, t, c] ∈ {0..V−1}; reward settings."""

    targets: Tensor
    reward: str
    threshold: int

    def reward_of_count(self, counts: Tensor) -> Tensor:
        """R as a function of the hit count n (any shape, long/float): 1[n ≥ k] or n/T."""
        if self.reward == "threshold":
            return (counts >= self.threshold).to(torch.float32)
        return counts.to(torch.float32) / self.targets.shape[2]


def gen(seed: int, stream: int) -> torch.Generator:
    """A CPU generator for stream ``stream`` of seed ``seed`` (streams never overlap across seeds or streams)."""
    return torch.Generator().manual_seed(1_000_003 * int(seed) + 7919 * int(stream) + 17)


STREAM_TASK, STREAM_INIT, STREAM_SAMPLE, STREAM_NOISE, STREAM_PERM = range(5)


def make_task(cfg: SyntheticConfig) -> Task:
    """The targets τ of every seed of ``cfg`` (seed s: generator (task_seed·10⁶ + s, STREAM_TASK))."""
    shape = (cfg.prompts, cfg.length, cfg.vocab + 1)
    tg = [
        torch.randint(0, cfg.vocab, shape, generator=gen(cfg.task_seed * 1_000_000 + s, STREAM_TASK))
        for s in cfg.seed_list()
    ]
    return Task(torch.stack(tg), cfg.reward, cfg.threshold)


def init_params(cfg: SyntheticConfig) -> Tensor:
    """θ_0 (S, P, T, V+1, V) float32: σ_0·N(0, 1) per entry, seed s drawn from its own init stream."""
    shape = (cfg.prompts, cfg.length, cfg.vocab + 1, cfg.vocab)
    return torch.stack(
        [torch.randn(shape, generator=gen(s, STREAM_INIT)) * cfg.init_scale for s in cfg.seed_list()]
    ).float()


def expected_reward(theta: Tensor, task: Task) -> Tensor:
    """EXACT expected reward J_s(θ) = mean_p E_{y∼π_θ(·|p)} R(p, y), (S,), by dynamic programming; differentiable.

    Forward over positions t with α_t[c, n] = P(y_{t} = c, hits so far = n) (c = V is BOS at t = 0):

        α_{t+1}[v, n + h_t(c, v)] += α_t[c, n] · softmax(θ[p, t, c])[v],   h_t(c, v) = 1[v = τ[p, t, c]]

    then J = Σ_n α_T[·, n] summed over c, times R(n). Cost O(S·P·T·(V+1)·V·(T+1)).

    Args:
        theta: (S, P, T, V+1, V) logits.
        task: its targets (S, P, T, V+1).
    Returns:
        (S,) float32 (float64 accumulation is unnecessary at these sizes).
    """
    s, p, t_len, c, v = theta.shape
    probs = torch.softmax(theta, dim=-1)
    hit = torch.arange(v, device=theta.device) == task.targets[..., None]  # (S, P, T, C, V)
    alpha = torch.zeros(s, p, c, t_len + 1, dtype=theta.dtype, device=theta.device)
    alpha[:, :, v, 0] = 1.0
    zeros_bos = torch.zeros(s, p, 1, t_len + 1, dtype=theta.dtype, device=theta.device)
    for t in range(t_len):
        a = alpha[:, :, :, None, :] * probs[:, :, t, :, :, None]  # (S, P, C, V, K)
        h = hit[:, :, t, :, :, None]
        miss = torch.where(h, 0.0, a).sum(2)  # (S, P, V, K)
        hits = torch.where(h, a, 0.0).sum(2)
        new = miss + torch.nn.functional.pad(hits[..., :-1], (1, 0))
        alpha = torch.cat([new, zeros_bos], dim=2)
    dist = alpha.sum(2)  # (S, P, K): P(hit count = n)
    r = task.reward_of_count(torch.arange(t_len + 1, device=theta.device)).to(theta.dtype)
    return (dist * r).sum(-1).mean(-1)


def context_divergences(theta: Tensor, theta_b: Tensor) -> dict[str, Tensor]:
    """EXACT per-context divergences between π_θ and a behaviour policy π_b, and what P3O's KL estimators average to
    on tokens sampled from π_b, each as a per-token mean over the contexts π_b visits.

    For every context (p, t, c) with next-token distributions π = softmax(θ[p, t, c]), b = softmax(θ_b[p, t, c]) and
    lr(v) = log π(v) − log b(v):

        kl       KL(π_θ ‖ π_b) = Σ_v π lr                      (the divergence P3O's KL term is meant to estimate)
        kl_rev   KL(π_b ‖ π_θ) = −Σ_v b lr
        chi2     χ²(π_b ‖ π_θ) = Σ_v b² / π − 1
        e_k3     E_b[k3(lr)] = E_b[e^{−lr} + lr − 1] = χ²(π_b ‖ π_θ) − KL(π_b ‖ π_θ)    (the paper's estimator)
        e_k3_is  E_b[e^{lr}·lr − e^{lr} + 1] = KL(π_θ ‖ π_b)                              (unbiased)
        e_k2     E_b[½·lr²]

    each weighted by d_t^b(c), the probability that π_b reaches context c at position t (d_0 = BOS; d_{t+1}(v) =
    Σ_c d_t(c)·b(v | t, c)), summed over c, averaged over positions t and prompts p.

    Args:
        theta, theta_b: (..., P, T, V+1, V) logits tables (any leading batch shape).
    Returns:
        {name: (...,) float64} for the six names above.
    """
    lp = torch.log_softmax(theta.double(), -1)
    lb = torch.log_softmax(theta_b.double(), -1)
    pi, b = lp.exp(), lb.exp()
    lr = lp - lb
    per = {
        "kl": (pi * lr).sum(-1),
        "kl_rev": -(b * lr).sum(-1),
        "chi2": (b * torch.expm1(-lr)).sum(-1),
        "e_k2": 0.5 * (b * lr * lr).sum(-1),
    }
    per["e_k3"] = per["chi2"] - per["kl_rev"]
    per["e_k3_is"] = per["kl"].clone()
    *lead, p_n, t_len, c_n, v = theta.shape
    visit = torch.zeros((*lead, p_n, t_len, c_n), dtype=torch.float64)
    d = torch.zeros((*lead, p_n, c_n), dtype=torch.float64)
    d[..., v] = 1.0
    for t in range(t_len):
        visit[..., t, :] = d
        nxt = (d[..., None] * b[..., t, :, :]).sum(-2)  # (..., P, V)
        d = torch.cat([nxt, torch.zeros((*lead, p_n, 1), dtype=torch.float64)], -1)
    return {k: (visit * x).sum(-1).mean(-1).mean(-1) for k, x in per.items()}
