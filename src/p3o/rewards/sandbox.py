"""A long-lived helper process with a hard per-call time limit (for math-verify, whose sympy calls can hang).

The worker (`p3o.rewards.mv_worker`) is started on first use, talks JSON lines over pipes, and is killed when a
call overruns its limit. After the first kill a warm spare is kept, so the next call does not wait for a fresh
interpreter to import sympy. A call's limit runs from the moment a ready worker has its request: a call that waits
for a worker to start (the first, or one right after a kill while the spare still imports) is queued, not charged,
and that start-up is bounded separately (``start_timeout_s``). Each worker leads its own process group, and a kill
takes the whole group: a tool's own child processes die with it. Workers die with the parent (PR_SET_PDEATHSIG) and
are killed at interpreter exit: no leaked processes.

    worker = Worker()
    worker.call({"op": "equal", "pred": "1/2", "gold": "0.5"}, timeout_s=1.0)   # -> True, or None on timeout
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import Any

from p3o.rewards.tally import record

_WORKERS: weakref.WeakSet[Worker] = weakref.WeakSet()


class _Child:
    """One worker process and its stdout buffer."""

    def __init__(self, module: str, args: tuple[str, ...] = ()) -> None:
        env = dict(os.environ)
        src = str(Path(__file__).resolve().parents[2])  # the dir holding the `p3o` package
        env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self.proc = subprocess.Popen(
            [sys.executable, "-u", "-m", module, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            close_fds=True,
            start_new_session=True,  # its own process group: a kill takes whatever the call started too
        )
        self.buf = b""
        self.ready = False

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def read_line(self, timeout_s: float) -> bytes | None:
        """The next stdout line, or None on timeout / EOF."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            readable, _, _ = select.select([fd], [], [], left)
            if not readable:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:  # the worker died
                return None
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line

    def wait_ready(self, timeout_s: float) -> bool:
        if not self.ready:
            self.ready = self.read_line(timeout_s) is not None
        return self.ready

    def kill(self) -> None:
        """SIGKILL the worker's process group (the worker and any process a call started), then reap the worker."""
        with contextlib.suppress(OSError):  # the group outlives a dead leader while its children run
            os.killpg(self.proc.pid, signal.SIGKILL)
        try:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait(timeout=5)
        except Exception:
            pass
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                if stream is not None:
                    stream.close()
            except Exception:
                pass


class Worker:
    """Runs `python -m module *args` in a child process; `call` sends a request, waits at most `timeout_s`.

    Thread-safe (a lock serialises calls). `restarts` counts kills after overruns and deaths, `timeouts` overruns;
    each is also recorded in the open `p3o.rewards.tally` tallies of the calling thread (as are `errors`).
    """

    def __init__(
        self, module: str = "p3o.rewards.mv_worker", start_timeout_s: float = 60.0, args: tuple[str, ...] = ()
    ) -> None:
        self.module = module
        self.args = tuple(args)
        self.start_timeout_s = start_timeout_s
        self.active: _Child | None = None
        self.spare: _Child | None = None
        self.restarts = 0
        self.timeouts = 0
        self._lock = threading.Lock()
        _WORKERS.add(self)

    @property
    def pid(self) -> int | None:
        """Process id of the worker that will serve the next call (None before the first call)."""
        child = self.active if self.active is not None and self.active.alive else self.spare
        return child.proc.pid if child is not None and child.alive else None

    def _activate(self) -> _Child:
        """A ready worker: the active one, the spare, or a fresh one, waiting up to start_timeout_s for it to start
        (a start-up is never charged to a call). RuntimeError when it does not start."""
        if self.active is not None and not self.active.alive:  # it died since its last reply
            self.active.kill()
            self.active = None
            self._restarted()
        if self.active is None:
            self.active, self.spare = (
                (self.spare, None) if self.spare is not None else (_Child(self.module, self.args), None)
            )
        if not self.active.ready and not self.active.wait_ready(self.start_timeout_s):
            self.close()
            raise RuntimeError(f"p3o.rewards: worker {self.module} did not start in {self.start_timeout_s:.0f}s")
        return self.active

    def call(self, request: dict[str, Any], timeout_s: float = 1.0) -> Any:
        """The worker's `value` for `request`, or None if it errored or overran `timeout_s` (then it is killed)."""
        status, value = self.request(request, timeout_s)
        return value if status == "ok" else None

    def request(self, request: dict[str, Any], timeout_s: float = 1.0) -> tuple[str, Any]:
        """(status, value): ("ok", value), ("error", message) or ("timeout", None) — killed after `timeout_s`.

        Counted (`p3o.rewards.tally.record`): "timeout" as a timeout, "error" as an error, a killed or dead worker
        as a restart.
        """
        status, value = self._request(request, timeout_s)
        if status == "timeout":
            self.timeouts += 1
            record("timeouts")
        elif status == "error":
            record("errors")
        return status, value

    def _restarted(self) -> None:
        self.restarts += 1
        record("restarts")

    def _request(self, request: dict[str, Any], timeout_s: float) -> tuple[str, Any]:
        with self._lock:
            child = self._activate()
            deadline = time.monotonic() + timeout_s  # the call's limit starts once a ready worker has it
            assert child.proc.stdin is not None
            try:
                child.proc.stdin.write((json.dumps(request) + "\n").encode())
                child.proc.stdin.flush()
            except (BrokenPipeError, OSError):
                child.kill()
                self.active = None
                self._restarted()
                return "error", "the worker process died"
            line = child.read_line(max(0.0, deadline - time.monotonic()))
            if line is None:
                died = time.monotonic() < deadline  # read_line returns early only at EOF: the worker exited
                child.kill()
                self.active = None
                self._restarted()
                if self.spare is None:
                    self.spare = _Child(self.module, self.args)  # warm up a replacement while the caller moves on
                return ("error", "the worker process died") if died else ("timeout", None)
            try:
                reply = json.loads(line)
            except json.JSONDecodeError:
                return "error", "unreadable reply from the worker"
            if reply.get("ok"):
                return "ok", reply.get("value")
            return "error", str(reply.get("error", "unknown error"))

    def close(self) -> None:
        """Kill the worker and its spare (if any) and reap them."""
        for child in (self.active, self.spare):
            if child is not None:
                child.kill()
        self.active = self.spare = None

    def __del__(self) -> None:
        self.close()


@atexit.register
def _close_all() -> None:
    for worker in list(_WORKERS):
        worker.close()
