"""The built-in environments: ``calc`` (arithmetic with a calculator tool) and ``guess`` (higher / lower feedback).

calc: the model may call the calculator, ``<calc>4821 * 37</calc>`` (the turn stops at ``</calc>``), reads the
result (a role "tool" message, rendered inline as ``<result>178377</result>`` for the tiny model) and answers
``#### 178377``; the episode ends at the first turn without a call, reward 1.0 iff that turn's answer is right
(``exact-int``). With ``style="qwen"`` the call is ``<tool_call>{"name": "calc", "arguments": {"expression": ...}}
</tool_call>`` (a chat model with a Qwen3-style template).

guess: a secret integer in [low, high]; each turn answers ``#### N`` and reads "higher" or "lower" (a role "user"
message); reward 1.0 on a hit, which ends the episode (so does ``max_guesses``, if set).

    env = CalcEnv()
    messages = env.reset(load_calc("test", n=1)[0], seed=0)
    step = env.step("<calc>4821 * 37</calc>")        # Step(observation=[{"role": "tool", "content": "178377"}])
    step = env.step("\\n#### 178377")                 # Step(reward=1.0, done=True)
"""

from __future__ import annotations

import json
import random
from typing import Any

from p3o.envs.base import EnvLimits, Message, Step
from p3o.envs.tools import CALCULATOR, STYLES, ToolRunner, parse_tool_calls, shared_runner, tool_info
from p3o.errors import ConfigError
from p3o.rewards.extract import hash_answer, parse_int
from p3o.rewards.verifiers import exact_int
from p3o.tasks.arithmetic import split_of
from p3o.tasks.base import Problem

__all__ = ["CalcEnv", "GuessEnv", "calc_prompt", "calc_transcript", "guess_problems"]

_STOPS = {"calc": ("</calc>",), "qwen": ("</tool_call>",)}


def calc_prompt(problem: Problem, style: str = "calc") -> str:
    """The user message of a calc episode: the question, how to call the tool, the answer format."""
    how = "<calc>expression</calc>" if style == "calc" else "the calc tool"
    return f"{problem.prompt.strip()}\nUse {how} to compute. Write the final answer as '#### <number>'."


def calc_transcript(problem: Problem, use_tool: bool = True, style: str = "calc") -> list[Message]:
    """A correct episode for `problem` as messages after the prompt (for warm starts; `Renderer.transcript` turns
    them into ids and a loss mask exactly as an episode is built).

    With the tool: the call (a turn ending at the stop string), its result (role "tool"), the final answer::

        [{"role": "assistant", "content": "<calc>4821 * 37</calc>"},
         {"role": "tool", "content": "178377"},
         {"role": "assistant", "content": "\\n#### 178377"}]

    Without: one turn, the problem's worked solution (``4821 * 37 = 178377\\n#### 178377``).
    """
    if style not in STYLES:
        raise ConfigError(f"calc transcript: unknown style {style!r}; known: {', '.join(STYLES)}")
    answer = problem.answer
    if not use_tool:
        return [{"role": "assistant", "content": problem.solution or f"#### {answer}"}]
    expr = str(problem.meta.get("expression") or problem.prompt.removeprefix("What is ").rstrip("?"))
    if style == "calc":
        call, final = f"<calc>{expr}</calc>", f"\n#### {answer}"
    else:
        body = json.dumps({"name": "calc", "arguments": {"expression": expr}})
        call, final = f"<tool_call>\n{body}\n</tool_call>", f"#### {answer}"
    return [
        {"role": "assistant", "content": call},
        {"role": "tool", "content": answer},
        {"role": "assistant", "content": final},
    ]


