"""The calc task: arithmetic the tiny model cannot do reliably in its head, made for a calculator tool.

Multiplications of a 3–4 digit number by a 2–3 digit number, and additions of three 4–6 digit numbers. The answer is
an integer after ``#### `` (the ``exact-int`` verifier, like the arithmetic task); the worked solution, for a warm
start without the tool, is one line:

    What is 4821 * 37?
    4821 * 37 = 178377
    #### 178377

Problem `index` of a split is a pure function of (seed, split, index, kind): draws from an RNG seeded with them until
one lands in the split. Splits are disjoint by construction: a problem is "test" iff a hash of its expression falls
in the test bucket (`p3o.tasks.arithmetic.split_of`), so no held-out problem is ever trained on.

    problems = load_calc("train", seed=0, n=512)       # p3o.envs "calc" episodes run on these
"""

from __future__ import annotations

import random

from p3o.errors import ConfigError
from p3o.tasks.arithmetic import SPLITS, split_of
from p3o.tasks.base import Problem

VERIFIER = "exact-int"
KINDS = ("mul", "add", "mix", "small")


def _draw(rng: random.Random, kind: str) -> tuple[str, int]:
    """(expression, value) of one problem of `kind` ("mul" or "add")."""
    if kind == "mul":
        a = rng.randint(100, 9999)
        b = rng.randint(10, 999)
        return f"{a} * {b}", a * b
    if kind == "small":  # the tiny model's testbed: it restates 1-2 digit numbers but never learned to multiply
        a = rng.randint(11, 99)
        b = rng.randint(3, 9)
        return f"{a} * {b}", a * b
    terms = [rng.randint(1000, 999999) for _ in range(3)]
    return " + ".join(map(str, terms)), sum(terms)


def calc_problem(index: int, split: str = "train", *, seed: int = 0, kind: str = "mix") -> Problem:
    """Problem `index` of `split` (deterministic in seed, split, index and kind)."""
    if split not in SPLITS:
        raise ConfigError(f"calc task: unknown split {split!r}; known: {', '.join(SPLITS)}")
    if kind not in KINDS:
        raise ConfigError(f"calc task: unknown kind {kind!r}; known: {', '.join(KINDS)}")
    for attempt in range(10_000):
        rng = random.Random(f"p3o-calc|{seed}|{index}|{kind}|{attempt}")
        k = kind if kind != "mix" else rng.choice(("mul", "add"))
        expr, value = _draw(rng, k)
        key = "calc|" + expr.replace(" ", "")
        if split_of(key) == split:
            break
    return Problem(
        prompt=f"What is {expr}?",
        answer=str(value),
        solution=f"{expr} = {value}\n#### {value}",
        meta={
            "verifier": VERIFIER,
            "answer_format": "####",
            "source": "calc",
            "kind": k,
            "expression": expr,
            "key": key,
            "index": index,
        },
    )


def load_calc(split: str = "train", *, seed: int = 0, n: int | None = None, kind: str = "mix") -> list[Problem]:
    """Problems 0..n-1 (default 1000) of `split`: "train" or "test", never sharing a problem.

    Args:
        kind: "mul" (3–4 digit × 2–3 digit), "add" (three 4–6 digit numbers), "mix" (each problem one of the two)
            or "small" (2 digit × 1 digit: the built-in tiny model's agent testbed, ``calc-small``).
    """
    n = 1000 if n is None else int(n)
    if n < 0:
        raise ConfigError(f"calc task: n must be >= 0, got {n}")
    return [calc_problem(i, split, seed=seed, kind=kind) for i in range(n)]
