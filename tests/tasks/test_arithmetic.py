"""The built-in arithmetic task: determinism, disjoint splits, correct answers and worked solutions, levels."""

from __future__ import annotations

import ast
import operator
import re

import pytest

from p3o.errors import ConfigError
from p3o.rewards import exact_int
from p3o.tasks import load_task
from p3o.tasks.arithmetic import LEVELS, expression, resolve_level, split_of

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def _eval(expr: str) -> float:
    """A tiny evaluator for + - * / over integer literals (our own generated text only)."""

    def go(node: ast.AST) -> float:
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](go(node.left), go(node.right))
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        raise ValueError(ast.dump(node))

    return go(ast.parse(expr, mode="eval").body)


def test_deterministic_by_seed() -> None:
    a = load_task("arithmetic", "train", seed=3, n=50, difficulty=3)
    b = load_task("arithmetic", "train", seed=3, n=50, difficulty=3)
    c = load_task("arithmetic", "train", seed=4, n=50, difficulty=3)
    assert [(p.prompt, p.answer, p.solution) for p in a] == [(p.prompt, p.answer, p.solution) for p in b]
    assert [p.prompt for p in a] != [p.prompt for p in c]


@pytest.mark.parametrize("level", [2, 3, 4, 5])
def test_splits_are_disjoint(level: int) -> None:
    train = {p.meta["key"] for p in load_task("arithmetic", "train", n=2000, difficulty=level)}
    test = {p.meta["key"] for p in load_task("arithmetic", "test", n=200, difficulty=level)}
    if level >= 3:
        assert len(test) == 200  # unique within a split while the space is large (level 2 has ~300 test problems)
    assert not train & test
    assert all(split_of(k) == "test" for k in test)


@pytest.mark.parametrize("level", sorted(LEVELS))
def test_answers_and_solutions_are_correct(level: int) -> None:
    spec = LEVELS[level]
    for p in load_task("arithmetic", "test", seed=1, n=100, difficulty=level):
        lines = p.solution.split("\n")
        assert len(lines) == spec.steps + 1
        assert lines[-1] == f"#### {p.answer}"
        x = None
        for line in lines[:-1]:  # each step is right and chains from the previous one
            a, op, b, eq, y = line.split()
            assert eq == "="
            assert _eval(f"{a} {op} {b}") == int(y)
            assert x is None or int(a) == x
            x = int(y)
        assert x == int(p.answer) >= 0
        assert _eval(p.meta["expression"]) == int(p.answer)  # the parentheses make precedence agree
        assert exact_int(p.solution, p.answer) == 1.0
        if p.meta["kind"] == "expr":
            assert p.prompt == f"What is {p.meta['expression']}?"
        else:  # every operand of the chain appears in the story
            numbers = re.findall(r"\d+", p.prompt)
            assert numbers == re.findall(r"\d+", p.meta["key"])


def test_kinds_and_expression_parentheses() -> None:
    assert {p.meta["kind"] for p in load_task("arithmetic", n=40)} == {"word", "expr"}
    assert all(p.meta["kind"] == "word" for p in load_task("arithmetic", n=10, kind="word"))
    assert expression(7, [("+", 5), ("*", 3), ("-", 1)]) == "(7 + 5) * 3 - 1"
    assert expression(7, [("*", 5), ("+", 3)]) == "7 * 5 + 3"


def test_overrides_and_bad_options() -> None:
    ps = load_task("arithmetic", n=20, difficulty="easy", steps=3)
    assert all(len(p.solution.split("\n")) == 4 for p in ps)
    assert resolve_level("hard") == LEVELS[4]
    with pytest.raises(ConfigError, match=r"task\.difficulty"):
        load_task("arithmetic", difficulty=9)
    with pytest.raises(ConfigError, match="split"):
        load_task("arithmetic", "validation")
    with pytest.raises(ConfigError, match="unknown option"):
        load_task("arithmetic", colour="red")


def test_small_space_repeats_instead_of_hanging() -> None:
    ps = load_task("arithmetic", "test", n=300, difficulty=1)  # level 1 has only a handful of test problems
    assert len(ps) == 300 and len({p.meta["key"] for p in ps}) < 300
