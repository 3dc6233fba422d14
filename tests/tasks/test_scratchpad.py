"""The scratchpad testbed's task: deterministic, split like the arithmetic task, every worked line true, long."""

from __future__ import annotations

import re

import pytest

from p3o.errors import ConfigError
from p3o.rewards import exact_int
from p3o.tasks import load_task
from p3o.tasks.arithmetic import split_of
from p3o.tasks.scratchpad import PAD_LEVELS, is_level, load_scratchpad

_EQ = re.compile(r"^(\d+) ([-+]) (\d+) = (\d+)$")
_NOTE = re.compile(r"^(?:so|now|we have|total:|that makes|running total) (\d+)$")
_OPEN = re.compile(r"^(?:start:|we begin with|first) (\d+)$")


@pytest.mark.parametrize("difficulty", list(PAD_LEVELS))
def test_every_worked_line_is_true_and_the_answer_checks(difficulty: str) -> None:
    problems = load_scratchpad("train", seed=3, n=200, difficulty=difficulty)
    distinct = len({p.meta["key"] for p in problems})
    assert distinct == 200 if difficulty != "pad-1" else 100 < distinct < 200  # one step: under 200 chains, repeated
    for p in problems:
        opening, *lines, last = p.solution.splitlines()
        assert last == f"#### {p.answer}" and exact_int(p.solution, p.answer) == 1.0
        assert int(p.answer) == eval(p.meta["expression"])  # the generated + / - chain, evaluated left to right
        running = int(_OPEN.match(opening).group(1))
        assert running == int(p.meta["expression"].split()[0])
        steps = 0
        for line in lines:
            if note := _NOTE.match(line):
                assert int(note.group(1)) == running, line  # a note restates the running value
                continue
            a, op, b, y = _EQ.match(line).groups()
            assert running in (int(a), int(b)) if op == "+" else running == int(a), line
            assert (int(a) + int(b) if op == "+" else int(a) - int(b)) == int(y) >= 0, line
            running, steps = int(y), steps + 1
        assert steps == PAD_LEVELS[difficulty] and len(lines) <= 2 * steps  # a line per step, and maybe its note


def test_deterministic_disjoint_splits_and_varied_wording() -> None:
    train = load_task("arithmetic", "train", seed=0, n=300, difficulty="pad")
    assert [p.solution for p in train] == [p.solution for p in load_scratchpad("train", seed=0, n=300)]
    test = load_task("arithmetic", "test", seed=0, n=100, difficulty="pad")
    assert {p.meta["key"] for p in train}.isdisjoint({p.meta["key"] for p in test})
    assert all(split_of(p.meta["key"]) == "test" for p in test)
    text = "\n".join(p.solution for p in train)
    assert all(word in text for word in ("start: ", "we begin with ", "so ", "total: ", "running total "))  # wordings
    firsts = [p.solution.splitlines()[1] for p in train if p.meta["expression"].split()[1] == "+"]
    start = [p.meta["expression"].split()[0] for p in train if p.meta["expression"].split()[1] == "+"]
    swapped = sum(not f.startswith(s + " ") for f, s in zip(firsts, start))
    assert 0.3 < swapped / len(firsts) < 0.7  # an addition is written in either order
    assert {p.meta["kind"] for p in train} == {"word", "expr"}
    assert load_task("arithmetic", "train", seed=1, n=5, difficulty="pad")[0].prompt != train[0].prompt


def test_responses_are_25_to_70_tokens_with_the_built_in_tokenizer() -> None:
    from p3o.models.tokenizer import build_tokenizer

    tok = build_tokenizer()
    lengths = [len(tok(p.solution)["input_ids"]) + 1 for p in load_task("arithmetic", "test", n=300, difficulty="pad")]
    assert min(lengths) >= 25 and max(lengths) <= 70 and 40 <= sum(lengths) / len(lengths) <= 52


def test_levels_and_options() -> None:
    assert is_level("pad") and is_level(2) and not is_level("pad-7") and not is_level(9)
    with pytest.raises(ConfigError, match="unknown option"):
        load_task("arithmetic", "train", n=2, difficulty="pad", kind="word")
