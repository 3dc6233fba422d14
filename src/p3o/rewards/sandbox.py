"""A long-lived helper process with a hard per-call time limit (for math-verify, whose sympy calls can hang).

The worker (`p3o.rewards.mv_worker`) is started lazily on first use, talks JSON lines over pipes, and is killed
and replaced when a call overruns its limit, so a hostile input costs at most `timeout_s` plus a restart. The
child also dies with the parent (PR_SET_PDEATHSIG) and is killed at interpreter exit: no leaked processes.

    worker = Worker()
    worker.call({"op": "equal", "pred": "1/2", "gold": "0.5"}, timeout_s=1.0)   # -> True, or None on timeout
"""

from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import Any

_WORKERS: weakref.WeakSet[Worker] = weakref.WeakSet()


class Worker:
    """One child process running `module`; `call` sends a request and waits at most `timeout_s` for the reply.

    Thread-safe (a lock serialises calls). Startup time (imports) is bounded separately by `start_timeout_s`.
    """

    def __init__(self, module: str = "p3o.rewards.mv_worker", start_timeout_s: float = 60.0) -> None:
        self.module = module
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self._buf = b""
        self._lock = threading.Lock()
        _WORKERS.add(self)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def _spawn(self) -> None:
        env = dict(os.environ)
        src = str(Path(__file__).resolve().parents[2])  # the dir holding the `p3o` package
        env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self.proc = subprocess.Popen(
            [sys.executable, "-u", "-m", self.module],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            close_fds=True,
        )
        self._buf = b""
        ready = self._read_line(self.start_timeout_s)
        if ready is None:
            self.close()
            raise RuntimeError(f"p3o.rewards: worker {self.module} did not start within {self.start_timeout_s:.0f}s")

    def _read_line(self, timeout_s: float) -> bytes | None:
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            readable, _, _ = select.select([fd], [], [], left)
            if not readable:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:  # the worker died
                return None
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line

    def call(self, request: dict[str, Any], timeout_s: float = 1.0) -> Any:
        """The worker's `value` for `request`, or None if it failed, overran `timeout_s` (then it is restarted)."""
        with self._lock:
            if self.proc is None or self.proc.poll() is not None:
                self._spawn()
            assert self.proc is not None and self.proc.stdin is not None
            try:
                self.proc.stdin.write((json.dumps(request) + "\n").encode())
                self.proc.stdin.flush()
            except (BrokenPipeError, OSError):
                self.close()
                return None
            line = self._read_line(timeout_s)
            if line is None:
                self.close()
                self.restarts += 1
                return None
            try:
                reply = json.loads(line)
            except json.JSONDecodeError:
                return None
            return reply.get("value") if reply.get("ok") else None

    def close(self) -> None:
        """Kill the worker (if running) and reap it."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=5)
        except Exception:
            pass
        for stream in (proc.stdin, proc.stdout):
            try:
                if stream is not None:
                    stream.close()
            except Exception:
                pass

    def __del__(self) -> None:
        self.close()


@atexit.register
def _close_all() -> None:
    for worker in list(_WORKERS):
        worker.close()
