"""The synthetic room: a second instrument next to the LM grid. Its modules, one job each:

- :mod:`~p3o.experiments.synthetic.config`: the run settings (:class:`SyntheticConfig`) and the regime /
  objective spec parsers;
- :mod:`~p3o.experiments.synthetic.env`: the toy policy's task, initial table, exact J(θ) and exact divergences;
- :mod:`~p3o.experiments.synthetic.sampler`: the rollout engine (noise, temperature) and batch sampling;
- :mod:`~p3o.experiments.synthetic.losses`: the real objectives applied per seed, and batch diagnostics;
- :mod:`~p3o.experiments.synthetic.train`: the training loop over S seeds at once;
- :mod:`~p3o.experiments.synthetic.study`: declared studies (cells, verdicts, report) for ``p3o compare``;
- :mod:`~p3o.experiments.synthetic.cli`: ``p3o synthetic``, cells from the command line.

Synthetic instrument: a TABULAR AUTOREGRESSIVE TOY policy (not a language model) with an exact expected reward.

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
:data:`p3o.experiments.grid.regimes.REGIMES` means what it means to ``p3o train``, see :func:`regime_knobs`):

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
        --out runs/synthetic.json --csv runs/synthetic.csv         # the grid CLI: p3o.experiments.synthetic.cli
"""

from p3o.experiments.synthetic.config import SyntheticConfig, parse_objective, parse_regime, regime_knobs
from p3o.experiments.synthetic.env import Task, context_divergences, expected_reward, init_params, make_task
from p3o.experiments.synthetic.losses import batch_diagnostics, objective_loss
from p3o.experiments.synthetic.sampler import Batch, engine_logits, sample_batch, token_logp
from p3o.experiments.synthetic.train import run_synthetic

__all__ = [
    "Batch",
    "SyntheticConfig",
    "Task",
    "batch_diagnostics",
    "context_divergences",
    "engine_logits",
    "expected_reward",
    "init_params",
    "make_task",
    "objective_loss",
    "parse_objective",
    "parse_regime",
    "regime_knobs",
    "run_synthetic",
    "sample_batch",
    "token_logp",
]
