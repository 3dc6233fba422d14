"""Task mixtures (``task.mixture``): several single-turn tasks in one run, each drawn with its sampling weight, scored
by its own verifier and reported under its own name.

    mix = load_mixture(cfg.task, seed=cfg.seed)         # every task's problems, verifier and label; the weighted pool
    prompts = [encoded[k][j] for k, j in mix.pool]      # the run's prompt list: task k fills a share w_k of it
    reward_fn = mix.reward_fn(timeout_s=1.0)            # row i scored by the verifier of task extras["task"][i]
    info |= task_metrics(mix.names, tasks, rewards, score_tasks, scores)   # task/<name>/reward_mean, accuracy, share

The pool. The run's prompt list holds L slots, c_k of them task k's: c_k = w_k·L by largest remainders, with
L = ⌈max_k n_k / w_k⌉ over the tasks of weight w_k > 0 (n_k problems), so every problem of a sampled task fills at
least one slot (a task's slots go round its problems in order), capped at `POOL_CAP` slots. `p3o.train.sources.
PromptStream` walks permutations of the slots as it walks any prompt list: every epoch of the stream draws exactly
c_k of its L prompts from task k, and batch b is still a pure function of (seed, b, round, rank) (resume-safe). A
task of weight 0 fills no slot: it is evaluated, never trained on.

Every row keeps its task: `Rollouts.extras[TASK_KEY]` (float task index), set by the producer from the slot and by
the held-out evaluation from the prompt; the reward function and the per-task metrics read it.
"""

from __future__ import annotations

import copy
import difflib
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from p3o.errors import ConfigError, DataError, P3OError
from p3o.rewards import make_reward_fn
from p3o.tasks.base import Problem
from p3o.tasks.calc import load_calc
from p3o.tasks.loaders import PRESETS
from p3o.tasks.sources import BUILTIN, load_eval_problems, load_train_problems, task_verifier
from p3o.types import Rollouts

TASK_KEY = "task"
"""`Rollouts.extras` key of a row's task index (float32) in a mixture run."""
CALC = "calc"
"""The calc problems (`p3o.tasks.calc.load_calc`), a mixture entry besides what ``task.name`` accepts."""
POOL_CAP = 1 << 20
"""Most slots of the weighted pool (a tiny weight on a large task would otherwise ask for millions)."""


def mixture_entries(mixture: Sequence[str]) -> list[tuple[str, float]]:
    """[(task name, weight)] of a validated ``task.mixture`` (["name:weight", ...]: the name is all before the last
    ``:``)."""
    return [(name, float(w)) for name, _, w in (str(e).rpartition(":") for e in mixture)]


def task_labels(names: Sequence[str]) -> list[str]:
    """The metric label of each task: its name for a built-in task or a preset (``gsm8k:path`` → gsm8k), a data path's
    file stem; characters other than letters, digits, ``_ . -`` become ``_``; a repeated label gets ``_2``, ``_3``."""
    out: list[str] = []
    for name in names:
        head = name.partition(":")[0]
        base = head if head in PRESETS or name in (BUILTIN, CALC) else Path(name.rstrip("/")).stem
        label = re.sub(r"[^A-Za-z0-9_.-]+", "_", base).strip("_") or "task"
        unique, i = label, 2
        while unique in out:
            unique, i = f"{label}_{i}", i + 1
        out.append(unique)
    return out


def check_mixture(task: Any, env: str | None = None) -> None:
    """Refuse (one-line ConfigError naming ``task.mixture``) the settings a mixture cannot honour: an agent
    environment `env` (``agent.env``: episodes are not mixed with single-turn rows yet), a ``task.name`` other than
    the default (the mixture names the tasks), one ``task.verifier`` or ``task.eval_name`` for all tasks (each has
    its own)."""
    if env:
        raise ConfigError(
            f"task.mixture: mixes single-turn tasks only; agent.env {env!r} episodes cannot be mixed yet "
            "(unset agent.env or task.mixture)"
        )
    if task.name != BUILTIN:
        raise ConfigError(
            f"task.mixture: the mixture names the tasks; task.name {task.name!r} would be ignored (list it in "
            "task.mixture and leave task.name unset)"
        )
    for key, what in (("verifier", "scored by its own verifier"), ("eval_name", "evaluated on its own held-out rows")):
        if getattr(task, key, None):
            raise ConfigError(
                f"task.mixture: each task is {what}; task.{key} {getattr(task, key)!r} does not apply (unset it)"
            )


