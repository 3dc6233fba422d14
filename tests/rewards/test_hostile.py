"""Hostile completions: every verifier returns a float within 1 s, never raises, never runs the text as code."""

from __future__ import annotations

import random
import time

import pytest

from p3o.rewards import VERIFIERS, get_verifier, safe_for_sympy, score

MB = 1_000_000


def _hostile(rng: random.Random) -> list[str]:
    deep = "\\frac{1}{" * 10_000 + "2" + "}" * 10_000
    big = [
        "A" * MB,
        "9" * MB,
        "{" * MB,
        "}" * MB,
        "\\boxed{" + "1" * MB + "}",
        "\\boxed{" * 100_000,
        "####" + " 9" * (MB // 2),
        "#" * MB,
        "\\boxed{" + deep + "}",
        deep,
        "$" + deep + "$ #### " + deep,
        "\\boxed{" + "(" * 50_000 + ")" * 50_000 + "}",
    ]
    fixed = [
        "\\boxed{10^{10^{10}}}",
        "\\boxed{2^{99999999}}",
        "\\boxed{9^9^9^9}",
        "\\boxed{9^{9^{9^{9}}}}",
        "\\boxed{10**100000}",
        "\\boxed{100000!}",
        "\\boxed{(10^{100})!}",
        "#### 1e999999999",
        "\\boxed{1e999999999}",
        "\\boxed{999^{999}^{999}}",
        "\\boxed{\\prod_{k=1}^{10^9} k}",
        "\\boxed{\\sum_{n=1}^{\\infty} n^{-1}}",
        "\\boxed{\\int_0^{10^{9}} x^{x} dx}",
        "\\boxed{x^{99999}-1}",
        "\\boxed{__import__('os').system('echo pwned')}",
        "#### __import__('os')",
        "__import__('os').system('x')",
        "\\boxed{eval('1+1')}",
        '\\boxed{exec("import os")}',
        "\\boxed{lambda: 0}",
        "\\boxed{().__class__}",
        "\\boxed{{{{",
        "}}}}\\boxed{",
        "\\boxed{1}}}}",
        "\\frac{1}{",
        "\\boxed{\\frac{1}{}",
        "\\boxed{\\left(}",
        "\\boxed{\x00}",
        "\x00" * 1000,
        "\\boxed{\u202e7\u202c}",
        "\\boxed{\ud800}",
        "#### \ud83d\ude00",
        "\\boxed{\u0661\u0662}",
        "#### \u0667",
        "\\boxed{\\def\\x{\\x}\\x}",
        "\\boxed{\\newcommand{\\a}{\\a}\\a}",
        "\\boxed{" + "x^" * 200 + "2}",
        "\\boxed{" + "\\sqrt{" * 16 + "2" + "}" * 16 + "}",
        "",
        " ",
        "\\boxed",
        "\\boxed{}",
        "####",
        "#### -",
        "\\boxed{\\text{" + "é" * 400 + "}}",
    ]
    alphabet = "0123456789{}\\^_$#()[]+-*/=!., abcxyz" + "\\frac\\sqrt\\boxed" + "πλ√∞½é中文🙂\u200b\u0301\t\n\x00"
    rand = []
    while len(big) + len(fixed) + len(rand) < 1100:
        k = rng.randint(1, 300)
        junk = "".join(rng.choice(alphabet) for _ in range(k))
        wrap = rng.randrange(4)
        rand.append(
            junk
            if wrap == 0
            else f"\\boxed{{{junk}}}"
            if wrap == 1
            else f"#### {junk}"
            if wrap == 2
            else f"{junk} \\boxed{{{junk[:40]}}} {junk}"
        )
    return big + fixed + rand


@pytest.fixture(scope="module")
def hostile() -> list[str]:
    from p3o.rewards.verifiers import _worker

    _worker().call({"op": "ping"}, timeout_s=60.0)  # the worker's one-time start-up is not part of a call's limit
    return _hostile(random.Random(0))


def test_every_verifier_survives_hostile_input(hostile: list[str]) -> None:
    assert len(hostile) >= 1000
    t_all = time.perf_counter()
    for name in VERIFIERS:
        fn = get_verifier(name)
        for text in hostile:
            t = time.perf_counter()
            r = fn(text, "7")
            dt = time.perf_counter() - t
            assert isinstance(r, float) and r in (0.0, 1.0), (name, text[:80], r)
            assert dt < 1.0, (name, text[:80], dt)
    assert time.perf_counter() - t_all < 60.0


def test_hostile_answers_and_non_strings() -> None:
    for name in VERIFIERS:
        fn = get_verifier(name)
        for answer in ["\\frac{1}{" * 10_000, "9" * MB, "__import__('os')", "", None, 7, b"7"]:
            t = time.perf_counter()
            r = fn("#### 7 \\boxed{7}", answer)  # type: ignore[arg-type]
            assert isinstance(r, float) and time.perf_counter() - t < 1.0
    assert score([b"#### 7", 7, None], ["7", "7", "7"], "math") == [0.0, 0.0, 0.0]  # type: ignore[list-item]


def test_real_answers_still_verify_after_junk() -> None:
    from p3o.rewards.verifiers import _worker

    _worker().call({"op": "ping"}, timeout_s=60.0)  # a spare still starting after a killed call: wait for it
    junk = "A" * MB + "\\frac{1}{" * 10_000
    assert get_verifier("exact-int")(junk + "\n#### 7", "7") == 1.0
    assert get_verifier("gsm8k")(junk + "\n#### 7", "7") == 1.0
    assert get_verifier("math")(junk + " so \\boxed{\\frac{14}{2}}", "7") == 1.0
    assert get_verifier("math")(junk + " so \\boxed{\\frac{\\sqrt{8}}{2}}", "\\sqrt{2}") == 1.0


def test_prefilter() -> None:
    assert safe_for_sympy("\\frac{\\sqrt{2}}{2}") and safe_for_sympy("x^2+2x+1") and safe_for_sympy("(3, \\pi/2)")
    for bad in ["2^{99999}", "9^{9^{9}}", "100000!", "10**9", "__import__('os')", "{" * 20 + "}" * 20, "\\boxed{"]:
        assert not safe_for_sympy(bad), bad
