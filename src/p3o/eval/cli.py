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

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from p3o import models  # models.load_policy looked up at call time: tests replace it
from p3o.config import TaskConfig, load_config
from p3o.dist import resolve_device
from p3o.errors import ConfigError
from p3o.eval.runner import evaluate, find_run
from p3o.models.hub import check_model_name
from p3o.rollout.settings import EngineSettings
from p3o.tasks import load_eval_problems, load_train_problems, task_options, task_verifier
from p3o.tasks.sources import eval_source


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, like every p3o command
        raise ConfigError(message)


def _ks(text: str) -> list[int]:
    try:
        ks = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--k: expected comma-separated integers, got {text!r}") from None
    if not ks or min(ks) < 1:
        raise argparse.ArgumentTypeError(f"--k: expected integers ≥ 1, got {text!r}")
    return ks


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="p3o eval", description="pass@k, response length and truncation rate of a policy on a task")
    run = "default: the run's, else "
    p.add_argument(
        "--model",
        required=True,
        help="a training run dir (or its final/), 'tiny', 'tiny-random', 'smollm2', a local HF dir or a Hub id",
    )
    p.add_argument(
        "--task", default=None, help=f"evaluation data: 'arithmetic', a preset or a data path ({run}arithmetic)"
    )
    p.add_argument(
        "--split",
        default=None,
        help=f"split ({run}test: the held-out rows of a single file, test.jsonl of a folder; 'all': every row)",
    )
    p.add_argument("--n-problems", type=int, default=None, help="evaluate the first N problems (default: all)")
    p.add_argument("--difficulty", default=None, help="difficulty of the built-in arithmetic task")
    p.add_argument("--template", default=None, help=f"prompt template: plain, hash, boxed, short ({run}default)")
    p.add_argument("--system-prompt", default=None, help=f"system prompt ({run}none)")
    p.add_argument("--question-key", default=None, help=f"data field of the question ({run}auto)")
    p.add_argument("--answer-key", default=None, help=f"data field of the reference answer ({run}auto)")
    p.add_argument("--solution-key", default=None, help=f"data field of the worked solution ({run}auto)")
    p.add_argument("--test-fraction", type=_fraction, default=None, help=f"held-out share of a single file ({run}0.1)")
    p.add_argument(
        "--allow-train-eval-overlap", action="store_true", help="keep evaluation problems the run trained on"
    )
    p.add_argument(
        "--verifier", default=None, help=f"verifier name or 'package.module:function' ({run}each problem's own)"
    )
    p.add_argument("--reward-timeout-s", type=float, default=None, help=f"verifier time limit per call ({run}1.0)")
    p.add_argument("--device", default=None, help=f"auto (cuda if available), cpu, cuda ({run}auto)")
    p.add_argument("--n-samples", type=int, default=8, help="samples per problem (n of pass@k)")
    p.add_argument("--k", type=_ks, default=[1, 2, 4, 8], help="comma-separated k values (default 1,2,4,8)")
    p.add_argument("--max-new-tokens", type=int, default=None, help=f"generation budget per completion ({run}64)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass")
    p.add_argument("--precision", default="fp32", help="rollout precision: fp32, bf16, fp16, int8, fp8")
    p.add_argument("--engine", choices=["hf", "vllm"], default=None, help=f"rollout engine: hf, vllm ({run}hf)")
    p.add_argument("--batch-prompts", type=int, default=16, help="prompts per generation batch")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--out", type=Path, default=None, help="write the result as JSON here")
    p.add_argument("--quiet", action="store_true", help="no table, only the JSON file")
    return p


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


def task_settings(args: argparse.Namespace, run_cfg: Any = None) -> Any:
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


def _check_args(args: argparse.Namespace) -> None:
    """One-line errors, naming the option, for values `p3o eval` cannot use."""
    for name in ("n_samples", "max_new_tokens", "batch_prompts"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ConfigError(f"--{name.replace('_', '-')}: must be ≥ 1, got {value}")
    if args.n_problems is not None and args.n_problems < 1:
        raise ConfigError(f"--n-problems: must be ≥ 1, got {args.n_problems}")
    if args.reward_timeout_s is not None and args.reward_timeout_s <= 0:
        raise ConfigError(f"--reward-timeout-s: must be > 0, got {args.reward_timeout_s}")
    too_big = [k for k in args.k if k > args.n_samples]
    if too_big:
        raise ConfigError(f"--k: {too_big} exceed --n-samples {args.n_samples}")


def main(argv: list[str]) -> int:
    """Run `p3o eval`; returns the exit code (bad options raise ConfigError → exit 2 via p3o.cli)."""
    args = build_parser().parse_args(argv)
    _check_args(args)

    policy_dir, run_dir = find_run(args.model)
    if run_dir is None:  # a model name or path, not a run: refused in one line before anything loads
        check_model_name(args.model, key="--model")
    run_cfg = _run_config(run_dir) if run_dir is not None else None
    task = task_settings(args, run_cfg)
    data_seed = run_cfg.seed if run_cfg is not None else 0
    # the problems first: a wrong path or field fails before the model loads
    train = load_train_problems(task, seed=data_seed, n=task.n_train) if run_cfg is not None else None
    problems = load_eval_problems(task, seed=data_seed, n=args.n_problems, train=train)
    name, split = eval_source(task)
    device = str(resolve_device(args.device or (run_cfg.model.device if run_cfg is not None else "auto")))
    max_new_tokens = args.max_new_tokens or (run_cfg.rollout.max_new_tokens if run_cfg is not None else 64)
    engine = args.engine or (run_cfg.rollout.engine if run_cfg is not None else "hf")
    sampling = EngineSettings.from_config(args, engine=engine, max_new_tokens=max_new_tokens, device=device)
    settings = {
        "run": str(run_dir) if run_dir is not None else None,
        "task": name,
        "split": split,
        "difficulty": task_options(task, name).get("difficulty"),
        "template": task.template,
        "system_prompt": task.system_prompt,
        "fields": {k: getattr(task, k) for k in ("question_key", "answer_key", "solution_key") if getattr(task, k)},
        "verifier": task_verifier(task, problems),
        "engine": engine,
        "reward_timeout_s": task.reward_timeout_s,
        "device": device,
    }
    model_name = str(policy_dir) if run_dir is not None else args.model
    cache_dir = run_cfg.model.cache_dir if run_cfg is not None else None
    model, tokenizer = models.load_policy(model_name, **({"cache_dir": cache_dir} if cache_dir else {}))
    if not args.quiet:
        shown = ", ".join(f"{k} {v!r}" for k, v in settings.items() if v not in (None, {}))
        print(f"p3o eval: {len(problems)} problems; {shown}", file=sys.stderr)
    result = evaluate(
        model,
        tokenizer,
        problems,
        sampling,
        n_samples=args.n_samples,
        ks=args.k,
        verifier=task.verifier,
        template=task.template,
        system_prompt=task.system_prompt,
        batch_prompts=args.batch_prompts,
        timeout_s=task.reward_timeout_s,
        task=name,
        split=split,
    )
    result.model = model_name
    result.extra = dict(settings)
    d = result.to_dict()
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(d, indent=2) + "\n")
    if not args.quiet:
        print_table(d)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
