"""The scratchpad testbed: addition / subtraction chains whose worked solution is written in varied ways.

The same kind of problem as the arithmetic task (`p3o.tasks.arithmetic`: a chain of one-digit additions and
subtractions on a running value below 100, as a word problem or an expression), but longer (4 steps), with an
opening line and a worked line per step, each written in one of several equivalent ways drawn at random: the
opening in three wordings, an addition in either operand order, and after a step, with probability NOTE_P, a note
that restates the running value in one of six wordings. So the SFT data holds genuine choices on many lines: a
policy warm-started on it stays uncertain over many tokens (how to open, which way to write the next line, whether
to restate) while its answer after `####` stays checkable by the same `exact-int` verifier, and every line ends
with the running value (the next step reads it there):

    What is 1 - 1 + 9 + 9 - 3?
    start: 1
    1 - 1 = 0
    9 + 0 = 9
    9 + 9 = 18
    we have 18
    18 - 3 = 15
    #### 15

(one draw of many; see `step_lines`). Levels (`PAD_LEVELS`): ``pad-1`` 1 step, ``pad`` 2 steps (the main job's
difficulty, written out), ``pad-hard`` 3 steps. The lines keep the arithmetic
task's `x op b = y` form, so the main job's base (`tiny`) is a good starting point for the warm start.

A first design (7 steps, check lines that undo a step, so that the last number written was not the running
value) gave 60–175-token responses but a base the 1m model could not make work: pass@1 0.04 after 400 warm-start
steps, no reward for RL to climb (docs/tasks.md, "The scratchpad testbed").

Splits are the arithmetic task's (a hash of the canonical chain), so no scratchpad test chain is trained on.

    problems = load_scratchpad("train", seed=0, n=1000, difficulty="pad")
"""

from __future__ import annotations

import dataclasses
import random

from p3o.tasks.arithmetic import LEVELS, draw_problems, make_problem
from p3o.tasks.base import Problem

VERIFIER = "exact-int"
PAD_LEVELS: dict[str, int] = {"pad-1": 1, "pad": 2, "pad-hard": 3}  # name -> steps
CAP = 100  # running values stay in [0, CAP)
_OPEN = ["start: {x}", "we begin with {x}", "first {x}"]
_NOTE = ["so {y}", "now {y}", "we have {y}", "total: {y}", "that makes {y}", "running total {y}"]


def is_level(difficulty: object) -> bool:
    """Is `difficulty` a level of the built-in task: 1..5 (`p3o.tasks.arithmetic.LEVELS`) or a PAD_LEVELS name?"""
    return difficulty in PAD_LEVELS or (isinstance(difficulty, int) and difficulty in LEVELS)


def step_lines(rng: random.Random, x: int, op: str, b: int) -> tuple[list[str], int]:
    """The worked lines of one step `x op b` and its value y.

    The step line is `x + b = y` or `b + x = y` (either order, for +) or `x - b = y`; a note line follows that
    restates the running value in one of six wordings (`so y`, `total: y`, ...). Every step is two lines, so the
    k-th step always sits on the same lines (a 1m model tracks the step by its line: a first design with optional
    lines broke that, see the module docstring), and every line ends with the running value.
    """
    y = x + b if op == "+" else x - b
    line = f"{b} + {x} = {y}" if op == "+" and rng.random() < 0.5 else f"{x} {op} {b} = {y}"
    return [line, rng.choice(_NOTE).format(y=y)], y


def sample_chain(rng: random.Random, steps: int) -> tuple[int, list[tuple[str, int]]]:
    """A one-digit start value and `steps` (op, one-digit operand) pairs; every value stays in [0, CAP)."""
    start = x = rng.randint(1, 9)
    chain: list[tuple[str, int]] = []
    for _ in range(steps):
        ops = [op for op in "+-" if (op == "+" and x + 1 < CAP) or (op == "-" and x >= 1)]
        op = rng.choice(ops)
        b = rng.randint(1, min(9, CAP - 1 - x)) if op == "+" else rng.randint(1, min(9, x))
        chain.append((op, b))
        x = x + b if op == "+" else x - b
    return start, chain


def make_pad_problem(rng: random.Random, start: int, chain: list[tuple[str, int]], difficulty: str) -> Problem:
    """The chain as a word problem or "What is <expr>?" (half each) with a scratchpad ending in `#### <answer>`.

    The prompt and metadata are the arithmetic task's (`p3o.tasks.arithmetic.make_problem`, same draws from `rng`);
    only the worked solution differs: `step_lines` per step, drawn after the prompt.
    """
    kind = rng.choice(("word", "expr"))
    problem = make_problem(rng, start, chain, kind, difficulty)
    x, lines = start, [rng.choice(_OPEN).format(x=start)]
    for op, b in chain:
        step, x = step_lines(rng, x, op, b)
        lines += step
    return dataclasses.replace(problem, answer=str(x), solution="\n".join([*lines, f"#### {x}"]))


def load_scratchpad(split: str, *, seed: int = 0, n: int = 1000, difficulty: str = "pad") -> list[Problem]:
    """`n` problems of `split` ("train" | "test"), deterministic in (split, seed, n, difficulty).

    Distinct while fresh chains are easy to find; a short level (``pad-1`` has under 200 chains) then repeats
    chains (each with a new draw of its wording) rather than fail, as `p3o.tasks.arithmetic.load_arithmetic` does.
    """
    steps = PAD_LEVELS[difficulty]
    rng = random.Random(f"p3o-scratchpad|{split}|{seed}|{difficulty}")
    return draw_problems(
        rng,
        n,
        split,
        lambda r: sample_chain(r, steps),
        lambda r, start, chain: make_pad_problem(r, start, chain, difficulty),
    )
