"""Harness episodes through p3o's endpoint vs p3o's tick runner (and TRL's GRPOTrainer with tools), side by side in
one run, on the same model and the same episodes; ratios printed.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/endpoint.py                       # 32 episodes × 3 turns, 50 ms tool
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/endpoint.py --episodes 16 --repeats 6 --trl-steps 3 --trl-rounds 3

Every episode runs `--turns` model turns of at most `--turn-tokens` tokens on the shipped agent base (``tiny-agent``:
its turns end at its end-of-turn token, as a chat model's do; tokens/s and turns are printed beside episodes/s), one
HF engine (fp32, in process, temperature 1); after each turn but the last a tool that takes `--latency` seconds
answers ``"42"``; a turn cut at `--turn-tokens` ends its episode (the tick runner's rule, kept by the harness). Rows:

* ``tick runner``: `p3o.envs.run_episodes` (``agent.env``): every waiting episode in one engine call per tick, the
  tools of a tick in parallel threads; seeded by the repeat's index;
* ``endpoint + harness``: `p3o.envs.harness.HarnessEngine` (``agent.harness``): each episode an ``openai`` SDK loop
  (``async def``; ``asyncio.sleep(latency)`` as its tool) against `p3o.serve.EndpointServer` on the same engine, all
  episodes at once; the server gathers the running episodes' turns into engine calls (``agent.serve_gather_s``, as
  ``p3o train`` does). Its rows come from the server's records.
  overhead = tick-runner episodes/s ÷ endpoint episodes/s − 1 (issue 52 asks ≤ 15 % at a 50 ms tool);
* RL steps, with `--trl-steps` > 0, on `--chat-model` (``tiny-chat``: Qwen3-style tool calls) and calc-small,
  `--episodes` / 4 problems × 4 episodes per step, the example harness's calculator tool (instant, in both):
  ``p3o train --config agent-openai`` (sync, the endpoint + the example harness: at most 3 model calls of 64 tokens)
  against TRL 1.16's ``GRPOTrainer(tools=[calculator])`` (its multi-turn tool loop, at most 2 tool rounds and
  3 × 64 completion tokens, on its own transformers generation: TRL's vLLM path does not run on this CPU, see
  docs/benchmarks.md). Both render the same prompt: tiny-chat's own template (prefix-preserving, so TRL keeps it)
  with the same tool schema (TRL's calculator has no return annotation, which would add ``"return"`` to the schema
  it derives), and TRL parses calls with its Qwen3 response template. Seconds per RL step (the step's wall time:
  generation, rewards, update, weight push; the median after the first step), episodes/s, tool calls and sampled
  tokens per episode side by side; the two trainers alternate `--trl-rounds` times, each round's ratio printed.

The tick runner and the endpoint run interleaved, one round of each per repeat after one warm-up round, so both see
the same machine load: each repeat's episodes/s ratio is printed, with their median and range, and each round's
process CPU time (the endpoint's split per request into the harness's clients, the server's routes and the engine).
On a loaded machine the wall-clock ratio follows the CPU ratio. It prints the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]


class SlowToolEnv:
    """`turns` model turns; after each but the last, a tool that sleeps `latency` s and answers ``"42"``."""

    stop_strings: tuple[str, ...] = ()

    def __init__(self, turns: int, latency: float) -> None:
        self.turns, self.latency, self.t = turns, latency, 0

    def reset(self, problem: Any, seed: int) -> list[dict[str, str]]:
        return [{"role": "user", "content": problem.prompt}]

    def step(self, turn: str) -> Any:
        from p3o.envs import Step

        self.t += 1
        if self.t >= self.turns:
            return Step(reward=1.0, done=True)
        time.sleep(self.latency)
        return Step(observation=[{"role": "user", "content": "42"}], info={"tool_calls": 1.0})

    def close(self) -> None:
        pass


HARNESS_ENV = "P3O_BENCH_HARNESS"
"""``turns,turn_tokens,latency`` of `harness` (set by `bench_p3o`; how a harness process, which imports the harness
by its spec ``endpoint:harness``, learns them)."""


async def harness(client: Any, model: str, problem: Any) -> float:
    """The endpoint's side of the same episode: an openai-SDK loop (the tool: an asyncio sleep, then ``"42"``)."""
    turns_s, tokens_s, latency_s = os.environ[HARNESS_ENV].split(",")
    turns, turn_tokens, latency = int(turns_s), int(tokens_s), float(latency_s)
    messages: list[dict[str, Any]] = [{"role": "user", "content": problem.prompt}]
    for t in range(turns):
        out = await client.chat.completions.create(model=model, messages=messages, max_tokens=turn_tokens,
                                                   temperature=1.0)  # fmt: skip
        if t == turns - 1 or out.choices[0].finish_reason == "length":
            break  # the tick runner's rule: a turn cut at its token limit ends the episode
        await asyncio.sleep(latency)
        messages += [{"role": "assistant", "content": out.choices[0].message.content or ""}]
        messages += [{"role": "user", "content": "42"}]
    return 1.0


