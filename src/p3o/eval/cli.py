"""`p3o eval`: pass@k of a policy on held-out problems — of a training run (its own task settings) or any task.

Usage:

    p3o eval --model runs/mine --n-samples 8 --k 1,2,4,8 --out eval.json     # a run dir (or runs/mine/final)
    p3o eval --model runs/default/final --task arithmetic --difficulty 3     # override the run's task
    p3o eval --model tiny --task data/mine.jsonl --question-key q --answer-key a   # no run: held-out rows of a file

Given a run (a directory with config.yaml, its final/, or checkpoints/step_N/policy), the run's task name,
difficulty, eval data, template, system prompt, field mapping, verifier, reward time limit, device and response
budget are the defaults, each overridable by its option; the problems are the run's held-out evaluation problems
(`p3o.tasks.load_eval_problems`, never a training row unless the run allowed it).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from rich.console import Console
from rich.table import Table

import p3o.eval as eval_api  # lazy (PEP 562): its runners load torch when first read, after the options

# light imports only: `--help` and option errors answer before torch or transformers load (issue 47)
from p3o.config import TaskConfig, load_config
from p3o.errors import ConfigError
from p3o.options import config_field as _f
from p3o.options import parse_or_help

_RUN = "null: the run's, else "
_HARNESS = "null: a harness run's in-loop evaluation's "


@dataclass
class EvalOptions:
    """Options of ``p3o eval`` (parsed, typed and documented by the same mechanism as ``p3o train``).

    The task settings left null take the run's own (``--model RUN``), else the defaults of ``p3o train``."""

    model: str = _f(
        "", "a training run dir (or its final/), 'tiny', 'tiny-random', 'smollm2', a local HF dir or a Hub id"
    )
    task: str | None = _f(None, f"evaluation data: 'arithmetic', a preset or a data path ({_RUN}arithmetic)")
    split: str | None = _f(
        None, f"split ({_RUN}test: the held-out rows of a single file, test.jsonl of a folder; 'all': every row)"
    )
    n_problems: int | None = _f(None, "evaluate the first N problems (null: all)", ge=1)
    difficulty: str | None = _f(None, "difficulty of the built-in arithmetic task")
    template: str | None = _f(None, f"prompt template: plain, hash, boxed, short ({_RUN}default)")
    system_prompt: str | None = _f(None, f"system prompt ({_RUN}none)")
    question_key: str | None = _f(None, f"data field of the question ({_RUN}auto)")
    answer_key: str | None = _f(None, f"data field of the reference answer ({_RUN}auto)")
    solution_key: str | None = _f(None, f"data field of the worked solution ({_RUN}auto)")
    test_fraction: float | None = _f(None, f"held-out share of a single file ({_RUN}0.1)", ge=0.0, lt=1.0)
    allow_train_eval_overlap: bool = _f(False, "keep evaluation problems the run trained on")
    verifier: str | None = _f(None, f"verifier name or 'package.module:function' ({_RUN}each problem's own)")
    reward_timeout_s: float | None = _f(None, f"verifier time limit per call in seconds ({_RUN}1.0)", gt=0.0)
    device: str | None = _f(None, f"auto (cuda if available), cpu, cuda ({_RUN}auto)")
    env: str | None = _f(
        None, f"agent environment: run full episodes (calc, guess, package.module:Name) ({_RUN}none: single-turn)"
    )
    n_samples: int | None = _f(None, f"samples per problem (n of pass@k; {_HARNESS}1, else 8)", ge=1)
    k: str | None = _f(None, "comma-separated k values of pass@k, each ≤ n_samples (null: 1, 2, 4, … ≤ n_samples)")
    max_new_tokens: int | None = _f(None, f"generation budget per completion ({_RUN}64)", ge=1)
    temperature: float = _f(1.0, "sampling temperature", ge=0.0)
    top_p: float = _f(1.0, "nucleus sampling mass", gt=0.0, le=1.0)
    precision: str = _f("fp32", "rollout precision: fp32, bf16, fp16, int8, fp8")
    engine: Literal["hf", "vllm"] | None = _f(None, f"rollout engine: hf, vllm ({_RUN}hf)")
    batch_prompts: int | None = _f(None, f"prompts per generation batch ({_HARNESS}64, else 16)", ge=1)
    seed: int | None = _f(None, f"sampling seed ({_HARNESS}seed, else 0)")
    out: str | None = _f(None, "write the result as JSON here")
    quiet: bool = _f(False, "no table, only the JSON file")