class CalcEnv:
    """Arithmetic with a calculator tool (see the module docstring).

    Args:
        style: "calc" (``<calc>EXPR</calc>``, plain rendering, the tiny model) or "qwen" (``<tool_call>`` JSON,
            chat rendering).
        limits: the episode limits (``tool_timeout_s``, ``max_tool_output_chars`` are used here).
        runner: the `ToolRunner` to use; None: the process-wide one for these settings (`shared_runner`).
        latency_s: an artificial delay per tool call (benchmarks).
        max_calls_per_turn: calls run per turn; more are a parse error.
        workers: tool worker processes of the shared runner (calls of concurrent episodes run in parallel).
    """

    name = "calc"

    def __init__(
        self,
        style: str = "calc",
        limits: EnvLimits | None = None,
        runner: ToolRunner | None = None,
        latency_s: float = 0.0,
        max_calls_per_turn: int = 4,
        workers: int = 2,
    ) -> None:
        if style not in STYLES:
            raise ConfigError(f"environment 'calc': unknown style {style!r}; known: {', '.join(STYLES)}")
        self.style = style
        self.stop_strings: tuple[str, ...] = _STOPS[style]
        self.render_mode = "plain" if style == "calc" else "chat"
        self.tools = [CALCULATOR.schema]
        self.limits = limits or EnvLimits()
        self.latency_s = float(latency_s)
        self.max_calls_per_turn = int(max_calls_per_turn)
        self.workers = int(workers)
        self._runner = runner
        self.answer = ""

    @property
    def runner(self) -> ToolRunner:
        if self._runner is None or self._runner.closed:
            self._runner = shared_runner(
                [CALCULATOR],
                self.limits.tool_timeout_s,
                self.limits.max_tool_output_chars,
                self.latency_s,
                self.workers,
            )
        return self._runner

    def reset(self, problem: Problem, seed: int) -> list[Message]:
        self.answer = problem.answer
        return [{"role": "user", "content": calc_prompt(problem, self.style)}]

    def step(self, turn: str) -> Step:
        calls = parse_tool_calls(turn, self.style, self.max_calls_per_turn)
        if not calls:
            return Step(reward=exact_int(turn, self.answer), done=True, info=tool_info([]))
        results = self.runner.run_many(calls)
        observation = [{"role": "tool", "content": r.output} for r in results]
        return Step(observation=observation, info=tool_info(results))

    def close(self) -> None:
        """Nothing to release: the tool workers are shared and stay up."""


class GuessEnv:
    """Guess a secret number with higher / lower feedback (see the module docstring).

    Args:
        max_guesses: end the episode (reward 0) after this many guesses; None: the runner's ``agent.max_turns``.
    """

    name = "guess"
    stop_strings: tuple[str, ...] = ()

    def __init__(self, max_guesses: int | None = None) -> None:
        if max_guesses is not None and int(max_guesses) < 1:
            raise ConfigError(f"environment 'guess': max_guesses must be >= 1, got {max_guesses}")
        self.max_guesses = max_guesses
        self.secret = 0
        self.guesses = 0

    def reset(self, problem: Problem, seed: int) -> list[Message]:
        self.secret = int(problem.answer)
        self.guesses = 0
        low, high = problem.meta.get("low", 1), problem.meta.get("high", 100)
        return [{"role": "user", "content": problem.prompt or _guess_prompt(low, high)}]

    def step(self, turn: str) -> Step:
        found = hash_answer(turn)
        guess = parse_int(found) if found is not None else None
        if guess is None:
            return Step([{"role": "user", "content": "Answer with '#### <number>'."}], info={"parse_errors": 1.0})
        self.guesses += 1
        if guess == self.secret:
            return Step(reward=1.0, done=True, info={"guesses": float(self.guesses)})
        if self.max_guesses is not None and self.guesses >= int(self.max_guesses):
            return Step(done=True, info={"guesses": float(self.guesses)})
        hint = "higher" if guess < self.secret else "lower"
        return Step([{"role": "user", "content": f"{hint}"}], info={"guesses": float(self.guesses)})

    def close(self) -> None:
        """Nothing to release."""


def _guess_prompt(low: int, high: int) -> str:
    return (
        f"I am thinking of a number from {low} to {high}. Guess it: answer with '#### <number>'. "
        "After each guess I say higher or lower."
    )


def guess_problems(
    split: str = "train", *, seed: int = 0, n: int | None = None, low: int = 1, high: int = 100
) -> list[Problem]:
    """`n` guess-a-number problems (default 100): secrets in [low, high], "train" and "test" never share one (a hash
    of the secret), deterministic in (split, seed, n, low, high)."""
    if not int(low) < int(high):
        raise ConfigError(f"guess task: low must be < high, got {low}, {high}")
    secrets = [x for x in range(int(low), int(high) + 1) if split_of(f"guess|{low}|{high}|{x}") == split]
    if not secrets:
        raise ConfigError(f"guess task: no {split!r} secrets in [{low}, {high}] (widen the range)")
    rng = random.Random(f"p3o-guess|{split}|{seed}|{low}|{high}")
    n = 100 if n is None else int(n)
    prompt = _guess_prompt(int(low), int(high))
    meta: dict[str, Any] = {"verifier": "exact-int", "answer_format": "####", "source": "guess"}
    return [
        Problem(prompt, str(rng.choice(secrets)), "", {**meta, "low": int(low), "high": int(high), "index": i})
        for i in range(n)
    ]
