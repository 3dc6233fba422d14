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
    _check_eval_args(problems, n_samples, ks)
    start = time.perf_counter()
    sampling = dataclasses.replace(sampling, **engine_fields)
    seed = sampling.seed
    sampler = make_engine(sampling, model, tokenizer)
    verifiers: dict[str, Callable[[str, str], float]] = {}
    correct = np.zeros(len(problems), dtype=np.int64)
    rewards: list[float] = []
    lengths: list[int] = []
    truncated: list[bool] = []  # per completion: hit max_new_tokens without an end token
    prompt_ids = encode_prompts(
        [format_prompt(p, tokenizer, template, system=system_prompt) for p in problems], tokenizer
    )
    answers = [p.answer for p in problems]
    for lo, rollouts in sample_batches(sampler, prompt_ids, answers, n_samples, batch_size=batch_prompts, seed=seed):
        for i, p in enumerate(problems[lo : lo + batch_prompts]):
            check = _verifier(verifier or default_verifier(task, [p]), verifiers)
            texts = rollouts.texts[i * n_samples : (i + 1) * n_samples]
            scores = [float(x) for x in score(texts, [p.answer] * n_samples, check, timeout_s=timeout_s)]
            rewards += scores
            correct[lo + i] = sum(1 for x in scores if x >= correct_threshold)
        lengths += rollouts.mask.sum(dim=1).tolist()
        truncated += rollouts.truncated.tolist()
        if progress is not None:
            progress(min(lo + batch_prompts, len(problems)), len(problems))
    return _result(
        model, task, split, n_samples, sampling.temperature, sampling.max_new_tokens, ks, correct,
        (rewards, lengths, truncated), start,
    )  # fmt: skip


def _result(
    model: Any,
    task: str,
    split: str,
    n_samples: int,
    temperature: float,
    max_new_tokens: int,
    ks: Sequence[int],
    correct: np.ndarray,
    samples: tuple[list[float], list[float], list[bool]],
    start: float,
) -> EvalResult:
    """The `EvalResult` of `correct` (per problem) and the samples' (rewards, lengths, truncated), since `start`."""
    rewards, lengths, truncated = samples
    return EvalResult(
        task=task,
        split=split,
        n_problems=len(correct),
        n_samples=n_samples,
        temperature=temperature,
        max_new_tokens=max_new_tokens,
        pass_at_k=mean_pass_at_k(np.full(len(correct), n_samples), correct, sorted(set(ks))),
        mean_reward=_mean(rewards),
        mean_response_len=_mean(lengths),
        truncation_rate=_mean(truncated),
        correct=correct.tolist(),
        seconds=time.perf_counter() - start,
        num_params=sum(p.numel() for p in model.parameters()),
    )


def evaluate_episodes(
    model: Any,
    tokenizer: Any,
    problems: Sequence[Any],
    sampling: EngineSettings = EVAL_ENGINE,
    *,
    env: str,
    env_kwargs: dict[str, Any] | None = None,
    limits: Any = None,
    n_samples: int = 8,
    ks: Sequence[int] = (1, 2, 4, 8),
    batch_prompts: int = 16,
    correct_threshold: float = 1.0,
    task: str = "",
    split: str = "",
    progress: Callable[[int, int], None] | None = None,
) -> EvalResult:
    """pass@k of full agent episodes: `n_samples` episodes of environment `env` per problem, each scored by the
    environment (its return ≥ `correct_threshold` is a solve); `evaluate`'s result, with the episodes' statistics
    in ``extra["episode"]`` (turns, tool calls, tool errors, observation share … per episode, as in training).

    Args:
        env: a built-in environment name or ``package.module:Name`` (`p3o.envs.make_env`), made with
            `env_kwargs`.
        limits: `p3o.envs.EnvLimits` (``agent.*``; default: its defaults); the renderer and stop ids are the
            training run's (`p3o.envs.render`).
    """
    _check_eval_args(problems, n_samples, ks)
    start = time.perf_counter()
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
    correct = np.zeros(len(problems), dtype=np.int64)
    rewards: list[float] = []
    lengths: list[float] = []
    truncated: list[bool] = []
    stats: dict[str, list[float]] = {}
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
        r = ro.rewards.float().view(len(part), n_samples)
        correct[lo : lo + len(part)] = (r >= correct_threshold).sum(-1).cpu().numpy()
        rewards += r.flatten().tolist()
        lengths += ro.mask.sum(-1).float().tolist()
        truncated += ro.truncated.tolist()
        for k, v in ro.extras.items():
            stats.setdefault(k, []).extend(v.tolist())
        if progress is not None:
            progress(min(lo + batch_prompts, len(problems)), len(problems))
    result = _result(
        model, task, split, n_samples, sampling.temperature, limits.max_turn_tokens, ks, correct,
        (rewards, lengths, truncated), start,
    )  # fmt: skip
    result.extra["episode"] = {k: _mean(v) for k, v in stats.items()}
    return result


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