def _check_name(name: str) -> None:
    """An unknown task name: one line with the nearest known name."""
    known = [BUILTIN, CALC, *PRESETS]
    if name in (BUILTIN, CALC) or name.partition(":")[0] in PRESETS or Path(name).expanduser().exists():
        return
    near = difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    raise ConfigError(
        f"task.mixture: unknown task {name!r}{hint}; known: {', '.join(known)}, or a data file or folder"
    )


def _entry_task(task: Any, name: str) -> Any:
    """The task settings of one entry: ``task`` with its name; a built-in task takes no field keys."""
    sub = copy.copy(task)
    sub.name, sub.mixture = name, None
    if name in (BUILTIN, CALC):
        sub.question_key = sub.answer_key = sub.solution_key = None
    return sub


def _entry_problems(task: Any, name: str, seed: int) -> tuple[list[Problem], list[Problem], str]:
    """(training problems, held-out problems, verifier name) of one entry (``task.n_train`` / ``task.n_eval`` each)."""
    _check_name(name)
    sub = _entry_task(task, name)
    n_eval = int(getattr(task, "n_eval", 0) or 0)
    try:
        if name == CALC:
            train = load_calc("train", seed=seed, n=task.n_train)
            held_out = load_calc("test", seed=seed, n=n_eval) if n_eval > 0 else []
        else:
            train = load_train_problems(sub, seed=seed, n=task.n_train)
            held_out = load_eval_problems(sub, seed=seed, n=n_eval, train=train) if n_eval > 0 else []
        return train, held_out, task_verifier(sub, train)
    except (ConfigError, DataError) as err:
        message = re.sub(r"^task\.\w+: ", "", str(err))
        raise ConfigError(f"task.mixture: {name!r}: {message}") from None


