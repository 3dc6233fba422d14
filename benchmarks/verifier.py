"""Throughput of p3o's `math` verifier against calling math-verify directly, side by side on the committed corpus.

Usage: ``.venv/bin/python benchmarks/verifier.py --repeats 3``
(a benchmark, not a test: pairs/s of each on the 351 completion / reference pairs of
tests/rewards/data/math_corpus.jsonl, and the ratio p3o / math-verify; > 1 means p3o is faster).

    p3o          = p3o.rewards.math_reward(completion, answer, timeout_s): answer extraction, the exact-number and
                   normalised-string fast paths, the rest in the math-verify worker process (one JSON round trip
                   per pair, a hard time limit per call)
    math-verify  = math_verify.verify(parse("\\boxed{" + answer + "}"), parse(completion)) in this process, with
                   math-verify's own default time limits (what p3o's verdicts are checked against)

Each repeat runs each verifier in a fresh Python process (`--one NAME`): one cold pass over the corpus (new
expressions, empty sympy caches: what new completions meet in training), then a warm pass (the same pairs again).
Start-up is not timed: imports, p3o's worker start-up, and in both the warm-up pairs the worker compares before it
reports ready (`p3o.rewards.mv_worker.WARM_UP`: math-verify's regexes, sympy's code paths). The two verifiers
alternate repeat by repeat, so a shared machine's noise hits both alike; the median pass is reported. On a loaded
machine each worker round trip also waits for the scheduler (two wake-ups per pair), which direct calls do not.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
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


def run_one(name: str, corpus: Path, timeout_s: float) -> dict[str, object]:
    """In this (fresh) process: {"cold": s, "warm": s, "verdicts": [...], "timeouts": n} for verifier `name`."""
    logging.disable(logging.WARNING)  # math-verify logs every answer it cannot parse
    from math_verify import parse, verify

    from p3o.rewards import math_reward, tally
    from p3o.rewards.mv_worker import WARM_UP
    from p3o.rewards.verifiers import _worker

    pairs = load(corpus)
    if name == "p3o":
        _worker().call({"op": "ping"}, timeout_s=120.0)  # start-up (and its regex compilation) not timed

        def fn(completion: str, answer: str) -> float:
            return math_reward(completion, answer, timeout_s=timeout_s)
    else:

        def fn(completion: str, answer: str) -> float:
            return float(verify(parse("\\boxed{" + answer + "}"), parse(completion)))

        for pred, gold in WARM_UP:  # what p3o's worker does before it reports ready: regexes, sympy's code paths
            fn("\\boxed{" + pred + "}", gold)
    out: dict[str, object] = {}
    with tally() as counts:
        out["cold"], out["verdicts"] = one_pass(fn, pairs)
        out["warm"], _ = one_pass(fn, pairs)
    out["timeouts"] = counts.timeouts
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--corpus", type=Path, default=CORPUS)
    p.add_argument("--repeats", type=int, default=3, help="fresh processes per verifier (each: a cold, a warm pass)")
    p.add_argument("--timeout-s", type=float, default=10.0, help="p3o's per-call limit (generous: no timeouts)")
    p.add_argument("--one", choices=["p3o", "math-verify"], help=argparse.SUPPRESS)  # a child: one verifier
    args = p.parse_args(argv)
    if args.one:
        print(json.dumps(run_one(args.one, args.corpus, args.timeout_s)))
        return 0
    names = ["p3o", "math-verify"]
    times: dict[tuple[str, str], list[float]] = {(k, m): [] for k in names for m in ("cold", "warm")}
    verdicts: dict[str, list[int]] = {}
    for _ in range(args.repeats):
        for name in names:
            cmd = [sys.executable, __file__, "--one", name, "--corpus", str(args.corpus)]
            cmd += ["--timeout-s", str(args.timeout_s)]
            res = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.splitlines()[-1])
            for mode in ("cold", "warm"):
                times[(name, mode)].append(float(res[mode]))
            verdicts[name] = list(res["verdicts"])
            if res["timeouts"]:
                print(f"warning: {res['timeouts']} p3o timeouts in a run (raise --timeout-s)")
    pairs = load(args.corpus)
    worker_calls = sum(1 for c, a in pairs if _needs_worker(c, a))  # a worker round trip each
    agree = sum(x == y for x, y in zip(verdicts["p3o"], verdicts["math-verify"]))
    rate = {key: len(pairs) / statistics.median(v) for key, v in times.items()}
    print(
        f"{len(pairs)} pairs ({args.corpus.name}), {args.repeats} fresh processes each, median; "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, python {platform.python_version()}"
    )
    print(f"{'verifier':<14}{'cold pairs/s':>14}{'ms/pair':>9}{'warm pairs/s':>14}{'ms/pair':>9}")
    for k in names:
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