USAGE = (
    "usage: p3o eval --model RUN_OR_MODEL [--n_samples N] [--k 1,2,4,8] [--task DATA] [--out JSON] [--key value ...]"
)


def parse_ks(text: str) -> list[int]:
    """``--k 1,2,4`` -> [1, 2, 4]; a one-line ConfigError unless every item is an integer ≥ 1."""
    try:
        ks = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--k: expected comma-separated integers, got {text!r}") from None
    if not ks or min(ks) < 1:
        raise ConfigError(f"--k: expected integers ≥ 1, got {text!r}")
    return ks


def parse_args(argv: list[str]) -> EvalOptions | None:
    """``p3o eval --model M [--option value ...]`` -> validated options (one-line ConfigError on bad input), or None
    after printing ``--help``."""
    args = parse_or_help(argv, EvalOptions, USAGE, "pass@k, response length and truncation rate of a policy on a task")
    if args is None:
        return None
    if not args.model:
        raise ConfigError("--model: required (a training run dir, 'tiny', a local HF dir or a Hub id)")
    if args.k is not None:  # checked against a null --n-samples once the run's defaults are known (`_plan`)
        parse_ks(args.k) if args.n_samples is None else sample_counts(args)
    return args


def sample_counts(args: EvalOptions, *, harness_seed: int | None = None) -> tuple[int, list[int], int, int]:
    """(n_samples, ks, batch_prompts, seed) of the options, their nulls filled: on a harness run (its `harness_seed`
    given) as its in-loop evaluation draws (1 episode per problem, batches of 64, the run's seed), else 8, 16 and 0;
    the k default is 1, 2, 4, … up to n. A k above n: one-line ConfigError."""
    harness = harness_seed is not None
    n = args.n_samples if args.n_samples is not None else (1 if harness else 8)
    ks = parse_ks(args.k) if args.k is not None else [2**i for i in range(n.bit_length()) if 2**i <= n]
    too_big = [k for k in ks if k > n]
    if too_big:
        raise ConfigError(f"--k: {too_big} exceed --n-samples {n}")
    batch = args.batch_prompts if args.batch_prompts is not None else (64 if harness else 16)
    seed = args.seed if args.seed is not None else (harness_seed if harness_seed is not None else 0)
    return n, ks, batch, seed


def print_table(result_dict: dict) -> None:
    """A rich table of one evaluation result."""
    r = result_dict
    table = Table(title=f"{r['task']}/{r['split']}: {r['n_problems']} problems × {r['n_samples']} samples")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for k, v in r["pass_at_k"].items():
        table.add_row(f"pass@{k}", f"{v:.4f}")
    table.add_row("mean reward", f"{r['mean_reward']:.4f}")
    table.add_row("mean response length (tokens)", f"{r['mean_response_len']:.1f}")
    table.add_row("truncation rate", f"{r['truncation_rate']:.3f}")
    if "faults" in r["extra"]:  # agent episodes (a harness run's): how many failed, and why
        failed = {k: v for k, v in r["extra"]["faults"].items() if v}
        table.add_row("failed episodes", ", ".join(f"{k} {v}" for k, v in failed.items()) or "0")
    table.add_row("wall time (s)", f"{r['seconds']:.1f}")
    console = Console()
    console.print(f"model: {r['model']}", soft_wrap=True)
    console.print(table)


def _run_config(run_dir: Path) -> Any:
    """The run's own config (its config.yaml), or a `--model` error naming what could not be read."""
    try:
        return load_config(["--config", str(run_dir / "config.yaml")])
    except ConfigError as err:
        raise ConfigError(f"--model: cannot read the run's config ({err})") from None


