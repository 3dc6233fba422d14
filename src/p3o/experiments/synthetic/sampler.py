"""The synthetic rollout engine: its logits (engine noise, sampling temperature, raw or processed log-probs),
batches of G sequences per prompt sampled by inverse CDF, and token log-probs gathered from a table."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from p3o.experiments.synthetic.config import SyntheticConfig
from p3o.experiments.synthetic.env import Task


@dataclass
class Batch:
    """S seeds' rollout batches, N = P·G sequences each. Shapes: y, prev, rollout_logp (S, N, T); pid, rewards,
    group_ids (S, N); hits (S, N). ``prev`` holds y_{t−1} (V = BOS at t = 0)."""

    y: Tensor
    prev: Tensor
    pid: Tensor
    rollout_logp: Tensor
    rewards: Tensor
    hits: Tensor
    group_ids: Tensor


def sample_batch(sample_logits: Tensor, record_logits: Tensor, task: Task, group: int, uniforms: Tensor) -> Batch:
    """Sample G sequences per prompt from softmax(``sample_logits``) by inverse CDF with the given uniforms and
    record log softmax(``record_logits``)[y_t] as the rollout log-probs (the engine's recorded values).

    Args:
        sample_logits, record_logits: (S, P, T, V+1, V) — the engine's logits (noise / temperature applied).
        uniforms: (S, P, G, T) in [0, 1) — common random numbers (same uniforms + same policy = same samples).
    """
    s, p, t_len, _, v = sample_logits.shape
    cdf = torch.softmax(sample_logits, -1).cumsum(-1)
    rec = torch.log_softmax(record_logits, -1)
    prev = torch.full((s, p, group), v, dtype=torch.long)
    ys, prevs, lps, hits = [], [], [], []
    si = torch.arange(s)[:, None, None]
    pi = torch.arange(p)[None, :, None]
    for t in range(t_len):
        c = cdf[si, pi, t, prev]  # (S, P, G, V)
        y = (uniforms[..., t, None] >= c[..., :-1]).sum(-1)  # inverse CDF, always < V
        ys.append(y)
        prevs.append(prev)
        lps.append(rec[si, pi, t, prev, y])
        hits.append(y == task.targets[si, pi, t, prev])
        prev = y
    n = p * group
    y_all = torch.stack(ys, -1).reshape(s, n, t_len)
    count = torch.stack(hits, -1).sum(-1).reshape(s, n)
    pid = torch.arange(p).repeat_interleave(group)[None].expand(s, n)
    gid = torch.arange(s)[:, None] * p + pid
    return Batch(
        y=y_all,
        prev=torch.stack(prevs, -1).reshape(s, n, t_len),
        pid=pid,
        rollout_logp=torch.stack(lps, -1).reshape(s, n, t_len).float(),
        rewards=task.reward_of_count(count),
        hits=count,
        group_ids=gid,
    )


def token_logp(log_pi: Tensor, batch: Batch, rows: Tensor | None = None) -> Tensor:
    """log π(y_t | p, t, y_{t−1}) of the batch's tokens, (S, n, T), gathered from a log-policy table.

    Args:
        log_pi: (S, P, T, V+1, V) log-softmax of the logits (may carry grad).
        rows: (S, n) long row indices into the batch per seed (None: all N rows).
    """
    y, prev, pid = batch.y, batch.prev, batch.pid
    if rows is not None:
        y = y.gather(1, rows[..., None].expand(-1, -1, y.shape[-1]))
        prev = prev.gather(1, rows[..., None].expand(-1, -1, prev.shape[-1]))
        pid = pid.gather(1, rows)
    s, _, t_len = y.shape
    si = torch.arange(s)[:, None, None]
    ti = torch.arange(t_len)[None, None, :]
    return log_pi[si, pid[..., None], ti, prev, y]


def rows_of(x: Tensor, rows: Tensor) -> Tensor:
    """x (S, N, T) or (S, N) restricted to rows (S, n)."""
    if x.dim() == 3:
        return x.gather(1, rows[..., None].expand(-1, -1, x.shape[-1]))
    return x.gather(1, rows)


def engine_logits(theta_b: Tensor, cfg: SyntheticConfig, eps: Tensor) -> tuple[Tensor, Tensor]:
    """(sampling logits, recorded logits) of the rollout engine at parameters θ_b with engine noise ε:

    engine = θ_b + σ·ε; sample from softmax(engine / T_s); record log softmax(engine) (``raw``) or
    log softmax(engine / T_s) (``processed``).
    """
    eng = theta_b + cfg.noise * eps if cfg.noise > 0 else theta_b
    samp = eng / cfg.temperature if cfg.temperature != 1.0 else eng
    return samp, (eng if cfg.logprob_mode == "raw" else samp)
