"""The scratchpad testbed: multi-digit addition and subtraction chains solved column by column, in varied words.

The same chains as the arithmetic task (`p3o.tasks.arithmetic`), but the worked solution does every step digit
by digit, with carries and borrows, and each line is written in one of several equivalent ways drawn at random
(which operand first, where the carry goes, which word writes the digit, how the step is summed up). So the SFT
data holds genuine choices over many tokens: a warm-started policy stays uncertain (token entropy well above the
main task's) while its answer after `####` stays checkable by the same `exact-int` verifier:

    What is 58 + 67 - 39?
    58 + 67:
    ones: 8 + 7 = 15, write 5 carry 1
    tens: 1 + 5 + 6 = 12, write 12
    so 58 + 67 = 125
    125 - 39:
    ones: 15 - 9 = 6, borrow 1
    tens: 2 - 1 - 3 = -2 ...

(the exact wording above is one draw of many; see `step_lines`). Difficulties:

* ``pad-1``: one such step (about 40–70 tokens): mixed into the warm start's data, it teaches the single step;
* ``pad``: 2 steps of + / - on 2-digit operands (running values below 1000), about 90–170 tokens;
* ``pad-hard``: 3 steps on 3-digit operands (running values below 10000), about 120–250 tokens.

Splits are the arithmetic task's (a hash of the canonical chain), so no scratchpad test chain is trained on.

    problems = load_scratchpad("train", seed=0, n=1000, difficulty="pad")
"""

from __future__ import annotations

import random

from p3o.tasks.arithmetic import LEVELS, canonical, expression, split_of
from p3o.tasks.base import Problem

VERIFIER = "exact-int"
PAD_LEVELS: dict[str, tuple[int, int]] = {"pad-1": (1, 2), "pad": (2, 2), "pad-hard": (3, 3)}  # -> (steps, digits)
_PLACES = ["ones", "tens", "hundreds", "thousands", "ten-thousands"]
_WRITE = ["write {d}", "put {d}", "{d} down", "keep {d}"]
_CARRY = ["carry 1", "1 up", "+1 next"]
_SUMMARY = ["so {y}", "= {y}", "{x}{op}{b}={y}", "gives {y}"]
_HEADER = ["{x}{op}{b}:", "{x} {op} {b}:", "do {x}{op}{b}"]


def is_level(difficulty: object) -> bool:
    """Is `difficulty` a level of the built-in task: 1..5 (`p3o.tasks.arithmetic.LEVELS`) or a PAD_LEVELS name?"""
    return difficulty in PAD_LEVELS or (isinstance(difficulty, int) and difficulty in LEVELS)