def task_settings(args: EvalOptions, run_cfg: Any = None) -> Any:
    """The `TaskConfig` to evaluate with: the run's (else the defaults) with the command-line options laid over it.

    On a run, `--task` names the evaluation data (`task.eval_name`), so the run's training rows stay excluded;
    without a run it is the task itself (a single file: its held-out rows, like training on it would use).
    """

    task = dataclasses.replace(run_cfg.task if run_cfg is not None else TaskConfig())
    if args.task is not None:
        if run_cfg is not None:
            task.eval_name = None if args.task == task.name else args.task
        else:
            task.name = args.task
    overrides = {
        "template": args.template,
        "system_prompt": args.system_prompt,
        "question_key": args.question_key,
        "answer_key": args.answer_key,
        "solution_key": args.solution_key,
        "test_fraction": args.test_fraction,
        "verifier": args.verifier,
        "reward_timeout_s": args.reward_timeout_s,
        "eval_split": args.split,
    }
    for key, value in overrides.items():
        if value is not None:
            setattr(task, key, value)
    if args.allow_train_eval_overlap:
        task.allow_train_eval_overlap = True
    if args.difficulty is not None:
        if (task.eval_name or task.name) != "arithmetic":
            raise ConfigError("--difficulty: only the built-in 'arithmetic' task has a difficulty")
        task.difficulty = int(args.difficulty) if args.difficulty.isdigit() else args.difficulty
    return task


def main(argv: list[str] | None = None) -> int:
    """Run `p3o eval`; returns the exit code (bad options raise ConfigError → exit 2 via p3o.cli)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args is None:
        return 0
    # models.load_policy is looked up at call time (tests replace it); the options are read, so the start-up follows
    # heavy: torch and transformers start-up, not for `--help` or a refused option
    from p3o import models
    from p3o.eval.runner import evaluate, evaluate_episodes, find_run
    from p3o.models.hub import check_model_name

    policy_dir, run_dir = find_run(args.model)
    if run_dir is None:  # a model name or path, not a run: refused in one line before anything loads
        check_model_name(args.model, key="--model")
    run_cfg = _run_config(run_dir) if run_dir is not None else None
    plan = _plan(args, run_cfg, run_dir)  # the problems first: a wrong path or field fails before the model loads
    model_name = str(policy_dir) if run_dir is not None else args.model
    cache_dir = run_cfg.model.cache_dir if run_cfg is not None else None
    model, tokenizer = models.load_policy(model_name, **({"cache_dir": cache_dir} if cache_dir else {}))
    if not args.quiet:
        shown = ", ".join(f"{k} {v!r}" for k, v in plan.settings.items() if v not in (None, {}))
        print(f"p3o eval: {len(plan.problems)} problems; {shown}", file=sys.stderr)
    result = _run(plan, model, tokenizer, evaluate, evaluate_episodes)
    result.model = model_name
    result.extra = {**result.extra, **plan.settings}
    d = result.to_dict()
    if args.out is not None:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(d, indent=2) + "\n")
    if not args.quiet:
        print_table(d)
    return 0


@dataclass
class _Plan:
    """What `p3o eval` evaluates, settled before the model loads: the task section, the problems, the environment
    (None: single-turn), the data's name and split, the engine settings and the settings recorded with the result."""

    task: Any
    problems: list[Any]
    env: str | None
    name: str
    split: str
    sampling: Any
    settings: dict[str, Any]
    limits: Any
    """The episodes' `p3o.envs.EnvLimits` (the run's ``agent.*``, else the defaults)."""
    env_kwargs: dict[str, Any] | None
    counts: tuple[int, list[int], int]
    """(n_samples, ks, batch_prompts): the options, or the defaults of `sample_counts`."""
    agent: Any = None
    """A harness run's ``agent`` section (``agent.harness`` and its limits), else None."""
    model_name: str = ""
    """The name a harness run served its policy under (``model.name``)."""


