"""Completions/s of one full RL iteration (generate, verify, score, update): p3o's trainer vs TRL's GRPOTrainer (CPU).

    .venv/bin/python benchmarks/step.py                          # 8 prompts x 4 samples x 32 new tokens, 5M Qwen3
    .venv/bin/python benchmarks/step.py --steps 8 --rounds 3 --model tiny-1m-random

Both sides start from the same weights (``p3o.models.load_policy(--model)``, the built-in ~5M-parameter Qwen3 and its
tokenizer), the same arithmetic prompts (chat-formatted by ``p3o.tasks.format_prompt``) and the same verifier
(``exact-int`` through ``p3o.rewards.score``), sample at temperature 1 without top-k/top-p, stop at EOS or after
``--new`` tokens, and take one AdamW step per iteration on all 32 completions (no gradient accumulation):

* p3o: ``p3o.train.run(cfg, components=...)`` (the sync loop: HFEngine.generate → verifier → group advantages →
  p3o.train.step.update with the P3O objective → engine.load_weights); one micro-batch of 32.
* TRL: ``trl.GRPOTrainer`` with its defaults (``loss_type="dapo"``, transformers ``generate``), per-device batch 32,
  ``num_generations`` 4, gradient accumulation 1.

An iteration's time is the wall time between the ends of two consecutive iterations (p3o: the ``time_s`` column of
metrics.jsonl; TRL: a ``TrainerCallback.on_step_end`` clock), so it includes everything the trainer does per step.
The first ``--warmup`` iterations of each run are dropped; the sides alternate ``--rounds`` times and the median
iteration time of each side is reported. OMP_WAIT_POLICY defaults to PASSIVE for both sides. The CPU may be
shared with other jobs: compare the ratio.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Before torch starts its OpenMP pool: spin-waiting threads collapse when a shared CPU is busy (as `p3o train` does).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch


def make_config(args: argparse.Namespace, run_dir: str, steps: int) -> Any:
    """The p3o TrainConfig of the benchmark (sync loop, one update of the whole batch per iteration)."""
    from p3o.config import TrainConfig, apply_overrides, validate

    overrides = {
        "run_dir": run_dir,
        "seed": args.seed,
        "steps": steps,
        "model.name": args.model,
        "model.device": "cpu",
        "task.name": "arithmetic",
        "task.n_train": 256,
        "task.n_eval": 0,  # no held-out evaluation inside the timed loop
        "log.eval_every": 0,
        "rollout.prompts_per_step": args.prompts,
        "rollout.group_size": args.group,
        "rollout.max_new_tokens": args.new,
        "rollout.temperature": 1.0,
        "update.num_mini_batches": 1,
        "update.micro_batch_size": args.prompts * args.group,
        "update.epochs": 1,
        "optim.lr": args.lr,
        "objective.name": args.objective,
        "log.progress": False,
        "log.plot": False,
        "log.tensorboard": False,
        "log.wandb": False,
        "ckpt.every": 0,
    }
    return validate(apply_overrides(TrainConfig(), overrides))


def run_p3o(args: argparse.Namespace, comps0: Any, steps: int) -> dict[str, Any]:
    """One p3o training run of `steps` iterations; per-iteration wall times from metrics.jsonl."""
    from p3o.train import loop

    with tempfile.TemporaryDirectory(prefix="p3o-bench-") as tmp:
        cfg = make_config(args, tmp, steps)
        comps = copy.copy(comps0)
        comps.policy = copy.deepcopy(comps0.policy)
        loop.run(cfg, components=comps)
        rows = [json.loads(line) for line in (Path(tmp) / "metrics.jsonl").read_text().splitlines() if line.strip()]
    times = [b["time_s"] - a["time_s"] for a, b in itertools.pairwise(rows)]  # end of step k -> end of step k+1
    times = [rows[0]["time_s"], *times]
    return {
        "times": times[args.warmup :],
        "lengths": [r["response_len_mean"] for r in rows[args.warmup :]],
        "gen": [r.get("time_gen_s", float("nan")) for r in rows[args.warmup :]],
        "train": [r["time_train_s"] for r in rows[args.warmup :]],
        "reward": [r["reward_mean"] for r in rows],
    }


def run_trl(args: argparse.Namespace, comps0: Any, texts: list[str], steps: int) -> dict[str, Any]:
    """One TRL GRPOTrainer run of `steps` iterations; per-iteration wall times from an on_step_end clock."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from p3o.rewards import get_verifier, score

    verifier = get_verifier("exact-int")

    def reward(completions: list[str], answer: list[str], **_: Any) -> list[float]:
        return score(completions, answer, verifier, timeout_s=1.0)

    class Clock(TrainerCallback):
        def __init__(self) -> None:
            self.marks = [time.perf_counter()]

        def on_step_end(self, *a: Any, **k: Any) -> None:
            self.marks.append(time.perf_counter())

    clock = Clock()
    with tempfile.TemporaryDirectory(prefix="trl-bench-") as tmp:
        config = GRPOConfig(
            output_dir=tmp,
            use_cpu=True,
            bf16=False,
            per_device_train_batch_size=args.prompts * args.group,
            num_generations=args.group,
            gradient_accumulation_steps=1,
            max_completion_length=args.new,
            temperature=1.0,
            learning_rate=args.lr,
            max_steps=steps,
            logging_steps=1,
            report_to=[],
            save_strategy="no",
            seed=args.seed,
            dataloader_num_workers=0,
        )
        trainer = GRPOTrainer(
            model=copy.deepcopy(comps0.policy).train(),
            reward_funcs=reward,
            args=config,
            train_dataset=Dataset.from_dict({"prompt": texts, "answer": list(comps0.answers[: len(texts)])}),
            processing_class=comps0.tokenizer,
            callbacks=[clock],
        )
        gen_times: list[float] = []
        generate_and_score = trainer._generate_and_score_completions

        def timed_generate_and_score(*a: Any, **k: Any) -> Any:  # TRL's generate + reward + advantage phase
            t0 = time.perf_counter()
            out = generate_and_score(*a, **k)
            gen_times.append(time.perf_counter() - t0)
            return out

        trainer._generate_and_score_completions = timed_generate_and_score
        clock.marks = [time.perf_counter()]
        trainer.train()
    times = [b - a for a, b in zip(clock.marks, clock.marks[1:])]
    logs = [h for h in trainer.state.log_history if "completions/mean_length" in h]
    return {
        "times": times[args.warmup :],
        "lengths": [h["completions/mean_length"] for h in logs[args.warmup :]],
        "gen": gen_times[args.warmup :],
        "train": [t - g for t, g in zip(times[args.warmup :], gen_times[args.warmup :])],
        "reward": [h["reward"] for h in logs],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-5m-random", help="p3o.models.load_policy name (~5M-parameter Qwen3)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--new", type=int, default=32, help="max new tokens")
    ap.add_argument("--steps", type=int, default=5, help="iterations per run (incl. warm-up)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=2, help="alternating TRL / p3o runs per side")
    ap.add_argument("--objective", default="p3o")
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave torch's default)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    import transformers
    import trl

    from p3o.train.wiring import build_components

    comps = build_components(make_config(args, tempfile.gettempdir(), args.steps))
    n_params = sum(p.numel() for p in comps.policy.parameters())
    tok = comps.tokenizer
    texts = [tok.decode(ids) for ids in comps.prompts]
    print(
        f"model {args.model}: {n_params / 1e6:.2f}M parameters, vocab {len(tok)}; {args.prompts} prompts x "
        f"{args.group} samples x {args.new} new tokens; torch {torch.__version__} ({torch.get_num_threads()} threads),"
        f" transformers {transformers.__version__}, trl {trl.__version__}"
    )
    results: dict[str, list[dict[str, Any]]] = {"TRL GRPOTrainer": [], f"p3o ({args.objective})": []}
    for r in range(args.rounds):
        for name in results:
            t0 = time.perf_counter()
            if name.startswith("TRL"):
                res = run_trl(args, comps, texts, args.steps)
            else:
                res = run_p3o(args, comps, args.steps)
            results[name].append(res)
            print(f"  round {r + 1} {name}: {args.steps} iterations in {time.perf_counter() - t0:.1f} s", flush=True)

    completions = args.prompts * args.group
    print(f"\n{'trainer':<22}{'s/iter':>9}{'completions/s':>15}{'tokens/s':>10}{'mean len':>10}{'iters':>7}")
    rate: dict[str, float] = {}
    for name, runs in results.items():
        times = [t for res in runs for t in res["times"]]
        lengths = [x for res in runs for x in res["lengths"]]
        med = statistics.median(times)
        mean_len = statistics.fmean(lengths)
        rate[name] = completions / med
        print(
            f"{name:<22}{med:>9.3f}{rate[name]:>15.1f}{rate[name] * mean_len:>10.0f}{mean_len:>10.1f}{len(times):>7}"
        )
    for name, runs in results.items():
        gen = statistics.median([t for res in runs for t in res["gen"]])
        rest = statistics.median([t for res in runs for t in res["train"]])
        print(f"{name} split (median s): generate+verify+score {gen:.3f}, update and the rest {rest:.3f}")
    trl_rate, p3o_rate = rate["TRL GRPOTrainer"], rate[f"p3o ({args.objective})"]
    print(f"\nspeed-up p3o / TRL (completions/s): {p3o_rate / trl_rate:.2f}x  (target >= 2x)")


if __name__ == "__main__":
    main()
