"""`p3o eval`: pass@k of a checkpoint on a task's test split (or any evaluation set `p3o.tasks.load_task` reads).

Usage:

    p3o eval --model runs/default/final --task arithmetic --n-samples 8 --k 1,2,4,8 --out eval.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from p3o.errors import ConfigError


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


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="p3o eval", description="pass@k, response length and truncation rate of a policy on a task")
    p.add_argument("--model", required=True, help="'tiny', 'tiny-random', 'smollm2' or a local HF dir (run/final)")
    p.add_argument("--task", default="arithmetic", help="'arithmetic', a preset (gsm8k, math500, ...) or a data path")
    p.add_argument("--split", default="test", help="task split (default: test)")
    p.add_argument("--n-problems", type=int, default=None, help="evaluate the first N problems (default: all)")
    p.add_argument("--difficulty", default=None, help="difficulty of the built-in arithmetic task")
    p.add_argument("--n-samples", type=int, default=8, help="samples per problem (n of pass@k)")
    p.add_argument("--k", type=_ks, default=[1, 2, 4, 8], help="comma-separated k values (default 1,2,4,8)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="generation budget per completion")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass")
    p.add_argument("--precision", default="fp32", help="rollout precision: fp32, bf16, fp16, int8, fp8")
    p.add_argument("--verifier", default=None, help="verifier name (default: each problem's own)")
    p.add_argument("--template", default="default", help="prompt template")
    p.add_argument("--batch-prompts", type=int, default=16, help="prompts per generation batch")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--out", type=Path, default=None, help="write the result as JSON here")
    p.add_argument("--quiet", action="store_true", help="no table, only the JSON file")
    return p


def print_table(result_dict: dict) -> None:
    """A rich table of one evaluation result."""
    from rich.console import Console
    from rich.table import Table

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


def main(argv: list[str]) -> int:
    """Run `p3o eval`; returns the exit code (bad options raise ConfigError → exit 2 via p3o.cli)."""
    args = build_parser().parse_args(argv)
    for name in ("n_samples", "max_new_tokens", "batch_prompts"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')}: must be ≥ 1, got {getattr(args, name)}")
    if args.n_problems is not None and args.n_problems < 1:
        raise ConfigError(f"--n-problems: must be ≥ 1, got {args.n_problems}")
    too_big = [k for k in args.k if k > args.n_samples]
    if too_big:
        raise ConfigError(f"--k: {too_big} exceed --n-samples {args.n_samples}")
    task_kwargs = {}
    if args.difficulty is not None:
        if args.task != "arithmetic":
            raise ConfigError("--difficulty: only the built-in 'arithmetic' task has a difficulty")
        task_kwargs["difficulty"] = int(args.difficulty) if args.difficulty.isdigit() else args.difficulty
    from p3o.eval.runner import evaluate_checkpoint

    result = evaluate_checkpoint(
        args.model,
        args.task,
        args.split,
        n_problems=args.n_problems,
        task_kwargs=task_kwargs,
        n_samples=args.n_samples,
        ks=args.k,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        precision=args.precision,
        verifier=args.verifier,
        template=args.template,
        batch_prompts=args.batch_prompts,
        seed=args.seed,
    )
    d = result.to_dict()
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(d, indent=2) + "\n")
    if not args.quiet:
        print_table(d)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