def bench_p3o(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """episodes/s and sampled tokens/s of the tick runner and of the endpoint + harness, same engine settings."""
    from p3o.envs import EnvLimits, Renderer, run_episodes
    from p3o.envs.harness import HarnessEngine
    from p3o.models import load_policy
    from p3o.rollout import HFEngine
    from p3o.serve import EndpointServer
    from p3o.tasks.calc import calc_problem

    model, tok = load_policy(args.model)
    problems = [calc_problem(i, "test", kind="small") for i in range(args.episodes)]
    limits = EnvLimits(max_turns=args.turns, max_turn_tokens=args.turn_tokens, max_total_tokens=400, max_obs_tokens=16)
    eos = [int(tok.eos_token_id)]
    tick_engine = HFEngine(model, tok, precision="fp32", temperature=1.0)
    renderer = Renderer(tok, mode="chat", max_obs_tokens=16)

    def tick(seed: int) -> Any:
        return run_episodes(
            tick_engine, lambda: SlowToolEnv(args.turns, args.latency), problems, 1,
            renderer=renderer, limits=limits, seed=seed, eos_ids=eos,
        )  # fmt: skip

    os.environ[HARNESS_ENV] = f"{args.turns},{args.turn_tokens},{args.latency}"
    here = [str(Path(__file__).parent), os.environ.get("PYTHONPATH")]  # harness processes import `endpoint:harness`
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, here))
    server = EndpointServer(HFEngine(model, tok, precision="fp32", temperature=1.0), tok, model_name=args.model)
    prompts = [tok(p.prompt, add_special_tokens=False)["input_ids"] for p in problems]
    by_prompt = {tuple(ids): p for ids, p in zip(prompts, problems)}
    engines = {
        _endpoint_row(k): HarnessEngine(server, harness, by_prompt, timeout_s=600, concurrency=args.episodes,
                                        processes=k, spec="endpoint:harness")
        for k in args.processes
    }  # fmt: skip
    current: list[Any] = [None]  # the engine whose episodes run now: the batcher gathers its running episodes' calls
    if args.gather_s > 0:  # what p3o train does (agent.serve_gather_s)
        expect = lambda: current[0].active if current[0] is not None else 0  # noqa: E731
        server.batcher.gather(expect=expect, max_wait_s=args.gather_s)
    server.start()

    def through(engine: Any) -> Any:
        def generate(seed: int) -> Any:
            current[0] = engine
            return engine.generate(prompts, 1)

        return generate

    try:
        pipelines = {"tick runner": (tick, None), **{name: (through(e), e) for name, e in engines.items()}}
        out = _interleave(pipelines, args.repeats, server, args.episodes)
        for engine in engines.values():
            assert engine.faults == dict.fromkeys(engine.faults, 0), engine.faults
    finally:
        for engine in engines.values():
            engine.clients.close()
        server.stop()
    return out


def _endpoint_row(processes: int) -> str:
    """The row name of the endpoint with the harness in `processes` processes (0: in the trainer's process)."""
    return "endpoint + harness" if processes == 0 else f"endpoint + {processes} harness proc"


THREADS = {"p3o-harness-loop": "harness clients", "p3o-serve-http": "server (HTTP, render, record)",
           "p3o-serve-batcher": "engine"}  # fmt: skip