def build_pool(sizes: Sequence[int], weights: Sequence[float], cap: int = POOL_CAP) -> list[tuple[int, int]]:
    """The weighted pool: [(task k, problem j)] slots, c_k of them task k's (largest remainders of w_k·L, L =
    ⌈max n_k / w_k⌉ over w_k > 0, at most `cap`; every task of weight > 0 gets ≥ 1), j = i·n_k // c_k for its
    i-th slot (its problems in order, each as often as the others ± 1). Weights need not be normalised."""
    assert len(sizes) == len(weights), (len(sizes), len(weights))
    total = float(sum(weights))
    assert total > 0, weights
    share = [w / total for w in weights]
    active = [k for k, w in enumerate(share) if w > 0 and sizes[k] > 0]
    if not active:
        return []
    length = min(cap, max(math.ceil(sizes[k] / share[k] - 1e-9) for k in active))
    raw = {k: share[k] * length for k in active}
    counts = {k: math.floor(raw[k]) for k in active}
    for k in sorted(active, key=lambda k: (counts[k] - raw[k], k))[: length - sum(counts.values())]:
        counts[k] += 1
    for k in active:
        counts[k] = max(counts[k], 1)
    return [(k, i * sizes[k] // counts[k]) for k in active for i in range(counts[k])]


class MixtureReward:
    """``reward_fn(rollouts) -> (N,) float32``: row i scored by the reward function of task ``extras["task"][i]``."""

    def __init__(self, fns: Sequence[Callable[[Rollouts], Tensor]]) -> None:
        self.fns = list(fns)

    def __call__(self, r: Rollouts) -> Tensor:
        tasks = r.extras.get(TASK_KEY)
        if tasks is None:
            raise P3OError("task.mixture: rows without their task (Rollouts.extras['task']); the verifier is unknown")
        tasks = tasks.detach().cpu().long()
        out = torch.zeros(len(r), dtype=torch.float32)
        for k, fn in enumerate(self.fns):
            rows = (tasks == k).nonzero().flatten()
            if len(rows):
                out[rows] = fn(r.select(rows)).float().cpu()
        return out


@dataclass
class Mixture:
    """Every task of a mixture run (`load_mixture`).

    Attributes:
        names: metric label of each task (`task_labels`): ``task/<name>/...``.
        entries: the task names as ``task.mixture`` gives them; weights: normalised (sum 1).
        verifiers: the verifier name scoring each task (`p3o.tasks.task_verifier`).
        problems, eval_problems: training / held-out problems of each task.
        pool: the run's prompt list as [(task, problem)] slots (`build_pool`).
        slot_task: the task of every slot; eval_task: the task of every held-out problem, tasks in order.
    """

    names: list[str]
    entries: list[str]
    weights: list[float]
    verifiers: list[str]
    problems: list[list[Problem]]
    eval_problems: list[list[Problem]]
    pool: list[tuple[int, int]] = field(default_factory=list)
    slot_task: list[int] = field(init=False)
    eval_task: list[int] = field(init=False)

    def __post_init__(self) -> None:
        if not self.pool:
            self.pool = build_pool([len(p) for p in self.problems], self.weights)
        self.slot_task = [k for k, _ in self.pool]
        self.eval_task = [k for k, ps in enumerate(self.eval_problems) for _ in ps]

    def row_tasks(self, slots: Sequence[int], group_size: int) -> Tensor:
        """(len(slots) · G,) float32: the task of every row of a batch of prompt `slots`, G rows per prompt."""
        tasks = torch.tensor([self.slot_task[i] for i in slots], dtype=torch.float32)
        return tasks.repeat_interleave(group_size)

    def reward_fn(self, timeout_s: float = 1.0) -> MixtureReward:
        """Rewards by each row's own task verifier (each resolved now: a bad one fails before any model loads)."""
        return MixtureReward(
            [
                make_reward_fn(v, timeout_s=timeout_s, option=f"task.mixture {n!r} verifier")
                for n, v in zip(self.names, self.verifiers)
            ]
        )

    def describe(self) -> str:
        """One line: each task's weight, problems and verifier."""
        return "task mixture: " + "; ".join(
            f"{n} {w:.3g} ({len(p)} problems, {len(e)} held out, {v})"
            for n, w, p, e, v in zip(self.names, self.weights, self.problems, self.eval_problems, self.verifiers)
        )


def load_mixture(task: Any, *, seed: int, env: str | None = None) -> Mixture:
    """The mixture of ``task.mixture`` (a TrainConfig's task section; `seed` the run's, `env` its ``agent.env``):
    conflicts refused (`check_mixture`), then every task's problems (``task.n_train`` / ``task.n_eval`` per task; the
    other task settings apply to each where they mean something) and verifier, before any model loads. Errors are one
    line naming ``task.mixture``."""
    check_mixture(task, env)
    entries = mixture_entries(task.mixture)
    problems, held_out, verifiers = [], [], []
    for name, _ in entries:
        train, test, verifier = _entry_problems(task, name, seed)
        problems.append(train)
        held_out.append(test)
        verifiers.append(verifier)
    total = sum(w for _, w in entries)
    return Mixture(
        names=task_labels([n for n, _ in entries]),
        entries=[n for n, _ in entries],
        weights=[w / total for _, w in entries],
        verifiers=verifiers,
        problems=problems,
        eval_problems=held_out,
    )


def _on_cpu(x: Tensor) -> Tensor:
    return x.detach().float().cpu()


def task_metrics(
    names: Sequence[str], tasks: Tensor, rewards: Tensor, score_tasks: Tensor, scores: Tensor
) -> dict[str, float]:
    """Per-task statistics of one training batch.

    ``task/<name>/share`` (its rows / N), ``task/<name>/reward_mean`` (mean reward of its rows) and
    ``task/<name>/accuracy`` (share of its sampled completions with score > 0.5, every generation round) — the last
    two only for a task with rows in this batch.

    Args:
        tasks, rewards: (N,) the batch's task indices and rewards; score_tasks, scores: (M,) the same for every
            completion sampled for the batch (M ≥ N under dynamic sampling).
    """
    assert tasks.shape == rewards.shape and score_tasks.shape == scores.shape, (tasks.shape, score_tasks.shape)
    tasks, rewards, score_tasks, scores = map(_on_cpu, (tasks, rewards, score_tasks, scores))
    out: dict[str, float] = {}
    for k, name in enumerate(names):
        rows, sampled = tasks == k, score_tasks == k
        out[f"task/{name}/share"] = float(rows.float().mean()) if len(rows) else 0.0
        if rows.any():
            out[f"task/{name}/reward_mean"] = float(rewards[rows].mean())
        if sampled.any():
            out[f"task/{name}/accuracy"] = float((scores[sampled] > 0.5).float().mean())
    return out


def eval_task_metrics(names: Sequence[str], tasks: Tensor, scores: Tensor) -> dict[str, float]:
    """``task/<name>/eval_accuracy``: held-out pass@1 of each task with held-out rows ((M,) task indices, scores)."""
    assert tasks.shape == scores.shape, (tasks.shape, scores.shape)
    tasks, scores = _on_cpu(tasks), _on_cpu(scores)
    return {
        f"task/{name}/eval_accuracy": float((scores[tasks == k] > 0.5).float().mean())
        for k, name in enumerate(names)
        if (tasks == k).any()
    }


__all__ = [
    "CALC",
    "POOL_CAP",
    "TASK_KEY",
    "Mixture",
    "MixtureReward",
    "build_pool",
    "check_mixture",
    "eval_task_metrics",
    "load_mixture",
    "mixture_entries",
    "task_labels",
    "task_metrics",
]