def _plan(args: EvalOptions, run_cfg: Any, run_dir: Path | None) -> _Plan:
    """The `_Plan` of the options and, when --model names a run, that run's config (its task, seed, agent,
    engine, device and token limit are the defaults the options override)."""
    # heavy: torch, transformers and the task loaders, read only once the options are valid
    from p3o.dist import resolve_device
    from p3o.envs import EnvLimits, env_problems
    from p3o.rollout.settings import EngineSettings
    from p3o.tasks import load_eval_problems, load_train_problems, task_options, task_verifier
    from p3o.tasks.sources import eval_source

    task = task_settings(args, run_cfg)
    data_seed = run_cfg.seed if run_cfg is not None else 0
    agent = run_cfg.agent if run_cfg is not None else None
    env = args.env or (agent.env if agent is not None else None)
    harness = getattr(agent, "harness", None) if not env else None  # its in-loop evaluation's problems and draws
    if harness:
        eval_api.load_harness(harness)  # a wrong agent.harness: one line, before the model loads
    n, ks, batch, seed = sample_counts(args, harness_seed=data_seed if harness else None)
    n_problems = args.n_problems or ((task.n_eval or None) if harness else None)
    own = env_problems(task.name, "test", seed=data_seed, n=n_problems) if env or harness else None
    if own is not None:  # a built-in environment's own held-out problems (calc, calc-small, guess), for any agent
        problems = own
    else:
        train = load_train_problems(task, seed=data_seed, n=task.n_train) if run_cfg is not None else None
        problems = load_eval_problems(task, seed=data_seed, n=n_problems, train=train)
    name, split = eval_source(task)
    device = str(resolve_device(args.device or (run_cfg.model.device if run_cfg is not None else "auto")))
    max_new_tokens = args.max_new_tokens or (run_cfg.rollout.max_new_tokens if run_cfg is not None else 64)
    engine = args.engine or (run_cfg.rollout.engine if run_cfg is not None else "hf")
    if harness:  # the endpoint's engine as the run built it; the harness's requests carry their own sampling
        sampling = EngineSettings.from_config(run_cfg.rollout, engine=engine, seed=seed, device=device)
    else:
        sampling = EngineSettings.from_config(
            args, engine=engine, max_new_tokens=max_new_tokens, device=device, seed=seed
        )
    settings = {
        "run": str(run_dir) if run_dir is not None else None,
        "task": name,
        "split": split,
        "difficulty": task_options(task, name).get("difficulty"),
        "template": task.template,
        "system_prompt": task.system_prompt,
        "fields": {k: getattr(task, k) for k in ("question_key", "answer_key", "solution_key") if getattr(task, k)},
        "verifier": task_verifier(task, problems) if not harness else None,  # a harness scores its episodes
        "engine": engine,
        "reward_timeout_s": task.reward_timeout_s,
        "device": device,
        "seed": seed,
        **({"env": env} if env else {}),
        **({"harness": harness} if harness else {}),
    }
    env_kwargs = dict(agent.env_kwargs) if agent is not None else None
    limits = _limits(EnvLimits, agent)
    return _Plan(
        task, list(problems), env, name, split, sampling, settings, limits, env_kwargs, (n, ks, batch),
        agent if harness else None, run_cfg.model.name if harness else "",
    )  # fmt: skip


def _run(plan: _Plan, model: Any, tokenizer: Any, evaluate: Any, evaluate_episodes: Any) -> Any:
    """The `EvalResult` of `plan`: full agent episodes scored by the environment (`evaluate_episodes`) when it names
    one, a harness run's episodes through p3o's endpoint (`p3o.eval.harness.evaluate_harness`), else one completion
    per sample scored by the task's verifier (`evaluate`); the runners are `p3o.eval.runner`'s, imported once by
    `main` (torch start-up only after the options are valid)."""

    (n, ks, batch), task = plan.counts, plan.task
    counting = eval_api.Counting(n_samples=n, ks=tuple(ks), batch_prompts=batch, task=plan.name, split=plan.split)
    if plan.agent is not None:
        harness = {"agent": plan.agent, "model_name": plan.model_name}
        return eval_api.evaluate_harness(model, tokenizer, plan.problems, plan.sampling, **harness, counting=counting)
    if plan.env:
        episodes = {"env": plan.env, "env_kwargs": plan.env_kwargs, "limits": plan.limits}
        return evaluate_episodes(model, tokenizer, plan.problems, plan.sampling, **episodes, counting=counting)
    scoring = {"verifier": task.verifier, "timeout_s": task.reward_timeout_s}  # the task's verifier and time limit
    prompts = {"template": task.template, "system_prompt": task.system_prompt}  # formatted as in training
    common = {"n_samples": n, "ks": ks, "batch_prompts": batch, "task": plan.name, "split": plan.split}
    return evaluate(model, tokenizer, plan.problems, plan.sampling, **scoring, **prompts, **common)


def _limits(limits_cls: Any, agent: Any) -> Any:
    """The run's `agent.*` limits as `limits_cls` (`p3o.envs.EnvLimits`; its defaults without a run)."""
    if agent is None:
        return limits_cls()
    return limits_cls.from_config(agent)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