"""The endpoint's threads whose CPU time is reported per request: the harness's event loop (its ``openai`` clients,
when the harness runs in the trainer's process), uvicorn's (the routes' work), the batcher's (the engine calls). With
harness processes, their CPU (``/proc/<pid>/stat``) is the harness clients' figure and counts in the round's CPU."""


def _thread_cpu() -> dict[str, float]:
    """CPU seconds so far of each `THREADS` thread that is running."""
    by_name = {t.name: t for t in threading.enumerate()}
    return {n: time.clock_gettime(time.pthread_getcpuclockid(by_name[n].ident)) for n in THREADS if n in by_name}


def _procs_cpu(engine: Any) -> float:
    """CPU seconds so far (user + system) of `engine`'s harness processes (0 for a harness in process)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for child in getattr(engine.clients, "children", []):
        fields = Path(f"/proc/{child.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime (fields 14 and 15 of stat)
    return total


def _interleave(pipelines: dict[str, Any], repeats: int, server: Any, episodes: int) -> dict[str, Any]:
    """Run the pipelines in turn, one round each per repeat after a warm-up round (so all see the same load): per
    pipeline the median episodes/s, tokens/s, turns, engine calls and CPU seconds per round (the process's and its
    harness processes'); per endpoint row and repeat its episodes/s ÷ the tick runner's and CPU ÷ the tick runner's,
    and its CPU per request by thread (`THREADS`). `pipelines`: name -> (round(seed) -> Rollouts, its engine or
    None for the tick runner)."""
    keys = ("seconds", "tokens", "turns", "calls", "cpu")
    runs: dict[str, dict[str, list[float]]] = {name: {k: [] for k in keys} for name in pipelines}
    threads = {name: dict.fromkeys((*THREADS, "procs"), 0.0) for name in pipelines}
    requests = dict.fromkeys(pipelines, 0)
    for rep in range(repeats + 1):
        for name, (fn, engine) in pipelines.items():
            n0, q0, th0 = server.counters()["engine_calls"], server.counters()["requests"], _thread_cpu()
            p0 = _procs_cpu(engine) if engine is not None else 0.0
            c0, t0 = time.process_time(), time.perf_counter()
            r = fn(rep)
            t, cpu = time.perf_counter() - t0, time.process_time() - c0
            if rep == 0:
                continue
            if engine is not None:
                th1, procs = _thread_cpu(), _procs_cpu(engine) - p0
                for n in th1:
                    threads[name][n] += th1[n] - th0.get(n, 0.0)
                threads[name]["procs"] += procs
                cpu += procs
                requests[name] += server.counters()["requests"] - q0
            calls = server.counters()["engine_calls"] - n0 if engine is not None else r.extras["turns"].max()
            for k, v in zip(keys, (t, float(r.mask.sum()), float(r.extras["turns"].mean()), float(calls), cpu)):
                runs[name][k].append(v)
    out: dict[str, Any] = {"rows": {}, "endpoints": {}}
    for name, v in runs.items():
        t = statistics.median(v["seconds"])
        out["rows"][name] = {"episodes_s": episodes / t, "tokens_s": sum(v["tokens"]) / sum(v["seconds"]),
                             "seconds": t, "turns": statistics.mean(v["turns"]),
                             "engine_calls": statistics.mean(v["calls"]), "cpu_s": statistics.median(v["cpu"]),
                             "times": v["seconds"]}  # fmt: skip
    tick = runs["tick runner"]
    for name, (_, engine) in pipelines.items():
        if engine is None:
            continue
        ep, n = runs[name], max(requests[name], 1)
        per = {THREADS[k]: 1e3 * v / n for k, v in threads[name].items() if k in THREADS and v > 0}
        if threads[name]["procs"] > 0:
            per["harness clients"] = 1e3 * threads[name]["procs"] / n
        out["endpoints"][name] = {
            "ratios": [a / b for a, b in zip(tick["seconds"], ep["seconds"])],
            "cpu_ratios": [b / a for a, b in zip(tick["cpu"], ep["cpu"])],
            "requests": requests[name] / repeats,
            "cpu_per_request_ms": per,
        }
    return out


def bench_p3o_step(args: argparse.Namespace) -> dict[str, float]:
    """Seconds per RL step of ``p3o train --config agent-openai`` (the example harness: calculator tool, calc-small)
    on `--chat-model` with --episodes episodes per step (4 per problem), sync, no evaluation; median after step 1."""
    from p3o.config import load_config
    from p3o.train.loop import run

    argv = [
        "--config", "agent-openai", "--model.name", args.chat_model, "--steps", str(1 + max(1, args.trl_steps)),
        "--rollout.prompts_per_step", str(args.episodes // 4), "--rollout.group_size", "4", "--task.n_eval", "0",
        "--log.progress", "false", "--log.plot", "false", "--log.tensorboard", "false", "--ckpt.every", "0",
        "--loop.mode", "sync", "--run_dir", tempfile.mkdtemp(prefix="p3o-bench-") + "/run",
    ]  # fmt: skip
    out = run(load_config(argv))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "time_step_s" in r][1:]  # training steps (not the step-0 evaluation), after the first
    s = statistics.median(r["time_step_s"] for r in rows)  # the step's wall time: generation (sync) + update + push
    return {"s_per_step": s, "episodes_s": args.episodes / s,
            "tool_calls": statistics.mean(r.get("episode/tool_calls", 0.0) for r in rows),
            "model_tokens": statistics.mean(r.get("episode/model_tokens", 0.0) for r in rows)}  # fmt: skip


def bench_trl(args: argparse.Namespace) -> dict[str, float]:
    """TRL GRPOTrainer with ``tools=`` on the same model: seconds per step and episodes/s (median after step 1)."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen3_template

    from p3o.examples.agent_openai import calculator as example_calculator
    from p3o.models import load_policy
    from p3o.tasks.calc import calc_problem

    model, tok = load_policy(args.chat_model)
    tok.response_template = qwen3_template  # tiny-chat's layout is Qwen3's; TRL matches known templates by their text

    def calculator(expression: str):  # no return annotation: it would add "return" to TRL's tool schema
        """Evaluate an arithmetic expression.

        Args:
            expression: e.g. 47 * 6
        """
        return example_calculator(expression)  # instant, as the example harness's

    def reward(completions: list[Any], answer: list[str], **kw: Any) -> list[float]:
        found = [re.search(r"####\s*(-?\d+)", str(c[-1].get("content", "")) if c else "") for c in completions]
        return [float(bool(m) and m[1] == a) for m, a in zip(found, answer)]

    problems = [calc_problem(i, "train", kind="small") for i in range(256)]
    data = Dataset.from_dict({"prompt": [[{"role": "user", "content": p.prompt}] for p in problems],
                              "answer": [p.answer for p in problems]})  # fmt: skip
    stamps: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, *a: Any, **k: Any) -> None:
            stamps.append(time.perf_counter())

    per_step = args.episodes
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="p3o-trl-"), per_device_train_batch_size=per_step, num_generations=4,
        max_completion_length=64 * args.turns, max_steps=1 + args.trl_steps, temperature=1.0,
        learning_rate=1e-6, logging_steps=1, report_to=[], save_strategy="no", use_cpu=True, bf16=False,
        gradient_checkpointing=False, max_tool_calling_iterations=args.turns - 1, dataloader_num_workers=0,
    )  # fmt: skip

    trainer = GRPOTrainer(model=model, processing_class=tok, reward_funcs=[reward], args=config, train_dataset=data,
                          tools=[calculator], callbacks=[Clock()])  # fmt: skip
    t0 = time.perf_counter()
    trainer.train()
    steps = [b - a for a, b in zip([t0, *stamps[:-1]], stamps)][1:] or [stamps[0] - t0]
    s = statistics.median(steps)
    logged = [h for h in trainer.state.log_history if "tools/call_frequency" in h]
    logs = logged[1:] or logged  # the steps after the first, as for p3o
    calls = statistics.mean(float(h["tools/call_frequency"]) for h in logs) if logs else float("nan")
    length = statistics.mean(float(h["completions/mean_length"]) for h in logs) if logs else float("nan")
    return {"s_per_step": s, "episodes_s": per_step / s, "tool_call_frequency": calls, "mean_length": length}


