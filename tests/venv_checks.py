"""Run a checks script inside another virtualenv (.venv-verl, .venv-vllm) and collect its PASS / FAIL lines.

A checks script prints one line per check, ``PASS name``, ``FAIL name: detail`` or ``SKIP name: reason`` (its
``main`` is :func:`run_named_checks`; a check raises :class:`SkipCheck` when this machine lacks what it needs); the
main suite turns each line into a test (:func:`assert_check` passes, fails or skips it). Used by
tests/integrations/test_verl.py, test_trl_vllm.py and tests/rollout/test_vllm.py:

    results = run_checks(VLLM_PYTHON, CHECKS_FILE, [["a", "b"], ["c"]])   # two processes at once

A test module declares its checks in ``VENV_CHECKS`` (a list of :func:`checks_or_skip` keyword sets); the suite's
conftest hands every selected module's sets to :func:`prestart` once collection ends, so the other virtualenvs'
checks (one process set at a time, in test order, each single-threaded) run on the second core while the main
suite runs on the first, and a module's fixture only collects what is already running or done.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


class SkipCheck(Exception):
    """Raised by a check when this machine cannot run it (e.g. a CPU feature it lacks); the message is the reason."""


def parse_checks(stdout: str) -> dict[str, str]:
    """``{name: "PASS" | "FAIL: detail" | "SKIP: reason"}`` from a checks script's output (a "name (note)" keeps
    only the name)."""
    results = {}
    for line in stdout.splitlines():
        status, _, rest = line.partition(" ")
        if status in ("PASS", "FAIL", "SKIP"):
            name, _, detail = rest.partition(": ")
            name = name.split(" (")[0]
            results[name] = status if status == "PASS" else f"{status}: {detail}"
    return results


def declared_checks(script: Path) -> list[str]:
    """The names of the checks a venv script declares (each ``@check`` function), in file order."""
    return [line.split("(")[0][4:] for line in script.read_text().split("@check\n")[1:]]


def assert_check(results: dict[str, str], name: str) -> None:
    """The body of a test standing for one check: pass on PASS, skip with the reason on SKIP, fail otherwise."""
    import pytest

    got = results.get(name, "not run")
    if got.startswith("SKIP: "):
        pytest.skip(got[len("SKIP: ") :])
    assert got == "PASS", got


def run_checks(
    python: Path,
    script: Path,
    groups: Sequence[Sequence[str]] = ((),),
    *,
    timeout: float = 600,
    env: dict[str, str] | None = None,
) -> tuple[dict[str, str], list[str]]:
    """Run ``python script *group`` for every group at once (``()``: the script's own default set) with the
    project's src/ on PYTHONPATH (plus ``env``); returns the merged results and, per process, its exit status and
    stderr tail."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1", **(env or {})}
    with _LOCK:
        if _CLOSED.is_set():
            return {}, ["the test session ended before these checks started"]
        procs = [
            subprocess.Popen(
                [str(python), str(script), *names],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for names in groups
        ]
        _LIVE.extend(procs)
    results: dict[str, str] = {}
    errors: list[str] = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        results.update(parse_checks(out))
        errors.append(f"exit {proc.returncode}: {err[-1500:]}")
    with _LOCK:
        for proc in procs:
            _LIVE.remove(proc)
    return results, errors


def run_named_checks(checks: dict[str, Callable[[], None]], names: Sequence[str]) -> int:
    """The ``main`` of a checks script: run ``names`` (all of ``checks`` when empty), print one PASS / FAIL line
    each (the FAIL line ends with the traceback's last lines; the whole traceback goes to stderr); exit status 1
    when any failed. Stdlib only, so it runs in any virtualenv."""
    failed = 0
    for name in names or list(checks):
        t0 = time.perf_counter()
        try:
            checks[name]()
            print(f"PASS {name} ({time.perf_counter() - t0:.1f} s)", flush=True)
        except SkipCheck as why:
            print(f"SKIP {name}: {' '.join(str(why).split())}", flush=True)
        except Exception as exc:  # report every check, then fail
            failed += 1
            tail = " | ".join(traceback.format_exc().strip().splitlines()[-3:])
            detail = " ".join(f"{type(exc).__name__}: {exc}".split())[:500]
            print(f"FAIL {name}: {detail} | {tail}", flush=True)
            traceback.print_exc(file=sys.stderr)
    return 1 if failed else 0


#: Outcome of one check set: ("skip", reason), ("fail", message) or ("ok", results).
Outcome = tuple[str, object]

_LOCK = threading.Lock()
_CLOSED = threading.Event()
_LIVE: list[subprocess.Popen] = []
_STARTED: dict[tuple, Future] = {}
_POOL: ThreadPoolExecutor | None = None


def _key(
    python: Path,
    script: Path,
    groups: Sequence[Sequence[str]] = ((),),
    imports: str | None = None,
    env: dict[str, str] | None = None,
    **_: Any,
) -> tuple:
    """What identifies one check set (the keywords of :func:`checks_or_skip`) on the background runner."""
    return (str(python), str(script), tuple(tuple(g) for g in groups), imports, tuple(sorted((env or {}).items())))


def _outcome(
    python: Path,
    script: Path,
    *,
    missing: str,
    groups: Sequence[Sequence[str]] = ((),),
    imports: str | None = None,
    env: dict[str, str] | None = None,
) -> Outcome:
    """Probe the virtualenv, then run the script's checks: what :func:`checks_or_skip` turns into skip / fail /
    results (no pytest here, so it runs on a background thread)."""
    if not python.exists():
        return "skip", missing
    if imports:
        code, _, err = run_tracked([str(python), "-c", f"import {imports}"], timeout=300)
        if code != 0:
            return "skip", f"{python.parents[1].name} cannot import {imports}: {err.strip().splitlines()[-1:]}"
    results, errors = run_checks(python, script, groups, env=env)
    if not results:
        return "fail", f"{script.name} ran no check: {' | '.join(errors)}"
    return "ok", results


def submit(key: tuple, fn: Callable[..., Any], **kwargs: Any) -> None:
    """Queue ``fn(**kwargs)`` under ``key`` on the background runner (one job at a time, in the order queued);
    queuing a key twice runs it once. :func:`collect` takes its result."""
    global _POOL
    with _LOCK:
        if key in _STARTED or _CLOSED.is_set():
            return
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=1, thread_name_prefix="venv-checks")
        _STARTED[key] = _POOL.submit(fn, **kwargs)


