"""The scratchpad testbed: long addition / subtraction chains whose worked solution is written in varied ways.

The same kind of problem as the arithmetic task (`p3o.tasks.arithmetic`: a chain of one-digit additions and
subtractions on a running value below 100, as a word problem or an expression), but longer (7 steps), and each
step of the worked solution is written in one of several equivalent ways drawn at random: an addition in either
operand order, and after any step, half of the time, a check line that undoes it. So the SFT data holds genuine
choices on many lines: a policy warm-started on it stays uncertain over many tokens (which way to write the
next line, whether to check) while its answer after `####` stays checkable by the same `exact-int` verifier:

    What is 7 + 5 - 3 + 8 - 6 + 9?
    5 + 7 = 12
    check: 12 - 5 = 7
    12 - 3 = 9
    9 + 8 = 17
    8 + 17 = ...

(one draw of many; see `step_lines`). Levels (`PAD_LEVELS`): ``pad-1`` 3 steps, ``pad`` 7 steps (responses of
60–175 tokens with the built-in tokenizer, 108 on average), ``pad-hard`` 10 steps. The lines keep the arithmetic task's
`x op b = y` form, so the main job's base (`tiny`) is a good starting point for the warm start.

Splits are the arithmetic task's (a hash of the canonical chain), so no scratchpad test chain is trained on.

    problems = load_scratchpad("train", seed=0, n=1000, difficulty="pad")
"""

from __future__ import annotations

import random

from p3o.tasks.arithmetic import LEVELS, canonical, expression, split_of, word_problem
from p3o.tasks.base import Problem

VERIFIER = "exact-int"
PAD_LEVELS: dict[str, int] = {"pad-1": 3, "pad": 7, "pad-hard": 10}  # name -> steps
CAP = 100  # running values stay in [0, CAP)
CHECK_P = 0.5  # share of steps followed by a check line
_CHECK = ["check: {y} {inv} {b} = {x}", "{y} {inv} {b} = {x}", "back: {y} {inv} {b} = {x}", "so {y} {inv} {b} = {x}"]


def is_level(difficulty: object) -> bool:
    """Is `difficulty` a level of the built-in task: 1..5 (`p3o.tasks.arithmetic.LEVELS`) or a PAD_LEVELS name?"""
    return difficulty in PAD_LEVELS or (isinstance(difficulty, int) and difficulty in LEVELS)


def step_lines(rng: random.Random, x: int, op: str, b: int) -> tuple[list[str], int]:
    """The worked lines of one step `x op b` and its value y.

    The step line is `x + b = y` or `b + x = y` (either order, for +) or `x - b = y`; half of the time (CHECK_P) a
    check line that undoes it follows, `y − b = x` (for +) or `y + b = x` (for −), in one of four wordings.
    """
    y = x + b if op == "+" else x - b
    line = f"{b} + {x} = {y}" if op == "+" and rng.random() < 0.5 else f"{x} {op} {b} = {y}"
    lines = [line]
    if rng.random() < CHECK_P:
        lines.append(rng.choice(_CHECK).format(y=y, inv="-" if op == "+" else "+", b=b, x=x))
    return lines, y


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
    """The chain as a word problem or "What is <expr>?" (half each) with a scratchpad ending in `#### <answer>`."""
    kind = rng.choice(("word", "expr"))
    expr = expression(start, chain)
    prompt = word_problem(rng, start, chain) if kind == "word" else f"What is {expr}?"
    x, lines = start, []
    for op, b in chain:
        step, x = step_lines(rng, x, op, b)
        lines += step
    return Problem(
        prompt=prompt,
        answer=str(x),
        solution="\n".join([*lines, f"#### {x}"]),
        meta={
            "verifier": VERIFIER,
            "answer_format": "####",
            "source": "arithmetic",
            "kind": kind,
            "difficulty": difficulty,
            "expression": expr,
            "key": canonical(start, chain),
        },
    )


def load_scratchpad(split: str, *, seed: int = 0, n: int = 1000, difficulty: str = "pad") -> list[Problem]:
    """`n` distinct problems of `split` ("train" | "test"), deterministic in (split, seed, n, difficulty)."""
    steps = PAD_LEVELS[difficulty]
    rng = random.Random(f"p3o-scratchpad|{split}|{seed}|{difficulty}")
    out: list[Problem] = []
    seen: set[str] = set()
    while len(out) < n:
        start, chain = sample_chain(rng, steps)
        key = canonical(start, chain)
        if split_of(key) != split or key in seen:
            continue
        seen.add(key)
        out.append(make_pad_problem(rng, start, chain, difficulty))
    return out
