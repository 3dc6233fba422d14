"""The math-verify worker process: reads JSON requests on stdin, writes one JSON reply per line on stdout.

Run by `p3o.rewards.sandbox.Worker` as `python -m p3o.rewards.mv_worker`; never evaluates its input as code
(LaTeX is parsed by latex2sympy's grammar only, not sympy's `parse_expr`). The parent kills it on a timeout.

    {"op": "equal", "pred": "\\\\frac{1}{2}", "gold": "0.5"}  ->  {"ok": true, "value": true}
"""

from __future__ import annotations

import ctypes
import json
import logging
import resource
import signal
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO


def _die_with_parent() -> None:
    """Linux: ask the kernel to SIGKILL us when the parent dies, so a stuck sympy call never outlives p3o."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    except Exception:
        pass


def _limit_memory(gib: float = 4.0) -> None:
    """Cap the address space so a huge-integer blow-up fails with MemoryError instead of swapping."""
    try:
        limit = int(gib * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except Exception:
        pass


# Pairs compared once before the worker reports ready: they compile math-verify's regexes and load the sympy code
# paths answers use (numbers, sets and intervals, equations and functions, words as symbol products), ~0.1-0.7 s each
# the first time; a request meeting them cold could overrun a 1 s limit.
WARM_UP = [
    ("\\frac{1}{2}", "0.5"),
    ("f'(x) = x^2", "\\sqrt{2}"),
    ("\\text{(A)}", "\\{1,2\\}"),
    ("(1,2]", "x = 2"),
    ("eval('1+1')", "7"),
    ("\\sin(x)+2i", "\\pi"),
]


def equal(pred: str, gold: str, seconds: int) -> bool:
    """math-verify equivalence of two LaTeX answers (each parsed as the content of a \\boxed{})."""
    from math_verify import LatexExtractionConfig, parse, verify  # heavy: sympy start-up, after main() capped memory

    cfg = [LatexExtractionConfig(boxed_match_priority=0)]
    g = parse("\\boxed{" + gold + "}", cfg, parsing_timeout=seconds)
    p = parse("\\boxed{" + pred + "}", cfg, parsing_timeout=seconds)
    if not g or not p:
        return False
    return bool(verify(g, p, timeout_seconds=seconds))


def serve(handle: Callable[[dict[str, Any]], Any], out: TextIO) -> int:
    """The worker side of `p3o.rewards.sandbox.Worker`'s protocol (every p3o worker runs this loop).

    Writes ``{"ready": true}``, then answers each JSON request line on stdin with one line: ``{"ok": true,
    "value": handle(request)}``, or ``{"ok": false, "error": "<Type>: <message>"}`` when it raises.
    A KeyboardInterrupt ends the loop; so does the end of stdin. Returns the exit status (0).
    """
    out.write('{"ready": true}\n')
    out.flush()
    for line in sys.stdin:
        try:
            reply = {"ok": True, "value": handle(json.loads(line))}
        except BaseException as err:
            if isinstance(err, KeyboardInterrupt):
                return 0
            reply = {"ok": False, "error": f"{type(err).__name__}: {str(err)[:200]}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()
    return 0


def _handle(req: dict[str, Any]) -> object:
    op = req.get("op")
    if op == "equal":
        return equal(str(req["pred"]), str(req["gold"]), max(1, int(req.get("seconds", 1))))
    if op == "ping":
        return True
    if op == "sleep":  # health checks and tests of the parent's timeout
        time.sleep(float(req.get("s", 0)))
        return True
    raise ValueError(f"unknown op {op!r}")


def main() -> int:
    _die_with_parent()
    _limit_memory()
    logging.disable(logging.CRITICAL)
    # heavy: sympy start-up, under the memory cap; imported up front so the first request is not slowed by it
    import math_verify  # noqa: F401

    for pred, gold in WARM_UP:  # before the ready line, so no call pays for it
        equal(pred, gold, 5)
    return serve(_handle, sys.stdout)


if __name__ == "__main__":
    sys.exit(main())