def collect(key: tuple, fn: Callable[..., Any], **kwargs: Any) -> Any:
    """The result of the job queued under ``key``: waited for when it is running or done, taken back and run here
    when it has not started yet (so a test never waits behind other jobs), run here when none was queued."""
    with _LOCK:
        future = _STARTED.get(key)
    if future is not None and not future.cancel():
        return future.result()
    return fn(**kwargs)


def run_tracked(cmd: Sequence[str], *, timeout: float, **popen: Any) -> tuple[int, str, str]:
    """``subprocess.run(cmd)`` whose process :func:`shutdown` kills: (exit status, stdout, stderr)."""
    with _LOCK:
        if _CLOSED.is_set():
            return -1, "", "the test session ended before this command started"
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)
        _LIVE.append(proc)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    finally:
        with _LOCK:
            _LIVE.remove(proc)
    return proc.returncode, out, err


def prestart(**spec: Any) -> None:
    """Queue one check set (the keywords of :func:`checks_or_skip`) on the background runner."""
    submit(_key(**spec), _outcome, **spec)


def shutdown() -> None:
    """End of the test session: drop the queued sets and kill any check process still running."""
    _CLOSED.set()
    with _LOCK:
        for future in _STARTED.values():
            future.cancel()
        for proc in _LIVE:
            proc.kill()
    if _POOL is not None:
        _POOL.shutdown(wait=False, cancel_futures=True)


def checks_or_skip(**spec: Any) -> dict[str, str]:
    """A test module's fixture body, given the keywords of :func:`_outcome` (``python``, ``script``, ``missing``,
    ``groups``, ``imports``, ``env``): skip with ``missing`` when the virtualenv is absent (or cannot import
    ``imports``), run the script's checks, fail when it ran none (quoting each process's stderr tail). A set
    :func:`prestart` queued is taken from the background runner (:func:`collect`)."""
    import pytest

    status, value = collect(_key(**spec), _outcome, **spec)
    if status == "skip":
        pytest.skip(str(value))
    if status == "fail":
        pytest.fail(str(value))
    return value  # type: ignore[return-value]
