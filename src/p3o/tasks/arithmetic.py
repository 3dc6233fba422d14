"""The built-in offline task: procedurally generated multi-step integer arithmetic, as word problems or expressions.

Each problem is a chain `a op1 b1 op2 b2 ...` evaluated left to right (the expression form adds the parentheses
that make standard precedence agree). The worked solution writes one line per step and ends in `#### <answer>`:

    Mia has 7 marbles. She finds 5 more. She loses 3. How many marbles does Mia have now?
    7 + 5 = 12
    12 - 3 = 9
    #### 9

Splits are disjoint by construction: a problem belongs to "test" iff a hash of its canonical chain (`7+5-3`) falls
in the test bucket, so the word and expression forms of the same arithmetic always land in the same split.

    problems = load_arithmetic("train", seed=0, n=1000, difficulty=2)
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass, replace

from p3o.errors import ConfigError
from p3o.tasks.base import Problem

VERIFIER = "exact-int"  # the task's own verifier (`p3o.tasks.default_verifier`): integer answers after `####`
TEST_PERCENT = 10  # share of the canonical-problem hash space that belongs to the test split
SPLITS = ("train", "test")
KINDS = ("word", "expr", "mix")


@dataclass(frozen=True)
class Level:
    """A difficulty level.

    Attributes:
        steps: number of binary operations in the chain (the solution has this many lines before `####`).
        digits: operands of + and - have at most this many digits; running values stay below 10**(digits + 1).
        ops: the operators that may appear ("+", "-", "*", "/"); "*" and "/" take a one-digit operand 2..9,
            "/" only where the division is exact.
    """

    steps: int
    digits: int
    ops: str


LEVELS: dict[int, Level] = {
    1: Level(steps=1, digits=1, ops="+-"),
    2: Level(steps=2, digits=1, ops="+-"),
    3: Level(steps=2, digits=2, ops="+-*"),
    4: Level(steps=3, digits=2, ops="+-*"),
    5: Level(steps=4, digits=3, ops="+-*/"),
}
LEVEL_NAMES = {"easy": 1, "medium": 2, "hard": 4}
DEFAULT_DIFFICULTY = 2

_NAMES = [
    ("Mia", "She", "her"),
    ("Leo", "He", "him"),
    ("Ava", "She", "her"),
    ("Sam", "He", "him"),
    ("Zoe", "She", "her"),
    ("Ben", "He", "him"),
    ("Ivy", "She", "her"),
    ("Tom", "He", "him"),
]
_ITEMS = ["apples", "marbles", "coins", "books", "cards", "pens", "stickers", "shells"]
_WORD_OPS = {
    "+": ["{P} buys {b} more.", "{P} finds {b} more.", "A friend gives {o} {b} more."],
    "-": ["{P} gives away {b}.", "{P} loses {b}.", "{P} sells {b}."],
    "*": ["Then the number of {items} is multiplied by {b}."],
    "/": ["{P} splits them into {b} equal groups and keeps one group."],
}
_PREC = {"+": 1, "-": 1, "*": 2, "/": 2}


def resolve_level(difficulty: int | str | Level = DEFAULT_DIFFICULTY, **overrides: int | str) -> Level:
    """The `Level` for `difficulty` (1..5, "easy" | "medium" | "hard", a Level, or "2:steps=3,ops=+-": a level
    with field overrides written into the name), with field overrides.

    Raises ConfigError naming `task.difficulty` (or the override) when the value is unknown or out of range.
    """
    if isinstance(difficulty, str) and ":" in difficulty:  # "2:steps=3,ops=+-": a level with field overrides
        base, _, spec = difficulty.partition(":")
        parsed: dict[str, int | str] = {}
        for item in filter(None, (x.strip() for x in spec.split(","))):
            key, eq, value = item.partition("=")
            if not eq:
                raise ConfigError(f"task.difficulty: expected 'level:key=value,...', got {difficulty!r}")
            parsed[key.strip()] = int(value) if value.strip().isdigit() else value.strip()
        return resolve_level(int(base) if base.strip().isdigit() else base.strip(), **{**parsed, **overrides})
    if isinstance(difficulty, Level):
        level = difficulty
    else:
        key = LEVEL_NAMES.get(difficulty, difficulty) if isinstance(difficulty, str) else difficulty
        try:
            level = LEVELS[int(key)]
        except (KeyError, ValueError, TypeError):
            known = ", ".join([*map(str, LEVELS), *LEVEL_NAMES])
            raise ConfigError(f"task.difficulty: unknown difficulty {difficulty!r}; known: {known}") from None
    unknown = set(overrides) - {"steps", "digits", "ops"}
    if unknown:
        raise ConfigError(f"arithmetic task: unknown option(s) {sorted(unknown)}; known: steps, digits, ops")
    level = replace(level, **overrides)  # type: ignore[arg-type]
    if not (1 <= int(level.steps) <= 16):
        raise ConfigError(f"arithmetic task: steps must be in 1..16, got {level.steps}")
    if not (1 <= int(level.digits) <= 6):
        raise ConfigError(f"arithmetic task: digits must be in 1..6, got {level.digits}")
    if not level.ops or set(level.ops) - set(_PREC):
        raise ConfigError(f"arithmetic task: ops must be a non-empty subset of '+-*/', got {level.ops!r}")
    return level


def _apply(x: int, op: str, b: int) -> int:
    if op == "+":
        return x + b
    if op == "-":
        return x - b
    if op == "*":
        return x * b
    return x // b


def _sample_chain(rng: random.Random, level: Level) -> tuple[int, list[tuple[str, int]]]:
    """A start value and `level.steps` (op, operand) pairs; every intermediate value is in [0, 10**(digits+1))."""
    top = 10**level.digits - 1
    cap = 10 ** (level.digits + 1)
    start = x = rng.randint(1, top)
    chain: list[tuple[str, int]] = []
    while len(chain) < level.steps:
        choices = []
        for op in level.ops:
            if (
                (op == "+" and x + 1 < cap)
                or (op == "-" and x >= 1)
                or (op == "*" and x >= 2 and x * 2 < cap)
                or (op == "/" and any(x % d == 0 for d in range(2, 10)) and x >= 2)
            ):
                choices.append(op)
        if not choices:  # e.g. x == 0 with only "-": restart the chain
            start = x = rng.randint(1, top)
            chain = []
            continue
        op = rng.choice(choices)
        if op == "+":
            b = rng.randint(1, min(top, cap - 1 - x))
        elif op == "-":
            b = rng.randint(1, min(top, x))
        elif op == "*":
            b = rng.randint(2, min(9, (cap - 1) // x))
        else:
            b = rng.choice([d for d in range(2, 10) if x % d == 0])
        chain.append((op, b))
        x = _apply(x, op, b)
    return start, chain


def canonical(start: int, chain: list[tuple[str, int]]) -> str:
    """The split key of a problem: the chain written without spaces, e.g. `7+5-3`."""
    return str(start) + "".join(f"{op}{b}" for op, b in chain)


def split_of(key: str) -> str:
    """ "test" when sha256(key) falls in the first TEST_PERCENT of 100 buckets, else "train"."""
    bucket = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") % 100
    return "test" if bucket < TEST_PERCENT else "train"


def expression(start: int, chain: list[tuple[str, int]]) -> str:
    """The chain as an infix expression with the parentheses left-to-right evaluation needs: `(7 + 5) * 3`."""
    text, prec = str(start), 3
    for op, b in chain:
        if _PREC[op] > prec:
            text = f"({text})"
        text, prec = f"{text} {op} {b}", _PREC[op]
    return text


def solution_lines(start: int, chain: list[tuple[str, int]]) -> tuple[list[str], int]:
    """One `x op b = y` line per step and the final value."""
    x, lines = start, []
    for op, b in chain:
        y = _apply(x, op, b)
        lines.append(f"{x} {op} {b} = {y}")
        x = y
    return lines, x


def word_problem(rng: random.Random, start: int, chain: list[tuple[str, int]]) -> str:
    """The chain as a short story about a person and a pile of items."""
    name, pronoun, obj = rng.choice(_NAMES)
    items = rng.choice(_ITEMS)
    parts = [f"{name} has {start} {items}."]
    for op, b in chain:
        parts.append(rng.choice(_WORD_OPS[op]).format(P=pronoun, o=obj, b=b, items=items))
    parts.append(f"How many {items} does {name} have now?")
    return " ".join(parts)


def make_problem(
    rng: random.Random, start: int, chain: list[tuple[str, int]], kind: str, difficulty: object
) -> Problem:
    """Render a sampled chain as a `Problem` of the given kind ("word" or "expr")."""
    lines, answer = solution_lines(start, chain)
    expr = expression(start, chain)
    prompt = word_problem(rng, start, chain) if kind == "word" else f"What is {expr}?"
    return Problem(
        prompt=prompt,
        answer=str(answer),
        solution="\n".join([*lines, f"#### {answer}"]),
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


def load_arithmetic(
    split: str = "train",
    *,
    seed: int = 0,
    n: int | None = None,
    difficulty: int | str | Level = DEFAULT_DIFFICULTY,
    kind: str = "mix",
    unique: bool = True,
    **overrides: int | str,
) -> list[Problem]:
    """`n` problems (default 1000) of `split`, deterministic in (split, seed, n, difficulty, kind, overrides).

    Args:
        split: "train" or "test"; the two never share a canonical problem.
        seed: RNG seed; the same arguments always give the same list.
        n: number of problems (default 1000).
        difficulty: 1..5 or "easy" | "medium" | "hard" (see LEVELS); `steps=`, `digits=`, `ops=` override fields.
        kind: "word", "expr" or "mix" (each problem picks one of the two at random).
        unique: avoid repeating a canonical problem within the list while fresh ones are easy to find; small
            levels (level 1 has under 100 problems) then repeat problems rather than fail.
    """
    if split not in SPLITS:
        raise ConfigError(f"arithmetic task: unknown split {split!r}; known: {', '.join(SPLITS)}")
    if kind not in KINDS:
        raise ConfigError(f"arithmetic task: unknown kind {kind!r}; known: {', '.join(KINDS)}")
    level = resolve_level(difficulty, **overrides)
    n = 1000 if n is None else int(n)
    if n < 0:
        raise ConfigError(f"arithmetic task: n must be >= 0, got {n}")
    label = difficulty if not isinstance(difficulty, Level) else str(difficulty)

    def make(rng: random.Random, start: int, chain: list[tuple[str, int]]) -> Problem:
        k = kind if kind != "mix" else rng.choice(("word", "expr"))
        return make_problem(rng, start, chain, k, label)

    rng = random.Random(f"p3o-arithmetic|{split}|{seed}|{level}|{kind}")
    return draw_problems(rng, n, split, lambda r: _sample_chain(r, level), make, unique=unique)


def draw_problems(
    rng: random.Random,
    n: int,
    split: str,
    sample: Callable[[random.Random], tuple[int, list[tuple[str, int]]]],
    make: Callable[[random.Random, int, list[tuple[str, int]]], Problem],
    *,
    unique: bool = True,
) -> list[Problem]:
    """`n` problems of `split`: chains drawn by `sample(rng)` until `n` of `split` are found (`split_of` of their
    canonical form), each made by `make(rng, start, chain)`, in draw order.

    With `unique`, a chain already taken is skipped while fresh ones are easy to find; after 2000 repeats in a row
    (a small level) repeats are taken rather than fail. Deterministic in the state of `rng`.
    """
    out: list[Problem] = []
    seen: set[str] = set()
    misses = 0
    while len(out) < n:
        start, chain = sample(rng)
        key = canonical(start, chain)
        if split_of(key) != split:
            continue
        if unique and key in seen:
            misses += 1
            if misses < 2000:
                continue
        else:
            misses = 0
        seen.add(key)
        out.append(make(rng, start, chain))
    return out
