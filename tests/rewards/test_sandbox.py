"""The verifier worker process: hard timeouts kill and replace it, and nothing is left running."""

from __future__ import annotations

import os
import time

from p3o.rewards.sandbox import Worker


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie counts as dead
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_timeout_kills_and_restarts() -> None:
    w = Worker()
    try:
        assert w.call({"op": "ping"}, timeout_s=30.0) is True
        first = w.pid
        assert first is not None
        t = time.perf_counter()
        assert w.call({"op": "sleep", "s": 30}, timeout_s=0.3) is None  # overran: killed, None returned
        assert time.perf_counter() - t < 2.0
        assert w.restarts == 1 and not _alive(first)
        assert w.pid is not None and w.pid != first  # a replacement is started at once
        assert w.call({"op": "equal", "pred": "\\frac{2}{4}", "gold": "0.5"}, timeout_s=30.0) is True
        assert w.call({"op": "bogus"}, timeout_s=5.0) is None  # an error reply is None, the worker keeps serving
        assert w.call({"op": "ping"}, timeout_s=5.0) is True
    finally:
        pid = w.pid
        w.close()
    assert pid is not None and not _alive(pid)
