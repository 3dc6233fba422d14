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

The "small" kind (2 digit × 1 digit, the tiny agent's testbed ``calc-small``) is a finite space of 89 × 7 = 623
products, too small for a 10 % test bucket (55 problems: a pass@1 standard error of ~0.067). Its split is its own
hash bucket, half and half (`SMALL_TEST_PERCENT`: 314 test problems, 309 train), and a split's problems are its
members in a seeded order, cycled: problems 0..n-1 are n distinct ones for n up to the split's size, so a held-out
set of 256 is 256 different expressions (standard error ≤ 0.031).

    problems = load_calc("train", seed=0, n=512)       # p3o.envs "calc" episodes run on these
"""

from __future__ import annotations

import functools
import hashlib
import random

from p3o.errors import ConfigError
from p3o.tasks.arithmetic import SPLITS, split_of
from p3o.tasks.base import Problem

VERIFIER = "exact-int"
KINDS = ("mul", "add", "mix", "small")
SMALL_TEST_PERCENT = 50
"""Share (of 100 hash buckets) of the "small" space that is held out: 314 of its 623 problems."""


def _draw(rng: random.Random, kind: str) -> tuple[str, int]:
    """(expression, value) of one problem of `kind` ("mul" or "add"; "small" is enumerated, `small_space`)."""
    if kind == "mul":
        a = rng.randint(100, 9999)
        b = rng.randint(10, 999)
        return f"{a} * {b}", a * b
    terms = [rng.randint(1000, 999999) for _ in range(3)]
    return " + ".join(map(str, terms)), sum(terms)


def _small_split(key: str) -> str:
    """ "test" when sha256(key) falls in the first `SMALL_TEST_PERCENT` of 100 buckets, else "train"."""
    bucket = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") % 100
    return "test" if bucket < SMALL_TEST_PERCENT else "train"


@functools.cache
def small_space(split: str, seed: int = 0) -> tuple[tuple[str, int], ...]:
    """The (expression, value) pairs of the "small" kind in `split`, in the order seeded by `seed` (all distinct)."""
    members = [(f"{a} * {b}", a * b) for a in range(11, 100) for b in range(3, 10)]
    members = [m for m in members if _small_split("calc|" + m[0].replace(" ", "")) == split]
    random.Random(f"p3o-calc-small|{seed}|{split}").shuffle(members)
    return tuple(members)


def calc_problem(index: int, split: str = "train", *, seed: int = 0, kind: str = "mix") -> Problem:
    """Problem `index` of `split` (deterministic in seed, split, index and kind)."""
    if split not in SPLITS:
        raise ConfigError(f"calc task: unknown split {split!r}; known: {', '.join(SPLITS)}")
    if kind not in KINDS:
        raise ConfigError(f"calc task: unknown kind {kind!r}; known: {', '.join(KINDS)}")
    if kind == "small":
        space = small_space(split, seed)
        expr, value = space[index % len(space)]
        return _problem(expr, value, "small", index)
    for attempt in range(10_000):
        rng = random.Random(f"p3o-calc|{seed}|{index}|{kind}|{attempt}")
        k = kind if kind != "mix" else rng.choice(("mul", "add"))
        expr, value = _draw(rng, k)
        key = "calc|" + expr.replace(" ", "")
        if split_of(key) == split:
            break
    return _problem(expr, value, k, index)


def _problem(expr: str, value: int, kind: str, index: int) -> Problem:
    """The Problem asking `expr` (its answer `value`)."""
    key = "calc|" + expr.replace(" ", "")
    return Problem(
        prompt=f"What is {expr}?",
        answer=str(value),
        solution=f"{expr} = {value}\n#### {value}",
        meta={
            "verifier": VERIFIER,
            "answer_format": "####",
            "source": "calc",
            "kind": kind,
            "expression": expr,
            "key": key,
            "index": index,
        },
    )


def load_calc(split: str = "train", *, seed: int = 0, n: int | None = None, kind: str = "mix") -> list[Problem]:
    """Problems 0..n-1 (default 1000) of `split`: "train" or "test", never sharing a problem.

    Args:
        kind: "mul" (3–4 digit × 2–3 digit), "add" (three 4–6 digit numbers), "mix" (each problem one of the two)
            or "small" (2 digit × 1 digit: the built-in tiny model's agent testbed, ``calc-small``; n distinct problems
            for n up to the split's size, 314 test / 309 train, then the same order again).
    """
    n = 1000 if n is None else int(n)
    if n < 0:
        raise ConfigError(f"calc task: n must be >= 0, got {n}")
    return [calc_problem(i, split, seed=seed, kind=kind) for i in range(n)]