def rl_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The RL-step rows: p3o and TRL alternated `--trl-rounds` times (each a fresh run of 1 + `--trl-steps` steps),
    so both see the same load; per round each trainer's median s/step and the ratio printed, then their medians."""
    print(f"RL step of {args.episodes} episodes on {args.chat_model} (calc-small, calculator tool):")
    print(
        f"{'round':<7}{'pipeline':<28}{'s/step':>10}{'episodes/s':>12}{'tool calls/episode':>20}{'sampled tokens':>16}"
    )
    rounds = []
    for k in range(args.trl_rounds):
        p3o, trl = bench_p3o_step(args), bench_trl(args)
        for name, r, calls, tokens in (
            ("p3o train --agent.harness", p3o, "tool_calls", "model_tokens"),
            ("TRL GRPOTrainer (tools=)", trl, "tool_call_frequency", "mean_length"),
        ):
            print(f"{k + 1:<7}{name:<28}{r['s_per_step']:>10.2f}{r['episodes_s']:>12.2f}{r[calls]:>20.2f}"
                  f"{r[tokens]:>16.1f}")  # fmt: skip
        rounds.append({"p3o": p3o, "trl": trl, "ratio": trl["s_per_step"] / p3o["s_per_step"]})
    ratios = [r["ratio"] for r in rounds]
    print(f"TRL s/step ÷ p3o s/step per round: {' '.join(f'{x:.2f}' for x in ratios)}; median "
          f"{statistics.median(ratios):.2f} (p3o {statistics.median(r['p3o']['s_per_step'] for r in rounds):.2f} s, "
          f"TRL {statistics.median(r['trl']['s_per_step'] for r in rounds):.2f} s)")  # fmt: skip
    return rounds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny-agent")
    ap.add_argument("--episodes", type=int, default=32)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--turn-tokens", type=int, default=24)
    ap.add_argument("--latency", type=float, default=0.05)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--processes", type=lambda v: [int(x) for x in v.split(",")], default=[0, 1, 2],
        help="endpoint rows: harness processes of each (agent.harness_processes; 0: in the trainer's process)",
    )  # fmt: skip
    ap.add_argument("--gather-s", type=float, default=0.25, help="agent.serve_gather_s (0: the plain 5 ms window)")
    ap.add_argument("--trl-steps", type=int, default=0, help="RL steps of each trainer (0: skip the RL-step rows)")
    ap.add_argument("--trl-rounds", type=int, default=2, help="p3o / TRL runs alternated for the RL-step rows")
    ap.add_argument(
        "--chat-model", default="tiny-chat", help="the model of the RL-step rows (a tool-calling chat base)"
    )
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    print(f"# load average at start: {os.getloadavg()}; torch threads {torch.get_num_threads()}")
    rows = bench_p3o(args)
    print(f"{'pipeline':<28}{'episodes/s':>12}{'tokens/s':>12}{'turns':>8}{'engine calls':>14}{'CPU s/round':>13}")
    for name, r in rows["rows"].items():
        print(f"{name:<28}{r['episodes_s']:>12.2f}{r['tokens_s']:>12.1f}{r['turns']:>8.2f}{r['engine_calls']:>14.1f}"
              f"{r['cpu_s']:>13.3f}")  # fmt: skip
    overheads = {}
    for name, e in rows["endpoints"].items():
        ratios, cpu_ratios = e["ratios"], e["cpu_ratios"]
        ratio = statistics.median(ratios)
        overheads[name] = 1 / ratio - 1
        print(f"{name}: episodes/s ÷ tick runner's, per interleaved repeat: {' '.join(f'{x:.2f}' for x in ratios)}; "
              f"median {ratio:.3f} (range {min(ratios):.2f}-{max(ratios):.2f})")  # fmt: skip
        print(f"  CPU ÷ tick runner's per round: {' '.join(f'{x:.2f}' for x in cpu_ratios)}; "
              f"median {statistics.median(cpu_ratios):.3f}")  # fmt: skip
        print(f"  CPU per request ({e['requests']:.1f} requests a round): "
              + ", ".join(f"{k} {v:.2f} ms" for k, v in e["cpu_per_request_ms"].items()))  # fmt: skip
        print(f"  overhead vs the tick runner (median ratio): {overheads[name]:+.1%}")
    result: dict[str, Any] = {"rows": rows, "overhead": overheads, "args": vars(args)}
    if args.trl_steps > 0:
        result["rl_steps"] = rl_rows(args)
    print(f"# load average at end: {os.getloadavg()}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
