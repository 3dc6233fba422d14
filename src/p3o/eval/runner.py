"""Evaluation, in one place: sample n completions per prompt with a rollout engine, verify them, summarise.

Usage:

    result = evaluate(model, tokenizer, load_task("arithmetic", "test", n=200), n_samples=8, ks=(1, 2, 4, 8))
    result.pass_at_k[1], result.mean_response_len, result.truncation_rate
    heldout_metrics(policy, tok, prompt_ids, answers, "exact-int", seed=0)  # {"eval_accuracy", "eval_score"}
    policy_dir, run_dir = find_run("runs/mine")     # runs/mine/final and runs/mine (its config.yaml)

`sample_batches` is the one sampler: `evaluate` (``p3o eval``), `heldout_metrics` (the training loop's held-out
pass@1) and the warm start's pass@1 (`p3o.train.sft.pass_at_1`) all draw their completions through it.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from p3o.envs import EnvLimits, Renderer, make_env, stop_ids
from p3o.envs.render import default_mode
from p3o.envs.runner import run_episodes
from p3o.errors import ConfigError
from p3o.eval.passk import mean_pass_at_k
from p3o.models import load_policy
from p3o.models.checkpoints import latest_checkpoint
from p3o.rewards import get_verifier, make_reward_fn, score
from p3o.rollout.factory import make_engine
from p3o.rollout.settings import EngineSettings
from p3o.tasks import default_verifier, format_prompt, load_task
from p3o.tasks.mixture import TASK_KEY, eval_task_metrics

if TYPE_CHECKING:
    from torch import Tensor, nn

    from p3o.rollout.base import RolloutEngine
    from p3o.types import Rollouts


EVAL_ENGINE = EngineSettings(device="auto")
"""`evaluate`'s default engine: hf, fp32, temperature 1, 64 new tokens, seed 0, cuda when available."""


