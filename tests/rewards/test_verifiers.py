"""Verifiers: correct answers score 1, wrong or missing ones 0; extraction edge cases; the batch API."""

from __future__ import annotations

from fractions import Fraction

import pytest

from p3o.rewards import (
    exact_int,
    final_boxed,
    format_reward,
    get_verifier,
    gsm8k,
    hash_answer,
    last_boxed,
    math_reward,
    parse_int,
    parse_number,
    safe_for_sympy,
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


def test_final_boxed_joins_the_boxes_math_verify_joins() -> None:
    assert final_boxed("The roots are \\boxed{3} and \\boxed{5}.") == "3,5"
    assert final_boxed("It is either \\boxed{1} or \\boxed{2}.") == "1,2"  # a hedge is not the answer 2
    assert final_boxed("\\boxed{2}\\boxed{2}") == "2"  # equal neighbours once
    assert final_boxed("We get \\boxed{1} then after more careful work \\boxed{2}") == "2"  # far apart, no separator
    assert final_boxed("so \\fbox{12}.") == "12" and final_boxed("\\boxed 5$") == "5"
    assert final_boxed("\\boxed{}") is None and final_boxed("no box") is None and final_boxed("\\boxed{1") is None
    assert final_boxed("\\boxed{1}" * 1000) == "1"  # bounded: equal neighbours collapse
    assert final_boxed(",".join(f"\\boxed{{{i}}}" for i in range(100))) == ",".join(str(i) for i in range(84, 100))


@pytest.mark.parametrize(
    ("completion", "answer", "expected"),
    [
        ("The answer is \\boxed{12 apples}", "12", 1.0),  # words and units go to math-verify, which reads them
        ("So \\boxed{5 hours}", "5", 1.0),
        ("\\boxed{3\\;\\text{m}}", "3", 1.0),  # the `;` of LaTeX spacing
        ("\\boxed{3!}", "6", 1.0),  # a small factorial
        ("\\boxed{0.5}", "50\\%", 1.0),  # the exact-number path does not reject: math-verify reads the percentage
        ("\\boxed{13 apples}", "12", 0.0),
        ("\\boxed{4!}", "25", 0.0),
        ("It is either \\boxed{1} or \\boxed{2}.", "2", 0.0),  # as math-verify: the answer {1, 2}
        ("The roots are \\boxed{3} and \\boxed{5}.", "3, 5", 1.0),
        ("\\boxed{12.}", "12", 0.0),  # the fast path does not accept what math-verify cannot read
    ],
)
def test_math_accepts_what_math_verify_accepts(completion: str, answer: str, expected: float) -> None:
    assert math_reward(completion, answer, timeout_s=10.0) == expected


def test_prefilter_keeps_only_costly_inputs_from_sympy() -> None:
    for fine in ["12 apples", "3\\;\\text{m}", "\\$12", "3!", "(n-1)!", "x^5+x^4+x^3+x^2+x+1", "30°", "lambda"]:
        assert safe_for_sympy(fine), fine
    for costly in ["2^{12345}", "1000!", "(10^{100})!", "\\sum_{n=1}^{\\infty} n", "1e999", "9" * 41, "x^2" * 17]:
        assert not safe_for_sympy(costly), costly
    assert not safe_for_sympy("a\x00b")  # control characters
