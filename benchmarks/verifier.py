"""Throughput of p3o's `math` verifier against calling math-verify directly, side by side on the committed corpus.

Usage: ``.venv/bin/python benchmarks/verifier.py --repeats 3``
(a benchmark, not a test: pairs/s of each on the 351 completion / reference pairs of
tests/rewards/data/math_corpus.jsonl, and the ratio p3o / math-verify; > 1 means p3o is faster).

    p3o          = p3o.rewards.math_reward(completion, answer, timeout_s): answer extraction, the exact-number and
                   normalised-string fast paths, the rest in the math-verify worker process (one JSON round trip
                   per pair, a hard time limit per call)
    math-verify  = math_verify.verify(parse("\\boxed{" + answer + "}"), parse(completion)) in this process, with
                   math-verify's own default time limits (what p3o's verdicts are checked against)

Each timed pass is run twice: cold (sympy's and math-verify's caches emptied first, a fresh p3o worker — what new
completions meet in training) and warm (the same pass again, every cache holding it). math-verify's regexes are
compiled once per process in both (p3o's worker does it before it reports ready). The two verifiers alternate pass
by pass (`--repeats`), so a shared machine's noise hits both alike; the median pass is reported.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

CORPUS = Path(__file__).resolve().parents[1] / "tests" / "rewards" / "data" / "math_corpus.jsonl"


def load(path: Path) -> list[tuple[str, str]]:
    """(completion, answer) pairs of a corpus file (one JSON object per line)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [(str(r["completion"]), str(r["answer"])) for r in rows]


def one_pass(fn: Callable[[str, str], float], pairs: list[tuple[str, str]]) -> tuple[float, list[int]]:
    """(seconds for all pairs, verdicts)."""
    t0 = time.perf_counter()
    verdicts = [int(fn(c, a)) for c, a in pairs]
    return time.perf_counter() - t0, verdicts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--corpus", type=Path, default=CORPUS)
    p.add_argument("--repeats", type=int, default=3, help="timed passes of each (after one warm-up pass)")
    p.add_argument("--timeout-s", type=float, default=10.0, help="p3o's per-call limit (generous: no timeouts)")
    args = p.parse_args(argv)
    logging.disable(logging.WARNING)  # math-verify logs every answer it cannot parse

    from math_verify import parse, verify

    from p3o.rewards import math_reward, tally
    from p3o.rewards.verifiers import _worker

    pairs = load(args.corpus)

    def p3o(completion: str, answer: str) -> float:
        return math_reward(completion, answer, timeout_s=args.timeout_s)

    def math_verify(completion: str, answer: str) -> float:
        return float(verify(parse("\\boxed{" + answer + "}"), parse(completion)))

    def cold_p3o() -> None:  # a fresh worker: empty caches; its start-up (and regex compilation) not timed
        _worker().close()
        _worker().call({"op": "ping"}, timeout_s=120.0)

    def cold_math_verify() -> None:  # empty sympy's and math-verify's caches (the compiled regexes stay)
        from math_verify import parser
        from sympy.core.cache import clear_cache

        clear_cache()
        parser.parse_latex_cached.cache_clear()
        parser.parse_expr_cached.cache_clear()

    math_verify("\\frac{1}{2}", "0.5")  # compile math-verify's regexes in this process, as the worker does
    ways = {"p3o": (p3o, cold_p3o), "math-verify": (math_verify, cold_math_verify)}
    times: dict[tuple[str, str], list[float]] = {(k, m): [] for k in ways for m in ("cold", "warm")}
    verdicts: dict[str, list[int]] = {}
    for _ in range(args.repeats):
        for name, (fn, make_cold) in ways.items():
            make_cold()
            for mode in ("cold", "warm"):
                with tally() as counts:
                    seconds, verdicts[name] = one_pass(fn, pairs)
                times[(name, mode)].append(seconds)
                if counts.timeouts:
                    print(f"warning: {counts.timeouts} p3o timeouts in a pass (raise --timeout-s)")
    worker_calls = sum(
        1 for c, a in pairs if _needs_worker(c, a)
    )  # pairs the fast paths do not settle: a worker round trip each
    agree = sum(x == y for x, y in zip(verdicts["p3o"], verdicts["math-verify"]))
    rate = {key: len(pairs) / statistics.median(v) for key, v in times.items()}
    print(
        f"{len(pairs)} pairs ({args.corpus.name}), {args.repeats} timed passes each, median; "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, python {platform.python_version()}"
    )
    print(f"{'verifier':<14}{'cold pairs/s':>14}{'ms/pair':>9}{'warm pairs/s':>14}{'ms/pair':>9}")
    for k in ways:
        cold, warm = rate[(k, "cold")], rate[(k, "warm")]
        print(f"{k:<14}{cold:>14.1f}{1e3 / cold:>9.2f}{warm:>14.1f}{1e3 / warm:>9.2f}")
    for mode in ("cold", "warm"):
        print(f"ratio p3o / math-verify ({mode}, pairs/s): {rate[('p3o', mode)] / rate[('math-verify', mode)]:.2f}x")
    print(
        f"p3o's worker took {worker_calls} of {len(pairs)} pairs (the fast paths settled the rest); "
        f"verdicts equal on {agree} of {len(pairs)} (the others: p3o.rewards.DIFFERENCES)"
    )
    return 0


def _needs_worker(completion: str, answer: str) -> bool:
    """Whether p3o sends this pair to the math-verify worker (its answer extraction and fast paths fail)."""
    from p3o.rewards.extract import final_boxed, hash_answer
    from p3o.rewards.verifiers import _normalise, _same_number

    pred = final_boxed(completion) or hash_answer(completion)
    if pred is None:
        return False
    return not (_same_number(pred, answer) or _normalise(pred) == _normalise(answer))


if __name__ == "__main__":
    raise SystemExit(main())
