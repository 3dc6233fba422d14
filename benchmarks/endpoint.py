"""Harness episodes through p3o's endpoint vs p3o's tick runner (and TRL's GRPOTrainer with tools), side by side in
one run, on the same model and the same episodes; ratios printed.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/endpoint.py                       # 32 episodes × 3 turns, 50 ms tool
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/endpoint.py --episodes 64 --repeats 3 --trl-steps 2

Every episode runs `--turns` model turns of at most `--turn-tokens` tokens on the shipped agent base (``tiny-agent``:
its turns end at its end-of-turn token, as a chat model's do; tokens/s and turns are printed beside episodes/s), one
HF engine (fp32, in process, temperature 1); after each turn but the last a tool that takes `--latency` seconds
answers ``"42"``; a turn cut at `--turn-tokens` ends its episode (the tick runner's rule, kept by the harness). Rows:

* ``tick runner``: `p3o.envs.run_episodes` (``agent.env``): every waiting episode in one engine call per tick, the
  tools of a tick in parallel threads;
* ``endpoint + harness``: `p3o.envs.harness.HarnessEngine` (``agent.harness``): each episode an ``openai`` SDK loop
  (``async def``; ``asyncio.sleep(latency)`` as its tool) against `p3o.serve.EndpointServer` on the same engine, all
  episodes at once; the server batches concurrent requests into engine calls. Its rows come from the server's records.
  overhead = tick-runner episodes/s ÷ endpoint episodes/s − 1 (issue 52 asks ≤ 15 % at a 50 ms tool);
* RL steps, with `--trl-steps` > 0, on `--chat-model` (``tiny-chat``: Qwen3-style tool calls) and calc-small,
  `--episodes` / 4 problems × 4 episodes per step, the calculator tool (the example harness's, `--latency` s each):
  ``p3o train --config agent-openai`` (sync, the endpoint + the example harness) against TRL 1.16's
  ``GRPOTrainer(tools=[calculator])`` (its multi-turn tool loop on its own transformers generation: TRL's vLLM path
  does not run on this CPU, see docs/benchmarks.md; the tokenizer gets TRL's Qwen3 response template, as TRL's docs
  say for a template it does not recognise). Seconds per RL step (generation + update), episodes/s and tool calls
  per episode side by side.

The tick runner and the endpoint run interleaved, one round of each per repeat after one warm-up round, so both see
the same machine load: each repeat's episodes/s ratio is printed, with their median and range. Run it on a quiet
machine; it prints the load average.
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


def make_harness(turns: int, turn_tokens: int, latency: float):
    """The endpoint's side of the same episode: an openai-SDK loop (the tool: an asyncio sleep, then ``"42"``)."""

    async def harness(client: Any, model: str, problem: Any) -> float:
        messages: list[dict[str, Any]] = [{"role": "user", "content": problem.prompt}]
        for t in range(turns):
            out = await client.chat.completions.create(
                model=model, messages=messages, max_tokens=turn_tokens, temperature=1.0
            )
            if t == turns - 1 or out.choices[0].finish_reason == "length":
                break  # the tick runner's rule: a turn cut at its token limit ends the episode
            await asyncio.sleep(latency)
            messages += [{"role": "assistant", "content": out.choices[0].message.content or ""}]
            messages += [{"role": "user", "content": "42"}]
        return 1.0

    return harness


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

    def tick() -> Any:
        return run_episodes(
            tick_engine, lambda: SlowToolEnv(args.turns, args.latency), problems, 1,
            renderer=renderer, limits=limits, seed=0, eos_ids=eos,
        )  # fmt: skip

    server = EndpointServer(HFEngine(model, tok, precision="fp32", temperature=1.0), tok, model_name=args.model)
    prompts = [tok(p.prompt, add_special_tokens=False)["input_ids"] for p in problems]
    by_prompt = {tuple(ids): p for ids, p in zip(prompts, problems)}
    harness = make_harness(args.turns, args.turn_tokens, args.latency)
    engine = HarnessEngine(server, harness, by_prompt, timeout_s=600, concurrency=args.episodes)
    if args.gather_s > 0:  # what p3o train does (agent.serve_gather_s)
        server.batcher.gather(expect=lambda: engine.active, max_wait_s=args.gather_s)
    server.start()
    try:

        def endpoint() -> Any:
            return engine.generate(prompts, 1)

        pipelines = {"tick runner": tick, "endpoint + harness": endpoint}
        times: dict[str, list[float]] = {name: [] for name in pipelines}
        tokens: dict[str, list[float]] = {name: [] for name in pipelines}
        turns: dict[str, list[float]] = {name: [] for name in pipelines}
        calls = 0
        for rep in range(args.repeats + 1):  # interleaved: each repeat runs both, the first round is a warm-up
            for name, fn in pipelines.items():
                n0 = server.counters()["engine_calls"]
                t0 = time.perf_counter()
                r = fn()
                t = time.perf_counter() - t0
                if rep == 0:
                    continue
                calls += server.counters()["engine_calls"] - n0
                times[name].append(t)
                tokens[name].append(float(r.mask.sum()))
                turns[name].append(float(r.extras["turns"].mean()))
        assert engine.faults == dict.fromkeys(engine.faults, 0), engine.faults
        out: dict[str, Any] = {}
        for name in pipelines:
            t = statistics.median(times[name])
            out[name] = {"episodes_s": args.episodes / t, "tokens_s": sum(tokens[name]) / sum(times[name]),
                         "seconds": t, "turns": statistics.mean(turns[name]), "times": times[name]}  # fmt: skip
        out["endpoint + harness"]["engine_calls"] = calls / args.repeats
        # per repeat: endpoint episodes/s ÷ tick-runner episodes/s of the same round, and per sampled token
        out["ratios"] = [a / b for a, b in zip(times["tick runner"], times["endpoint + harness"])]
        out["token_ratios"] = [
            (te / b) / (tt / a)
            for a, b, tt, te in zip(times["tick runner"], times["endpoint + harness"], tokens["tick runner"],
                                    tokens["endpoint + harness"])
        ]  # fmt: skip
    finally:
        server.stop()
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
    steps = [r["time_step_s"] + r.get("time_gen_s", 0.0) for r in rows[1:]] or [rows[0]["time_s"]]
    s = statistics.median(steps)
    return {"s_per_step": s, "episodes_s": args.episodes / s, "tool_calls": rows[-1].get("episode/tool_calls", 0.0),
            "model_tokens": rows[-1].get("episode/model_tokens", 0.0)}  # fmt: skip


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
    logs = [h for h in trainer.state.log_history if "tools/call_frequency" in h]
    calls = statistics.mean(float(h["tools/call_frequency"]) for h in logs) if logs else float("nan")
    length = statistics.mean(float(h["completions/mean_length"]) for h in logs) if logs else float("nan")
    return {"s_per_step": s, "episodes_s": per_step / s, "tool_call_frequency": calls, "mean_length": length}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny-agent")
    ap.add_argument("--episodes", type=int, default=32)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--turn-tokens", type=int, default=24)
    ap.add_argument("--latency", type=float, default=0.05)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--gather-s", type=float, default=0.25, help="agent.serve_gather_s (0: the plain 5 ms window)")
    ap.add_argument("--trl-steps", type=int, default=0, help="RL steps of each trainer (0: skip the RL-step rows)")
    ap.add_argument(
        "--chat-model", default="tiny-chat", help="the model of the RL-step rows (a tool-calling chat base)"
    )
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    print(f"# load average at start: {os.getloadavg()}; torch threads {torch.get_num_threads()}")
    rows = bench_p3o(args)
    ep = rows["endpoint + harness"]
    print(f"{'pipeline':<28}{'episodes/s':>12}{'tokens/s':>12}{'turns':>8}")
    for name in ("tick runner", "endpoint + harness"):
        r = rows[name]
        print(f"{name:<28}{r['episodes_s']:>12.2f}{r['tokens_s']:>12.1f}{r['turns']:>8.2f}")
    print(f"endpoint engine calls per round of {args.episodes} episodes: {ep['engine_calls']:.1f}")
    ratios, token_ratios = rows["ratios"], rows["token_ratios"]
    ratio = statistics.median(ratios)
    overhead = 1 / ratio - 1
    print(
        f"endpoint episodes/s ÷ tick-runner episodes/s, per interleaved repeat: "
        f"{' '.join(f'{x:.3f}' for x in ratios)}; median {ratio:.3f} (range {min(ratios):.3f}-{max(ratios):.3f})"
    )
    print(f"the same per sampled token: {' '.join(f'{x:.3f}' for x in token_ratios)}; "
          f"median {statistics.median(token_ratios):.3f}")  # fmt: skip
    print(f"endpoint overhead vs the tick runner (median ratio): {overhead:+.1%}")
    result: dict[str, Any] = {"rows": rows, "overhead": overhead, "args": vars(args)}
    if args.trl_steps > 0:
        p3o_step = bench_p3o_step(args)
        trl = bench_trl(args)
        print(f"RL step of {args.episodes} episodes on {args.chat_model} (calc-small, calculator tool):")
        print(f"{'pipeline':<28}{'s/step':>10}{'episodes/s':>12}{'tool calls/episode':>20}")
        print(f"{'p3o train --agent.harness':<28}{p3o_step['s_per_step']:>10.2f}{p3o_step['episodes_s']:>12.2f}"
              f"{p3o_step['tool_calls']:>20.2f}")  # fmt: skip
        print(f"{'TRL GRPOTrainer (tools=)':<28}{trl['s_per_step']:>10.2f}{trl['episodes_s']:>12.2f}"
              f"{trl['tool_call_frequency']:>20.2f}")  # fmt: skip
        print(f"TRL s/step ÷ p3o s/step: {trl['s_per_step'] / p3o_step['s_per_step']:.2f}")
        result["p3o_s_per_step"], result["trl"] = p3o_step, trl
    print(f"# load average at end: {os.getloadavg()}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
