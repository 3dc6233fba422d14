"""Verifiers: correct answers score 1, wrong or missing ones 0; extraction edge cases; the batch API."""

from __future__ import annotations

from fractions import Fraction

import pytest

from p3o.rewards import (
    exact_int,
    format_reward,
    get_verifier,
    gsm8k,
    hash_answer,
    last_boxed,
    math_reward,
    parse_int,
    parse_number,
    score,
)


def test_extraction() -> None:
    assert last_boxed("a \\boxed{1} then \\boxed{\\frac{1}{2}} end") == "\\frac{1}{2}"
    assert last_boxed("\\boxed 5$") == "5"
    assert last_boxed("\\boxed{unbalanced") is None
    assert last_boxed("no box") is None
    assert hash_answer("x\n#### 1,234.") == "1234"
    assert hash_answer("#### $ 12") == "12"
    assert hash_answer("#### twelve") is None
    assert parse_number("\\frac{3}{4}") == Fraction(3, 4)
    assert parse_number("-3/6") == Fraction(-1, 2)
    assert parse_number("$1,000") == 1000
    assert parse_number("50\\%") == 50
    assert parse_number("1/0") is None
    assert parse_int("12.0") == 12 and parse_int("12.5") is None


@pytest.mark.parametrize(
    ("completion", "answer", "expected"),
    [
        ("3 + 4 = 7\n#### 7", "7", 1.0),
        ("#### 8", "7", 0.0),
        ("so \\boxed{7}", "7", 1.0),  # boxed is accepted when there is no ####
        ("#### 7.0", "7", 1.0),
        ("#### -3", "-3", 1.0),
        ("the answer is 7", "7", 0.0),  # no marker: no reward
        ("#### 7", "seven", 0.0),
        ("#### 1,000", "1000", 1.0),
    ],
)
def test_exact_int(completion: str, answer: str, expected: float) -> None:
    assert exact_int(completion, answer) == expected


def test_gsm8k() -> None:
    assert gsm8k("Natalia sold 48/2 = 24 clips.\n#### 72", "72") == 1.0
    assert gsm8k("#### 72", "1,072") == 0.0
    assert gsm8k("#### 1,072", "1072") == 1.0
    assert gsm8k("#### 2.50", "2.5") == 1.0
    assert gsm8k("\\boxed{72}", "72") == 0.0  # GSM8K convention: the #### marker only


@pytest.mark.parametrize(
    ("completion", "answer"),
    [
        ("\\boxed{\\frac{1}{2}}", "0.5"),
        ("\\boxed{\\dfrac12}", "\\frac{1}{2}"),
        ("\\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{1}{\\sqrt{2}}"),
        ("\\boxed{(x+1)^2}", "x^2+2x+1"),
        ("\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}", "\\left( 3, \\frac{\\pi}{2} \\right)"),
        ("#### 12", "12"),
        ("The answer is \\boxed{\\text{(C)}}", "\\text{(C)}"),
    ],
)
def test_math_equivalent(completion: str, answer: str) -> None:
    assert math_reward(completion, answer, timeout_s=10.0) == 1.0  # generous: the CI machine may be loaded


@pytest.mark.parametrize(
    ("completion", "answer"),
    [("\\boxed{\\frac{1}{3}}", "0.5"), ("\\boxed{x^2}", "x^3"), ("no answer", "1"), ("\\boxed{}", "1")],
)
def test_math_not_equivalent(completion: str, answer: str) -> None:
    assert math_reward(completion, answer, timeout_s=10.0) == 0.0


def test_format_and_registry() -> None:
    assert format_reward("#### 3") == 1.0 and format_reward("\\boxed{x}") == 1.0 and format_reward("3") == 0.0
    assert get_verifier("exact-int") is exact_int
    combo = get_verifier("exact-int+format")
    assert combo("#### 3", "3") == pytest.approx(1.1) and combo("#### 4", "3") == pytest.approx(0.1)
    with pytest.raises(ValueError, match="known: exact-int, gsm8k, math, format"):
        get_verifier("nope")


def test_score_batch() -> None:
    assert score(["#### 1", "#### 2", "x"], ["1", "3", "1"], "exact-int") == [1.0, 0.0, 0.0]
    assert score(["\\boxed{0.5}"], ["\\frac12"], "math", timeout_s=10.0) == [1.0]

    def boom(completion: str, answer: str) -> float:
        raise RuntimeError("bad verifier")

    assert score(["a"], ["b"], boom) == [0.0]  # a failing custom verifier scores 0, never raises
    assert score([None, 3], ["1", "2"], "exact-int") == [0.0, 0.0]  # type: ignore[list-item]
