"""Synthetic instrument: a TABULAR AUTOREGRESSIVE TOY policy (not a language model) with an exact expected reward.

What it is: for each of P "prompts" p, a policy over sequences y = (y_1..y_T) of tokens in {0..V−1}

    π_θ(y | p) = Π_t softmax(θ[p, t, y_{t−1}, :])[y_t]          (y_0 = BOS = index V)

with θ a logits TABLE of shape (P, T, V+1, V): every (position, previous token) context has its own logits, so the
policy is autoregressive (order one) but has no shared parameters, no attention and no language. Each prompt has a
hidden target table τ[p, t, c] ∈ {0..V−1}; a token "hits" when y_t = τ[p, t, y_{t−1}], and the reward of a
sequence is a function of its hit count n(y) = Σ_t 1[y_t = τ[p, t, y_{t−1}]]:

    reward="threshold" (default):  R = 1[n(y) ≥ k]   (binary, like pass@1 on a verifiable task)
    reward="count":                R = n(y) / T       (dense, in [0, 1])

Because the hit count is a Markov statistic, the expected reward J(θ) = mean_p E_{y∼π_θ(·|p)} R is EXACT by a
forward dynamic programme over (previous token, hit count) — no sampling noise in the learning curves — and it is
differentiable, so ∇J is exact too (:func:`expected_reward`). With V = 4, T = 8, k = 3 a uniform policy solves
P(Binomial(8, 1/4) ≥ 3) ≈ 0.32 of the prompts.

Training uses the project's own pieces: group-relative advantages (:func:`p3o.advantages.group_advantages`) and
the REAL objectives (:func:`p3o.objectives.get_objective`, any name and hyper-parameters), Adam (or SGD) on the
table. Everything is vectorised over S seeds: θ has shape (S, P, T, V+1, V), one independent run per seed.
Off-policy regimes are controlled directly (:func:`parse_regime`; a name of
:data:`p3o.experiments.regimes.REGIMES` means what it means to ``p3o train``, see :func:`regime_knobs`):

* ``mb<M>`` / ``ep<E>``: M shuffled mini-batches × E epochs per rollout batch = M·E optimizer updates per batch;
* ``lag-<L>``: the batch of step k is sampled from θ_{u−L}, the parameters L optimizer updates ago (MinPRO's
  "stale n" with 16 updates per global step is ``mb16+lag-<16n>``); ``stale-<n>`` delays by n batches, as
  ``loop.staleness`` does (L = n·M·E);
* ``noise-<σ>``: a low-precision engine: the rollout engine's logits are θ_b + σ·ε (ε ∼ N(0, 1) per table entry,
  fresh each step); samples are drawn from that perturbed policy and its log-probs are recorded;
* ``temp-<T>``: the engine samples from softmax(θ_b / T) but records the RAW T = 1 log-probs (the P3O paper's
  mismatch); ``temp-<T>-processed`` records the log-probs of the distribution actually sampled from.

Common random numbers: seed s fixes its task τ, its initial table θ_0 and three noise streams (sampling
uniforms, engine noise, mini-batch permutations), drawn the same way whatever the objective, so runs of different
objectives with the same seed are paired (on-policy with one update per batch, P3O and GRPO give identical
trajectories).

Usage::

    from p3o.experiments.synthetic import SyntheticConfig, run_synthetic
    out = run_synthetic(SyntheticConfig(objective="p3o", seeds=100, steps=200, lag=8))
    out["per_seed"]["final_reward"]          # list of S floats, exact J(θ_final) per seed

    p3o synthetic --objectives p3o,grpo,minpro --regimes on-policy,stale-8 --seeds 100 \
        --out runs/synthetic.json --csv runs/synthetic.csv         # the grid CLI: p3o.experiments.synthetic_study
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from p3o.advantages import group_advantages
from p3o.errors import ConfigError
from p3o.experiments.regimes import OBJECTIVE_PRESETS, REGIMES, regime_overrides
from p3o.objectives import (
    ObjectiveInputs,
    effective_sample_size,
    get_objective,
    m2po_threshold,
    prefix_log_stat,
)

Stats = dict[str, Tensor]


# ----------------------------------------------------------------------------------------------- configuration


@dataclass
class SyntheticConfig:
    """One cell of the synthetic instrument: one objective, one regime, S seeds (vectorised).

    Problem: ``vocab`` V, ``length`` T, ``prompts`` P, ``group`` G samples per prompt per step (a batch has
    N = P·G sequences), reward ``threshold`` (R = 1[hits ≥ k]) or ``count`` (R = hits/T), ``init_scale`` σ_0 of
    the initial logits θ_0 ∼ σ_0·N(0, 1). Regime: ``mini_batches`` M, ``epochs`` E, ``lag`` L (updates),
    ``noise`` σ (engine logit noise), ``temperature`` T_s and ``logprob_mode`` (``raw``/``processed``).
    Training: ``lr``, ``optimizer`` (``adam`` element-wise / ``sgd``), ``grad_clip`` (per-seed norm; 0 = off),
    ``advantage`` (keywords of :func:`p3o.advantages.group_advantages`). ``save_params`` keeps θ after every
    update (for the probe); ``threads``: torch intra-op threads during the run (1 is fastest for these tiny
    tensors; 0 leaves the setting alone).
    """

    objective: str = "p3o"
    hyper: dict[str, Any] = field(default_factory=dict)
    seeds: int = 16
    seed_offset: int = 0
    seed_ids: list[int] | None = None
    steps: int = 200
    vocab: int = 4
    length: int = 8
    prompts: int = 2
    group: int = 8
    reward: str = "threshold"
    threshold: int = 3
    init_scale: float = 1.0
    task_seed: int = 0
    lr: float = 0.02
    optimizer: str = "adam"
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float = 0.0
    advantage: dict[str, Any] = field(default_factory=dict)
    mini_batches: int = 1
    epochs: int = 1
    lag: int = 0
    noise: float = 0.0
    temperature: float = 1.0
    logprob_mode: str = "raw"
    save_params: bool = False
    per_seed_curves: bool = True
    threads: int = 1

    def seed_list(self) -> list[int]:
        """The seeds of this cell: ``seed_ids`` when given, else seed_offset, ..., seed_offset + seeds − 1."""
        if self.seed_ids is not None:
            return [int(s) for s in self.seed_ids]
        return list(range(self.seed_offset, self.seed_offset + self.seeds))

    def validate(self) -> None:
        """Raise ConfigError on an impossible setting."""
        if self.seed_ids is not None and (not self.seed_ids or len(set(self.seed_ids)) != len(self.seed_ids)):
            raise ConfigError(f"synthetic.seed_ids: expected distinct seeds, got {self.seed_ids!r}")
        if self.vocab < 2 or self.length < 1 or self.prompts < 1 or self.group < 1 or self.seeds < 1:
            raise ConfigError("synthetic: vocab >= 2, length, prompts, group and seeds >= 1 required")
        if self.reward not in ("threshold", "count"):
            raise ConfigError(f"synthetic.reward: unknown {self.reward!r}; valid: threshold, count")
        if self.logprob_mode not in ("raw", "processed"):
            raise ConfigError(f"synthetic.logprob_mode: unknown {self.logprob_mode!r}; valid: raw, processed")
        if self.optimizer not in ("adam", "sgd"):
            raise ConfigError(f"synthetic.optimizer: unknown {self.optimizer!r}; valid: adam, sgd")
        n = self.prompts * self.group
        if not 1 <= self.mini_batches <= n or self.epochs < 1 or self.lag < 0:
            raise ConfigError(f"synthetic: need 1 <= mini_batches <= P·G = {n}, epochs >= 1, lag >= 0")
        if self.temperature <= 0 or self.noise < 0:
            raise ConfigError("synthetic: temperature > 0 and noise >= 0 required")
        get_objective(self.objective)  # unknown name -> ObjectiveError


def parse_regime(spec: str) -> dict[str, Any]:
    """Knob overrides of a regime: a name of :data:`p3o.experiments.regimes.REGIMES` or ``+``-joined knobs.

    Knobs: ``on-policy`` (nothing), ``mb<M>`` (M mini-batches), ``ep<E>`` (E epochs), ``lag-<L>`` (the batch is
    sampled L optimizer updates ago), ``stale-<n>`` (n batches ago, as ``loop.staleness``: L = n·M·E), ``noise-<σ>``,
    ``temp-<T>`` (raw T = 1 log-probs recorded) or ``temp-<T>-processed``. Example: ``mb4+lag-8+noise-0.2`` →
    {"mini_batches": 4, "lag": 8, "noise": 0.2}; ``mb4+stale-2`` → {"mini_batches": 4, "lag": 8}. A regime name
    means here what it means to ``p3o train`` (:func:`regime_knobs`).
    """
    if spec in REGIMES:
        return regime_knobs(spec)
    out: dict[str, Any] = {}
    batches = 0
    for knob in filter(None, spec.split("+")):
        if knob == "on-policy":
            continue
        if m := re.fullmatch(r"mb(\d+)", knob):
            out["mini_batches"] = int(m[1])
        elif m := re.fullmatch(r"ep(\d+)", knob):
            out["epochs"] = int(m[1])
        elif m := re.fullmatch(r"lag-(\d+)", knob):
            out["lag"] = int(m[1])
        elif m := re.fullmatch(r"stale-(\d+)", knob):
            batches = int(m[1])
        elif m := re.fullmatch(r"noise-([0-9.eE+-]+)", knob):
            out["noise"] = float(m[1])
        elif m := re.fullmatch(r"temp-([0-9.eE+-]+?)(-processed)?", knob):
            out["temperature"] = float(m[1])
            out["logprob_mode"] = "processed" if m[2] else "raw"
        else:
            raise ConfigError(
                f"synthetic regime: unknown knob {knob!r} in {spec!r}; knobs: mb<M>, ep<E>, lag-<L>, stale-<n>, "
                f"noise-<s>, temp-<T>[-processed]; named: {', '.join(REGIMES)}"
            )
    if batches:
        if "lag" in out:
            raise ConfigError(f"synthetic regime {spec!r}: give the delay once, as lag-<L> (updates) or stale-<n>")
        out["lag"] = batches * out.get("mini_batches", 1) * out.get("epochs", 1)
    return out


#: The train-config keys a named regime may set, and the synthetic knob each one becomes.
_TRANSLATABLE = {
    "loop.mode",
    "loop.staleness",
    "loop.max_lag",
    "update.num_mini_batches",
    "update.epochs",
    "rollout.temperature",
    "train.temperature",
    "rollout.logprob_mode",
}


def regime_knobs(name: str) -> dict[str, Any]:
    """The synthetic knobs of regime ``name`` of :data:`p3o.experiments.regimes.REGIMES` (one table, one meaning).

    ``update.num_mini_batches`` M and ``update.epochs`` E are mini-batches and epochs; ``loop.mode: stale`` with
    ``loop.staleness`` n, and ``async`` with ``loop.max_lag`` n (its deterministic schedule: batch b is generated by
    version b − n), delay every batch by n batches = n·M·E optimizer updates; ``rollout.temperature`` T with raw
    log-probs is ``temp-<T>``. A regime with no synthetic counterpart (a real engine, a rollout precision) is a
    ConfigError naming the knob to use instead (``noise-<σ>`` for a low-precision engine).
    """
    over = regime_overrides(name)
    other = sorted(set(over) - _TRANSLATABLE)
    if other or float(over.get("train.temperature", 1.0)) != 1.0:
        raise ConfigError(
            f"synthetic regime {name!r}: {', '.join(other) or 'train.temperature'} has no counterpart on the toy "
            "policy; use its knobs (noise-<s> for a low-precision engine)"
        )
    m, e = int(over.get("update.num_mini_batches", 1)), int(over.get("update.epochs", 1))
    out: dict[str, Any] = {}
    if m != 1:
        out["mini_batches"] = m
    if e != 1:
        out["epochs"] = e
    n = {"stale": over.get("loop.staleness", 0), "async": over.get("loop.max_lag", 0)}.get(over["loop.mode"], 0)
    if n:
        out["lag"] = int(n) * m * e
    if "rollout.temperature" in over:
        out["temperature"] = float(over["rollout.temperature"])
        out["logprob_mode"] = "processed" if over.get("rollout.logprob_mode") == "processed" else "raw"
    return out


def _coerce(value: str) -> Any:
    low = value.lower()
    if low in ("none", "null"):
        return None
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return value


def parse_objective(spec: str) -> tuple[str, dict[str, Any]]:
    """(objective name, hyper-parameters) of a spec: ``name[:key=value[:key=value...]]`` or a preset of
    :data:`p3o.experiments.regimes.OBJECTIVE_PRESETS` (e.g. ``grpo-0.4``), optionally followed by ``:key=value``.

    Example: ``grpo:clip_eps=0.4:agg=token-mean`` → ("grpo", {"clip_eps": 0.4, "agg": "token-mean"}).
    """
    head, *kvs = spec.split(":")
    hyper: dict[str, Any] = {}
    name = head
    preset = OBJECTIVE_PRESETS.get(head)
    if preset is not None:
        name = preset["objective.name"]
        hyper = {k.split(".", 1)[1]: v for k, v in preset.items() if k != "objective.name"}
    for kv in kvs:
        if "=" not in kv:
            raise ConfigError(f"synthetic objective spec {spec!r}: expected key=value, got {kv!r}")
        k, v = kv.split("=", 1)
        hyper[k] = _coerce(v)
    get_objective(name)
    return name, hyper


# ----------------------------------------------------------------------------------------------- the toy policy


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


def _gen(seed: int, stream: int) -> torch.Generator:
    """A CPU generator for stream ``stream`` of seed ``seed`` (streams never overlap across seeds or streams)."""
    return torch.Generator().manual_seed(1_000_003 * int(seed) + 7919 * int(stream) + 17)


STREAM_TASK, STREAM_INIT, STREAM_SAMPLE, STREAM_NOISE, STREAM_PERM = range(5)


def make_task(cfg: SyntheticConfig) -> Task:
    """The targets τ of every seed of ``cfg`` (seed s: generator (task_seed·10⁶ + s, STREAM_TASK))."""
    shape = (cfg.prompts, cfg.length, cfg.vocab + 1)
    tg = [
        torch.randint(0, cfg.vocab, shape, generator=_gen(cfg.task_seed * 1_000_000 + s, STREAM_TASK))
        for s in cfg.seed_list()
    ]
    return Task(torch.stack(tg), cfg.reward, cfg.threshold)


def init_params(cfg: SyntheticConfig) -> Tensor:
    """θ_0 (S, P, T, V+1, V) float32: σ_0·N(0, 1) per entry, seed s drawn from its own init stream."""
    shape = (cfg.prompts, cfg.length, cfg.vocab + 1, cfg.vocab)
    return torch.stack(
        [torch.randn(shape, generator=_gen(s, STREAM_INIT)) * cfg.init_scale for s in cfg.seed_list()]
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


def _rows(x: Tensor, rows: Tensor) -> Tensor:
    """x (S, N, T) or (S, N) restricted to rows (S, n)."""
    if x.dim() == 3:
        return x.gather(1, rows[..., None].expand(-1, -1, x.shape[-1]))
    return x.gather(1, rows)


# ----------------------------------------------------------------------------------------------- objectives


def objective_loss(
    name: str,
    hyper: dict[str, Any],
    logp: Tensor,
    rollout_logp: Tensor,
    advantages: Tensor,
    *,
    prox_logp: Tensor | None = None,
    old_logp: Tensor | None = None,
    ref_logp: Tensor | None = None,
    entropy: Tensor | None = None,
    layout: str = "auto",
) -> tuple[Tensor, Stats]:
    """Σ_s loss_s of the REAL objective ``name`` applied to each seed's batch separately, and pooled stats.

    Each seed's loss is exactly ``get_objective(name)(ObjectiveInputs(logp[s], rollout_logp[s], mask, adv[s],
    ...), **hyper)`` on its own (n, T) batch; it is computed in one call when that is exact:

    * ``rows`` (``coupling_for(hyper)`` ``"row"``, and ``"ess-scope"`` ones such as P3O with ``scope="sequence"``;
      a row-rejecting rollout correction makes it ``"batch"``):
      the S·n rows in one (S·n, T) batch —
      the per-token losses only see their own row, and the aggregation's 1/(S·…) is multiplied back by S;
    * ``seed-rows`` (P3O with scope micro-batch / step): each seed's n·T tokens as ONE row of an (S, n·T) batch
      with ``scope="sequence"``, which gives each seed its own e_B = ESS over its batch (identical per-token loss;
      with equal lengths every aggregation mode reduces to the same per-seed mean);
    * ``vmap`` (p3o_two_anchor, m2po: two batch ESS values / a batch-level threshold): one call per seed, batched
      by torch.func.vmap (M2PO's per-seed threshold precomputed); ``loop``: plain per-seed calls (also the fallback
      when vmap meets an op without a batching rule; nothing is remembered between calls).

    Args:
        logp: (S, n, T) with grad; rollout_logp, prox_logp, old_logp, ref_logp, entropy: (S, n, T);
        advantages: (S, n).
        layout: ``auto`` (the fastest exact one), or force ``vmap`` / ``loop``.
    Returns:
        (0-d loss = Σ_s loss_s, stats: 0-d tensors, means over seeds (pooled over tokens for the one-call layouts)).
    """
    fn = get_objective(name)
    s, n, t_len = logp.shape
    side = {"prox_logp": prox_logp, "old_logp": old_logp, "ref_logp": ref_logp, "entropy": entropy}
    scope = fn.resolve(hyper).get("scope")
    coupling = fn.coupling_for(hyper)  # a row-rejecting rollout correction couples the rows (``batch``)
    if layout == "auto":
        if coupling == "row" or (coupling == "ess-scope" and scope == "sequence"):
            layout = "rows"
        elif coupling == "ess-scope":
            layout = "seed-rows"
        else:
            layout = "vmap"
    if layout == "rows":
        shape = (s * n, t_len)
        mask = torch.ones(shape, dtype=torch.bool)
        extra = {k: None if v is None else v.reshape(shape) for k, v in side.items()}
        inputs = ObjectiveInputs(
            logp.reshape(shape), rollout_logp.reshape(shape), mask, advantages.reshape(-1), **extra
        )
        loss, st = fn(inputs, **hyper)
        return loss * s, st
    if layout == "seed-rows":
        shape = (s, n * t_len)
        mask = torch.ones(shape, dtype=torch.bool)
        extra = {k: None if v is None else v.reshape(shape) for k, v in side.items()}
        adv = advantages[..., None].expand(s, n, t_len).reshape(shape)
        h = {**hyper, "scope": "sequence"}
        if h.get("agg", "token-mean") == "seq-mean-token-sum-norm":
            raise ConfigError("synthetic: p3o with agg=seq-mean-token-sum-norm needs layout='loop'")
        loss, st = fn(ObjectiveInputs(logp.reshape(shape), rollout_logp.reshape(shape), mask, adv, **extra), **h)
        return loss * s, st
    if layout == "vmap":
        try:
            return _vmapped(fn, name, hyper, logp, rollout_logp, advantages, side)
        except RuntimeError:  # an op without a batching rule (none today): the per-seed loop gives the same loss
            pass
    elif layout not in ("loop", "vmap"):
        raise ConfigError(f"objective_loss: unknown layout {layout!r}; valid: auto, rows, seed-rows, vmap, loop")
    mask = torch.ones((n, t_len), dtype=torch.bool)
    total = logp.new_zeros(())
    acc: dict[str, Tensor] = {}
    for i in range(s):
        extra = {k: None if v is None else v[i] for k, v in side.items()}
        loss, st = fn(ObjectiveInputs(logp[i], rollout_logp[i], mask, advantages[i], **extra), **hyper)
        total = total + loss
        for k, v in st.items():
            acc[k] = acc.get(k, torch.zeros(())) + v
    return total, {k: v / s for k, v in acc.items()}


def _vmapped(
    fn: Any,
    name: str,
    hyper: dict[str, Any],
    logp: Tensor,
    rollout_logp: Tensor,
    advantages: Tensor,
    side: dict[str, Tensor | None],
) -> tuple[Tensor, Stats]:
    """Per-seed calls of ``fn`` batched with torch.func.vmap (autograd flows through the vmapped forward).

    M2PO's batch-level cut is computed per seed by :func:`p3o.objectives.m2po_threshold` first and passed in as
    ``ObjectiveInputs.m2po_threshold`` (exactly what the objective computes on its own batch).
    """
    s, n, t_len = logp.shape
    mask = torch.ones((n, t_len), dtype=torch.bool)
    keys = [k for k, v in side.items() if v is not None]
    args = [side[k] for k in keys]
    rec = get_objective(name)
    if "m2po_threshold" in rec.inputs_needed(hyper):
        tau = float(rec.resolve(hyper)["tau"])
        lr = logp.detach() - rollout_logp
        try:
            thr = torch.func.vmap(lambda x: m2po_threshold(x, mask, tau))(lr)
        except RuntimeError:  # pragma: no cover - depends on torch's batching rules
            thr = torch.stack([m2po_threshold(lr[i], mask, tau) for i in range(s)])
        args.append(thr)
        keys.append("m2po_threshold")

    def one(lp: Tensor, rl: Tensor, adv: Tensor, *xs: Tensor) -> tuple[Tensor, Stats]:
        return fn(ObjectiveInputs(lp, rl, mask, adv, **dict(zip(keys, xs))), **hyper)

    losses, stats = torch.func.vmap(one)(logp, rollout_logp, advantages, *args)
    return losses.sum(), {k: v.float().mean() for k, v in stats.items()}


def batch_diagnostics(log_ratio: Tensor) -> dict[str, Tensor]:
    """Per-seed off-policy diagnostics of one (mini-)batch's log-ratios lr = log π_θ − log π_b, (S, n, T):

    ``ess`` (S,): Kong's ESS over the seed's n·T tokens (= P3O's e_B); ``m_mean`` (S,), ``m_above_0.5``,
    ``m_below_0.1``: MinPRO's prefix minimum m_t = min_{j<t} ρ_j (m_1 = 1) and its token fractions;
    ``clip_0.2`` (S,): fraction of tokens with |ρ − 1| > 0.2 (a nominal clip fraction, any objective).
    """
    s, n, t_len = log_ratio.shape
    lr = log_ratio.detach()
    ess = effective_sample_size(lr.reshape(s, n * t_len), torch.ones(s, n * t_len, dtype=torch.bool), scope="sequence")
    m = prefix_log_stat(lr.reshape(s * n, t_len), torch.ones(s * n, t_len, dtype=torch.bool), "min").exp()
    m = m.reshape(s, n * t_len)
    return {
        "ess": ess[:, 0],
        "m_mean": m.mean(-1),
        "m_above_0.5": (m > 0.5).float().mean(-1),
        "m_below_0.1": (m < 0.1).float().mean(-1),
        "clip_0.2": ((lr.exp() - 1).abs() > 0.2).float().reshape(s, -1).mean(-1),
    }


# ----------------------------------------------------------------------------------------------- training


class _Adam:
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


def engine_logits(theta_b: Tensor, cfg: SyntheticConfig, eps: Tensor) -> tuple[Tensor, Tensor]:
    """(sampling logits, recorded logits) of the rollout engine at parameters θ_b with engine noise ε:

    engine = θ_b + σ·ε; sample from softmax(engine / T_s); record log softmax(engine) (``raw``) or
    log softmax(engine / T_s) (``processed``).
    """
    eng = theta_b + cfg.noise * eps if cfg.noise > 0 else theta_b
    samp = eng / cfg.temperature if cfg.temperature != 1.0 else eng
    return samp, (eng if cfg.logprob_mode == "raw" else samp)


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


def _run(cfg: SyntheticConfig) -> dict[str, Any]:
    t0 = time.perf_counter()
    seeds = cfg.seed_list()
    s_n, p_n, g_n, t_len = len(seeds), cfg.prompts, cfg.group, cfg.length
    n_rows = p_n * g_n
    task = make_task(cfg)
    theta = init_params(cfg)
    opt = _Adam(cfg, theta)
    gens = {k: [_gen(s, k) for s in seeds] for k in (STREAM_SAMPLE, STREAM_NOISE, STREAM_PERM)}
    table_shape = theta.shape[1:]
    history: deque[Tensor] = deque([theta.clone()], maxlen=cfg.lag + 1)
    saved: list[Tensor] = [theta.clone()] if cfg.save_params else []
    needs = get_objective(cfg.objective).inputs_needed(cfg.hyper)  # the record says which inputs it reads
    ref_log_pi = torch.log_softmax(theta, -1) if "ref_logp" in needs else None
    needs_prox = "prox_logp" in needs
    needs_old = "old_logp" in needs
    needs_ent = "entropy" in needs
    chunks = torch.arange(n_rows).chunk(cfg.mini_batches)

    rewards = [expected_reward(theta, task)]
    curves: dict[str, list[float]] = {}
    seed_ess_steps: list[Tensor] = []
    seed_ess_all: list[Tensor] = []

    def add(key: str, value: float) -> None:
        curves.setdefault(key, []).append(value)

    for _k in range(cfg.steps):
        theta_b = history[0]
        u = torch.stack([torch.rand((p_n, g_n, t_len), generator=g) for g in gens[STREAM_SAMPLE]])
        eps = torch.stack([torch.randn(table_shape, generator=g) for g in gens[STREAM_NOISE]])
        samp, rec = engine_logits(theta_b, cfg, eps)
        batch = sample_batch(samp, rec, task, g_n, u)
        adv, _ = group_advantages(batch.rewards.reshape(-1), batch.group_ids.reshape(-1), **cfg.advantage)
        adv = adv.reshape(s_n, n_rows)
        step_diag: dict[str, list[Tensor]] = {}
        step_obj: dict[str, list[Tensor]] = {}
        gnorms = []
        for _e in range(cfg.epochs):
            with torch.no_grad():
                snap = token_logp(torch.log_softmax(theta, -1), batch) if (needs_prox or needs_old) else None
                if _e == 0:
                    old_all = snap
            perm = torch.stack([torch.randperm(n_rows, generator=g) for g in gens[STREAM_PERM]])
            for chunk in chunks:
                rows = perm[:, chunk]
                th = theta.detach().requires_grad_(True)
                log_pi = torch.log_softmax(th, -1)
                logp = token_logp(log_pi, batch, rows)
                roll = _rows(batch.rollout_logp, rows)
                loss, st = objective_loss(
                    cfg.objective,
                    cfg.hyper,
                    logp,
                    roll,
                    _rows(adv, rows),
                    prox_logp=None if not needs_prox else _rows(snap, rows),
                    old_logp=None if not needs_old else _rows(old_all, rows),
                    ref_logp=None if ref_log_pi is None else token_logp(ref_log_pi, batch, rows),
                    entropy=None if not needs_ent else _entropy_table(log_pi, batch, rows),
                )
                (grad,) = torch.autograd.grad(loss, th)
                theta, gn = opt.step(theta.detach(), grad)
                history.append(theta.clone())
                if cfg.save_params:
                    saved.append(theta.clone())
                gnorms.append(gn)
                for key, val in batch_diagnostics(logp.detach() - roll).items():
                    step_diag.setdefault(key, []).append(val)
                for key, val in st.items():
                    step_obj.setdefault(key, []).append(val)
        with torch.no_grad():
            rewards.append(expected_reward(theta, task))
        ess_u = torch.stack(step_diag["ess"], 1)  # (S, updates)
        seed_ess_steps.append(ess_u.mean(1))
        seed_ess_all.append(ess_u)
        add("ess", float(ess_u.mean()))
        add("ess_p10", float(torch.quantile(ess_u.flatten(), 0.1)))
        add("kl_weight", float(1 - ess_u.mean()))
        for key in ("m_mean", "m_above_0.5", "m_below_0.1", "clip_0.2"):
            add(key, float(torch.stack(step_diag[key]).mean()))
        add("batch_reward", float(batch.rewards.mean()))
        add("grad_norm", float(torch.stack(gnorms).mean()))
        for key, vals in step_obj.items():
            add(f"obj_{key}", float(torch.stack(vals).mean()))

    rew = torch.stack(rewards)  # (K+1, S)
    ess_seed = torch.stack(seed_ess_steps)  # (K, S)
    ess_full = torch.cat(seed_ess_all, 1) if seed_ess_all else torch.ones(s_n, 1)  # (S, U)
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
    curves = {"reward": [float(x) for x in rew.mean(1)], **curves}
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
        "seeds": seeds,
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
        out["params"] = saved
        out["task"] = task
    return out


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x