def _digits(x: int, width: int) -> list[int]:
    """Least significant first, zero-padded to `width`."""
    return [(x // 10**i) % 10 for i in range(width)]


def _label(rng: random.Random, i: int) -> str:
    return rng.choice([_PLACES[i], f"c{i + 1}"])


def _join(rng: random.Random, terms: list[str], op: str) -> str:
    """`terms` joined by `op`, tight ("5+9") or spaced ("5 + 9") at random."""
    return (f" {op} " if rng.random() < 0.5 else op).join(terms)


def add_lines(rng: random.Random, x: int, b: int) -> list[str]:
    """Column addition of x + b, ones first, one line per column (and a last line for a final carry)."""
    width = max(len(str(x)), len(str(b)))
    xs, bs = _digits(x, width), _digits(b, width)
    carry, lines = 0, []
    for i in range(width):
        terms = [str(xs[i]), str(bs[i])]
        if rng.random() < 0.5:
            terms.reverse()
        if carry:
            terms.insert(0 if rng.random() < 0.5 else 2, "1")
        s = xs[i] + bs[i] + carry
        last = i == width - 1
        tail = rng.choice(_WRITE).format(d=s % 10 if not last else s)
        if s >= 10 and not last:
            tail += f", {rng.choice(_CARRY)}"
        lines.append(f"{_label(rng, i)}: {_join(rng, terms, '+')}={s}, {tail}")
        carry = 1 if s >= 10 else 0
    return lines


def sub_lines(rng: random.Random, x: int, b: int) -> list[str]:
    """Column subtraction of x − b (x ≥ b), ones first, borrowing 10 from the next column when needed."""
    width = len(str(x))
    xs, bs = _digits(x, width), _digits(b, width)
    borrow, lines = 0, []
    for i in range(width):
        top = xs[i] - borrow
        need = top < bs[i]
        d = top + 10 - bs[i] if need else top - bs[i]
        terms = [str(xs[i]), *(["1"] if borrow else []), str(bs[i])]
        if need:
            terms[0] = f"1{xs[i]}"  # the column borrows ten: 4 - 7 becomes 14 - 7
        body = f"{_join(rng, terms, '-')}={d}"
        if need:
            body = rng.choice(["borrow, {t}", "{t}, borrow", "{t} b1"]).format(t=body)
        lines.append(f"{_label(rng, i)}: {body}, {rng.choice(_WRITE).format(d=d)}")
        borrow = 1 if need else 0
    return lines


def step_lines(rng: random.Random, x: int, op: str, b: int) -> tuple[list[str], int]:
    """The worked lines of one step `x op b` (header, columns, summary) and its value."""
    y = x + b if op == "+" else x - b
    cols = add_lines(rng, x, b) if op == "+" else sub_lines(rng, x, b)
    head = rng.choice(_HEADER).format(x=x, op=op, b=b)
    tail = rng.choice(_SUMMARY).format(x=x, op=op, b=b, y=y)
    return [head, *cols, tail], y


def _sample_chain(rng: random.Random, steps: int, digits: int) -> tuple[int, list[tuple[str, int]]]:
    """A start value and `steps` (op, operand) pairs with + / -; every value stays in [0, 10**(digits+1))."""
    top, cap = 10**digits - 1, 10 ** (digits + 1)
    start = x = rng.randint(10 ** (digits - 1), top)
    chain: list[tuple[str, int]] = []
    for _ in range(steps):
        op = "-" if x >= 10 ** (digits - 1) and rng.random() < 0.5 else "+"
        if op == "+":
            b = rng.randint(10 ** (digits - 1), min(top, cap - 1 - x))
            x += b
        else:
            b = rng.randint(1, min(top, x))
            x -= b
        chain.append((op, b))
    return start, chain


def make_pad_problem(rng: random.Random, start: int, chain: list[tuple[str, int]], difficulty: str) -> Problem:
    """The chain as "What is <expr>?" with a scratchpad solution ending in `#### <answer>`."""
    x, lines = start, []
    for op, b in chain:
        step, x = step_lines(rng, x, op, b)
        lines += step
    expr = expression(start, chain)
    return Problem(
        prompt=f"What is {expr}?",
        answer=str(x),
        solution="\n".join([*lines, f"#### {x}"]),
        meta={
            "verifier": VERIFIER,
            "answer_format": "####",
            "source": "arithmetic",
            "kind": "pad",
            "difficulty": difficulty,
            "expression": expr,
            "key": canonical(start, chain),
        },
    )


def load_scratchpad(split: str, *, seed: int = 0, n: int = 1000, difficulty: str = "pad") -> list[Problem]:
    """`n` distinct problems of `split` ("train" | "test"), deterministic in (split, seed, n, difficulty)."""
    steps, digits = PAD_LEVELS[difficulty]
    rng = random.Random(f"p3o-scratchpad|{split}|{seed}|{difficulty}")
    out: list[Problem] = []
    seen: set[str] = set()
    misses = 0
    while len(out) < n:
        start, chain = _sample_chain(rng, steps, digits)
        key = canonical(start, chain)
        if split_of(key) != split:
            continue
        if key in seen and misses < 2000:
            misses += 1
            continue
        seen.add(key)
        out.append(make_pad_problem(rng, start, chain, difficulty))
    return out