@dataclass
class EvalResult:
    """pass@k and response statistics of one evaluation.

    Attributes:
        pass_at_k: {k: mean over problems of the unbiased pass@k} for every requested k ≤ n_samples.
        mean_reward: mean verifier score over all n_problems × n_samples completions.
        mean_response_len: mean number of valid response tokens per completion.
        truncation_rate: fraction of completions that hit max_new_tokens without a stop token.
        correct: (n_problems,) number of correct samples per problem (score ≥ correct_threshold).
    """

    task: str
    split: str
    n_problems: int
    n_samples: int
    temperature: float
    max_new_tokens: int
    pass_at_k: dict[int, float]
    mean_reward: float
    mean_response_len: float
    truncation_rate: float
    correct: list[int]
    seconds: float
    model: str = ""
    num_params: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (pass@k keys as strings)."""
        d = asdict(self)
        d["pass_at_k"] = {str(k): v for k, v in self.pass_at_k.items()}
        return d


def find_run(model: str | Path) -> tuple[Path, Path | None]:
    """(policy dir, run dir) of `model` when it is a training run, else (model, None).

    A run directory (holds config.yaml) evaluates its final/ (else its latest checkpoint); final/ and
    checkpoints/step_N[/policy] find the run's config.yaml above them. Raises ConfigError for a run without a policy.
    """
    path = Path(model).expanduser()
    if (path / "config.yaml").is_file() and not (path / "config.json").is_file():
        if (path / "final" / "config.json").is_file():
            return path / "final", path
        ckpt = latest_checkpoint(path)
        if ckpt is not None and (ckpt / "policy" / "config.json").is_file():
            return ckpt / "policy", path
        if ckpt is not None and (ckpt / "sharded").is_dir():
            raise ConfigError(
                f"--model: run {path} has no final/ yet and its latest checkpoint {ckpt.name} is sharded "
                "(train.strategy fsdp: torch.distributed.checkpoint shards); finish the run (--resume) to write final/"
            )
        raise ConfigError(f"--model: run {path} has no final/ policy and no checkpoint yet (did training finish?)")
    if (path / "policy" / "config.json").is_file():  # checkpoints/step_N
        path = path / "policy"
    if path.name == "final" and (path.parent / "config.yaml").is_file():
        return path, path.parent
    if path.name == "policy" and path.parent.parent.name == "checkpoints":
        run = path.parent.parent.parent
        if (run / "config.yaml").is_file():
            return path, run
    return path, None


def encode_prompts(texts: Sequence[str], tokenizer: Any) -> list[list[int]]:
    """Token ids of formatted prompts; the template already holds any special tokens, so none are added."""
    return [list(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]


def sample_batches(
    engine: RolloutEngine,
    prompt_ids: Sequence[Sequence[int]],
    answers: Sequence[str],
    n_samples: int,
    *,
    batch_size: int = 64,
    seed: int = 0,
    batch_seed: Callable[[int], int] | None = None,
) -> Iterator[tuple[int, Rollouts]]:
    """The one evaluation sampler: `n_samples` completions of every prompt, `batch_size` prompts per `generate` call.

    Yields ``(lo, rollouts)`` per batch: prompts lo … lo+b−1, with rows grouped (prompt lo+i gives rows
    i·n … i·n+n−1) and ``rollouts.answers`` set. A batch is sampled with seed ``batch_seed(lo)`` when given,
    else ``seed + lo``: a function of the batch's position only, so a result never depends on earlier calls.
    """
    if n_samples < 1:
        raise ConfigError(f"--n-samples: must be ≥ 1, got {n_samples}")
    for lo in range(0, len(prompt_ids), batch_size):
        ids = [list(p) for p in prompt_ids[lo : lo + batch_size]]
        s = batch_seed(lo) if batch_seed is not None else seed + lo
        yield lo, engine.generate(ids, n_samples, seed=s, answers=list(answers[lo : lo + batch_size]))


def heldout_metrics(
    policy: nn.Module,
    tokenizer: Any,
    prompt_ids: Sequence[Sequence[int]],
    answers: Sequence[str],
    reward: str | Callable[[Rollouts], Tensor],
    *,
    n_samples: int = 1,
    seed: int = 0,
    batch_seed: Callable[[int], int] | None = None,
    engine: str | EngineSettings | Callable[[nn.Module], RolloutEngine] = "hf",
    batch_size: int = 64,
    timeout_s: float = 1.0,
    tasks: Sequence[int] | None = None,
    task_names: Sequence[str] = (),
    on_batch: Callable[[int, Rollouts, Tensor], None] | None = None,
) -> dict[str, float]:
    """Held-out pass@1 of `policy` as the training loop logs it: ``{"eval_accuracy", "eval_score"}``.

    eval_accuracy = (1/M) Σ_j 1[s_j > 0.5] and eval_score = (1/M) Σ_j s_j over the M = len(prompt_ids) · n_samples
    completions, s_j their rewards; ``{}`` when there are no prompts.

    Args:
        policy: the model to sample from (the engine works on its own copy; with LoRA pass the merged model).
        prompt_ids: token ids of the formatted prompts, one list per problem; answers: their reference answers.
        reward: a verifier name (`p3o.rewards.make_reward_fn`, time limit `timeout_s`) or
            ``reward_fn(rollouts) -> (N,)`` (the training loop's own).
        engine: the engine settings (`p3o.rollout.settings.EngineSettings`), an engine kind (its default settings
            with `seed`, on device "auto"), or a factory ``make_engine(policy) -> engine`` (the loop's
            ``Components.make_engine``: the held-out engine then samples exactly as the rollout engine does).
        seed, batch_seed: the batch seeds of `sample_batches`.
        tasks, task_names: a task mixture's task of every prompt and the tasks' names (`p3o.tasks.mixture`): each
            row carries its task (``extras["task"]``, which the mixture's reward function reads), and
            ``task/<name>/eval_accuracy`` is added per task.
        on_batch: called with ``(lo, rollouts, scores)`` for every batch (prompts lo …, its rows, their (rows,)
            rewards): what `p3o eval` tallies per problem beside these numbers (`p3o.eval.harness`).
    """
    if not prompt_ids:
        return {}
    assert tasks is None or len(tasks) == len(prompt_ids), (len(tasks), len(prompt_ids))
    reward_fn = make_reward_fn(reward, timeout_s=timeout_s) if isinstance(reward, str) else reward
    if isinstance(engine, str):
        engine = EngineSettings(engine=engine, seed=seed, device="auto")
    sampler = make_engine(engine, policy, tokenizer) if isinstance(engine, EngineSettings) else engine(policy)
    batches = sample_batches(
        sampler, prompt_ids, answers, n_samples, batch_size=batch_size, seed=seed, batch_seed=batch_seed
    )
    scores, row_tasks = [], []
    for lo, r in batches:
        if tasks is not None:  # rows grouped by prompt: prompt lo + i gives rows i·n … i·n + n − 1
            t = torch.tensor(list(tasks[lo : lo + len(r) // n_samples]), dtype=torch.float32)
            r.extras[TASK_KEY] = t.repeat_interleave(n_samples).to(r.rewards.device)
            row_tasks.append(r.extras[TASK_KEY].cpu())
        scores.append(reward_fn(r).float())
        if on_batch is not None:
            on_batch(lo, r, scores[-1])
    s = torch.cat(scores)
    acc, mean = torch.stack([(s > 0.5).float().mean(), s.mean()]).tolist()
    per_task = eval_task_metrics(task_names, torch.cat(row_tasks), s) if tasks is not None else {}
    return {"eval_accuracy": acc, "eval_score": mean, **per_task}


def _check_eval_args(problems: Sequence[Any], n_samples: int, ks: Sequence[int]) -> None:
    """One-line errors, naming the option, for an evaluation that cannot run."""
    if not problems:
        raise ConfigError("eval: the task gave no problems (check --task / --split / --n-problems)")
    if n_samples < 1:
        raise ConfigError(f"--n-samples: must be ≥ 1, got {n_samples}")
    bad = [k for k in ks if k < 1]
    if bad:
        raise ConfigError(f"--k: values must be ≥ 1, got {bad}")


def _verifier(name: str, cache: dict[str, Callable[[str, str], float]]) -> Callable[[str, str], float]:
    """The verifier called `name`, built once per evaluation (`cache`); an unknown name is a `--verifier` error."""
    if name not in cache:
        try:
            cache[name] = get_verifier(name)
        except ConfigError as err:
            raise ConfigError(f"--verifier: {err}") from None
    return cache[name]


def evaluate(
    model: Any,
    tokenizer: Any,
    problems: Sequence[Any],
    sampling: EngineSettings = EVAL_ENGINE,
    *,
    n_samples: int = 8,
    ks: Sequence[int] = (1, 2, 4, 8),
    verifier: str | None = None,
    template: str = "default",
    system_prompt: str | None = None,
    batch_prompts: int = 16,
    timeout_s: float = 1.0,
    correct_threshold: float = 1.0,
    task: str = "",
    split: str = "",
    progress: Callable[[int, int], None] | None = None,
    **engine_fields: Any,
) -> EvalResult:
    """Sample `n_samples` completions per problem with a rollout engine, score them, estimate pass@k.

    Args:
        problems: `p3o.tasks.Problem`s; the verifier is `verifier` or each problem's meta["verifier"] (a name for
            `p3o.rewards.get_verifier`, including your own "package.module:function").
        sampling: the rollout engine's settings (`p3o.rollout.settings.EngineSettings`: engine "hf" or "vllm",
            precision, temperature, top_p, max_new_tokens, device, seed; its seed is also the batches' seed base);
            default `EVAL_ENGINE` (hf, fp32, T = 1, 64 new tokens, device "auto": cuda when available).
        engine_fields: fields of `sampling` given as keywords (``temperature=0.7, engine="vllm"``), laid over it.
        ks: the k of pass@k; values above n_samples are dropped.
        template, system_prompt: how each prompt is formatted (`p3o.tasks.format_prompt`), as in training.
        batch_prompts: prompts per `generate` call (each gives n_samples rows).
        correct_threshold: a completion is correct when its score ≥ this.
        progress: called with (problems done, total) after each batch.
    """
    counting = Counting(n_samples, tuple(ks), batch_prompts, correct_threshold, task, split, progress)
    tally = Tally(problems, counting)
    sampling = dataclasses.replace(sampling, **engine_fields)
    sampler = make_engine(sampling, model, tokenizer)
    verifiers: dict[str, Callable[[str, str], float]] = {}
    prompt_ids = encode_prompts(
        [format_prompt(p, tokenizer, template, system=system_prompt) for p in problems], tokenizer
    )
    answers = [p.answer for p in problems]
    batches = sample_batches(sampler, prompt_ids, answers, n_samples, batch_size=batch_prompts, seed=sampling.seed)
    for lo, rollouts in batches:
        scores = []  # (problems of the batch, n_samples)
        for i, p in enumerate(problems[lo : lo + batch_prompts]):
            check = _verifier(verifier or default_verifier(task, [p]), verifiers)
            texts = rollouts.texts[i * n_samples : (i + 1) * n_samples]
            scores.append([float(x) for x in score(texts, [p.answer] * n_samples, check, timeout_s=timeout_s)])
        tally.add(lo, np.asarray(scores, dtype=np.float64), rollouts.mask.sum(dim=1), rollouts.truncated)
    return tally.result(model, sampling.temperature, sampling.max_new_tokens)


@dataclass(frozen=True)
class Counting:
    """How an evaluation counts: `n_samples` per problem, the `ks` of pass@k (those above n_samples are dropped),
    `batch_prompts` problems per batch, a sample solves when its reward ≥ `correct_threshold`; `task` and `split`
    name the data in the result; `progress` is called with (problems done, total) after each batch."""

    n_samples: int = 8
    ks: tuple[int, ...] = (1, 2, 4, 8)
    batch_prompts: int = 16
    correct_threshold: float = 1.0
    task: str = ""
    split: str = ""
    progress: Callable[[int, int], None] | None = None


class Tally:
    """An evaluation's counts, filled batch by batch: solves per problem, and per sample (a completion or an episode)
    its reward, response length (tokens) and truncation, plus per-row statistics (``extras``, averaged).

        tally = Tally(problems, Counting(n_samples=4, ks=(1, 2, 4)))  # one-line errors for what cannot run
        tally.add(lo, rewards, lengths, truncated)                    # rewards: (problems of the batch, n_samples)
        result = tally.result(model, temperature, max_new_tokens)
    """

    def __init__(self, problems: Sequence[Any], counting: Counting) -> None:
        _check_eval_args(problems, counting.n_samples, counting.ks)
        self.counting, self.n_problems, self.n_samples = counting, len(problems), counting.n_samples
        self.start = time.perf_counter()
        self.correct = np.zeros(len(problems), dtype=np.int64)
        self.rewards: list[float] = []
        self.lengths: list[float] = []
        self.truncated: list[bool] = []
        self.stats: dict[str, list[float]] = {}

    def add(
        self, lo: int, rewards: Any, lengths: Any, truncated: Any, extras: dict[str, Tensor] | None = None
    ) -> None:
        """One batch: problems lo … lo + b − 1 with their (b, n_samples) `rewards` (array or tensor), every row's
        response length and truncation flag, and its per-row `extras` (agent-episode statistics)."""
        r = torch.as_tensor(np.asarray(rewards, dtype=np.float64) if not torch.is_tensor(rewards) else rewards)
        r = r.double().cpu().reshape(-1, self.n_samples)
        self.correct[lo : lo + len(r)] = (r >= self.counting.correct_threshold).sum(-1).numpy()
        self.rewards += r.flatten().tolist()
        self.lengths += torch.as_tensor(lengths).float().tolist()
        self.truncated += torch.as_tensor(truncated).bool().tolist()
        for k, v in (extras or {}).items():
            self.stats.setdefault(k, []).extend(v.float().tolist())
        if self.counting.progress is not None:
            self.counting.progress(lo + len(r), self.n_problems)

    def result(self, model: Any, temperature: float, max_new_tokens: int) -> EvalResult:
        """The `EvalResult` so far (pass@k of the solve counts; the samples' means), timed from the tally's start;
        per-row statistics, when any, as ``extra["episode"]`` (their means)."""
        ks = sorted(set(self.counting.ks))
        result = EvalResult(
            task=self.counting.task,
            split=self.counting.split,
            n_problems=self.n_problems,
            n_samples=self.n_samples,
            temperature=temperature,
            max_new_tokens=max_new_tokens,
            pass_at_k=mean_pass_at_k(np.full(self.n_problems, self.n_samples), self.correct, ks),
            mean_reward=_mean(self.rewards),
            mean_response_len=_mean(self.lengths),
            truncation_rate=_mean(self.truncated),
            correct=self.correct.tolist(),
            seconds=time.perf_counter() - self.start,
            num_params=sum(p.numel() for p in model.parameters()),
        )
        if self.stats:
            result.extra["episode"] = {k: _mean(v) for k, v in self.stats.items()}
        return result


def evaluate_episodes(
    model: Any,
    tokenizer: Any,
    problems: Sequence[Any],
    sampling: EngineSettings = EVAL_ENGINE,
    *,
    env: str,
    env_kwargs: dict[str, Any] | None = None,
    limits: Any = None,
    counting: Counting = Counting(),
) -> EvalResult:
    """pass@k of full agent episodes: ``counting.n_samples`` episodes of environment `env` per problem, each scored
    by the environment (its return ≥ ``counting.correct_threshold`` is a solve); `evaluate`'s result, with the
    episodes' statistics in ``extra["episode"]`` (turns, tool calls, tool errors, observation share … per episode,
    as in training).

    Args:
        env: a built-in environment name or ``package.module:Name`` (`p3o.envs.make_env`), made with
            `env_kwargs`.
        limits: `p3o.envs.EnvLimits` (``agent.*``; default: its defaults); the renderer and stop ids are the
            training run's (`p3o.envs.render`).
        counting: samples per problem, the k of pass@k, problems per batch … (`Counting`).
    """
    tally = Tally(problems, counting)
    n_samples, batch_prompts = counting.n_samples, counting.batch_prompts
    limits = limits or EnvLimits()
    options = dict(env_kwargs or {})
    probe = make_env(env, limits=limits, **options)
    stops = stop_ids(tokenizer, tuple(probe.stop_strings), env)
    renderer = Renderer(
        tokenizer,
        mode=default_mode(tokenizer, probe),
        max_obs_tokens=limits.max_obs_tokens,
        tools=getattr(probe, "tools", None),
    )
    probe.close()
    engine = make_engine(sampling, model, tokenizer, stop_token_ids=stops)
    for lo in range(0, len(problems), batch_prompts):
        part = list(problems[lo : lo + batch_prompts])
        ro = run_episodes(
            engine,
            lambda: make_env(env, limits=limits, **options),  # the run's environment, with its keywords
            part,
            n_samples,
            renderer=renderer,
            limits=limits,
            seed=sampling.seed * 1_000_003 + lo,
            eos_ids=[tokenizer.eos_token_id],
            stop_ids=stops,
        )
        tally.add(lo, ro.rewards.view(len(part), n_samples), ro.mask.sum(-1), ro.truncated, ro.extras)
    return tally.result(model, sampling.temperature, limits.max_turn_tokens)


def _mean(values: Sequence[float]) -> float:
    """The mean of `values` as a float, NaN when there are none."""
    return float(np.mean(values)) if len(values) else math.nan


def evaluate_checkpoint(
    model_path: str,
    task: str = "arithmetic",
    split: str = "test",
    *,
    n_problems: int | None = None,
    task_kwargs: dict[str, Any] | None = None,
    **kwargs: Any,
) -> EvalResult:
    """Load a policy with `p3o.models.load_policy` and a task with `p3o.tasks.load_task`, then `evaluate`."""
    model, tokenizer = load_policy(model_path)
    problems = load_task(task, split, n=n_problems, **(task_kwargs or {}))
    result = evaluate(model, tokenizer, problems, task=task, split=split, **kwargs)
    result.model = str(model_path)
    return result
