"""Held-out pass@1 of a chat base's full tool-calling episodes on calc-small (``tiny-chat``'s figure).

    python -m p3o.models.chat_eval                          # tiny-chat, 256 held-out problems, one episode each
    python -m p3o.models.chat_eval --model DIR --n 64 --seed 1

An episode is what the example ``openai``-SDK harness runs through p3o's endpoint, here in process: the prompt is
the chat template with the calculator tool (`p3o.models.chat.CALCULATOR_TOOL`) and the problem as the user message;
each model turn is sampled by p3o's HF engine (temperature 1, no truncation, at most ``max_new_tokens``, stopping at
``<|im_end|>``); its ``<tool_call>`` JSON is parsed (`p3o.envs.tools.parse_tool_calls`, Qwen style) and run by the
calculator (`p3o.envs.tools.calculator`: parsed with ``ast``, never evaluated as code), the results are appended as
``tool`` messages (the fixed-base delta of `p3o.envs.render.Renderer`: nothing sampled is re-tokenised), and the
first turn without a call ends the episode, scored by the calc task's ``exact-int`` verifier on its ``#### N``. An
episode out of turns or context scores 0. pass@1 = mean reward over the problems (one episode each).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any

from p3o.envs.render import Renderer
from p3o.envs.tools import ParseError, ToolCall, calculator, parse_tool_calls
from p3o.models.chat import CALCULATOR_TOOL, CHAT_NAME
from p3o.models.hub import load_policy
from p3o.rewards.verifiers import exact_int
from p3o.rollout.hf import HFEngine
from p3o.tasks.base import Problem
from p3o.tasks.calc import load_calc

__all__ = ["EpisodeStats", "main", "run_episodes", "tool_output"]


@dataclass
class EpisodeStats:
    """Per-problem outcomes of `run_episodes`: reward (1.0 right), tool calls made, model turns taken."""

    rewards: list[float]
    calls: list[int]
    turns: list[int]

    @property
    def pass1(self) -> float:
        """Mean reward: pass@1 with one episode per problem."""
        return sum(self.rewards) / max(1, len(self.rewards))


def tool_output(call: ToolCall | ParseError) -> str:
    """What the harness's calculator answers a parsed call: the integer (or exact decimal), else ``error: ...``."""
    if isinstance(call, ParseError):
        return call.message
    if call.name != CALCULATOR_TOOL["function"]["name"]:
        return f"error: unknown tool {call.name!r}"
    try:
        return calculator(call.arguments)
    except (ValueError, ZeroDivisionError, OverflowError) as err:
        return f"error: {err}"


def run_episodes(
    model: Any,
    tok: Any,
    problems: list[Problem],
    *,
    seed: int = 0,
    max_turns: int = 3,
    max_new_tokens: int = 64,
) -> EpisodeStats:
    """One full episode per problem, all problems batched turn by turn (the module docstring)."""
    renderer = Renderer(tok, mode="chat", max_obs_tokens=64, tools=[CALCULATOR_TOOL])
    engine = HFEngine(model, tok, temperature=1.0, max_new_tokens=max_new_tokens, seed=seed)
    context = int(model.config.max_position_embeddings)
    ids = [renderer.prompt_ids([{"role": "user", "content": p.prompt}]) for p in problems]
    n = len(problems)
    stats = EpisodeStats([0.0] * n, [0] * n, [0] * n)
    active = [i for i in range(n) if len(ids[i]) + max_new_tokens <= context]
    for turn in range(max_turns):
        if not active:
            break
        out = engine.generate([ids[i] for i in active], n=1, seed=seed * 1000 + turn)
        still = []
        for row, i in enumerate(active):
            sampled = out.response_ids[row][out.mask[row]].tolist()
            text = tok.decode(sampled, skip_special_tokens=False)
            stats.turns[i] += 1
            calls = parse_tool_calls(text, style="qwen")
            if not calls:
                stats.rewards[i] = exact_int(text, problems[i].answer)
                continue
            stats.calls[i] += sum(isinstance(c, ToolCall) for c in calls)
            observation = [{"role": "tool", "content": tool_output(c)} for c in calls]
            ended = bool(sampled) and sampled[-1] == tok.eos_token_id
            ids[i] = ids[i] + sampled + renderer.observation_ids(observation, turn_ended_with_eos=ended)
            if len(ids[i]) + max_new_tokens <= context:
                still.append(i)
        active = still
    return stats


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m p3o.models.chat_eval", description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=CHAT_NAME, help="a chat base: tiny-chat (default) or a model directory")
    parser.add_argument("--n", type=int, default=256, help="held-out calc-small problems, one episode each")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed")
    parser.add_argument("--max-turns", type=int, default=3, help="model turns per episode")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="tokens per model turn")
    args = parser.parse_args(argv)
    model, tok = load_policy(args.model)
    problems = load_calc("test", kind="small", n=args.n)
    s = run_episodes(
        model, tok, problems, seed=args.seed, max_turns=args.max_turns, max_new_tokens=args.max_new_tokens
    )
    k = max(1, len(problems))
    print(
        f"{args.model}: held-out pass@1 {s.pass1:.3f} on {len(problems)} calc-small problems (seed {args.seed}); "
        f"tool calls per episode {sum(s.calls) / k:.2f}, turns per episode {sum(s.turns) / k:.2f}, episodes that "
        f"called the tool {sum(c > 0 for c in s.calls) / k:.2f}"
    )
    return 0


if __name__ == "__main__":  # pragma: no cover - python -m p3o.models.chat_eval
    sys.exit(main())
