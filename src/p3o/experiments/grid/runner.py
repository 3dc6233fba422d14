"""Run the training runs of an experiment grid: one after another or several processes at once, resumably.

Each run is a subprocess `python -m p3o train --key value ...` (the same overrides a user would type), or with
`in_process=True` a call of `p3o.train.cli.main` with the same arguments in this process (no interpreter start-up
per run; one run at a time). Its output goes to `out_dir/logs/<regime>/<objective>/seed<k>.log`. A run whose
directory holds a `DONE` marker (written here on success: the command, its wall time and the run's record, see
:func:`run_record_fields`) or a `final/` checkpoint is finished and is never re-run
(if its DONE records other settings than the grid now asks for, the run is reported as failed instead: results of
different settings are never mixed, nor deleted); a run that was started by the grid but did not finish is started
again from scratch.

Usage:

    outcomes = run_grid(expand(exp), jobs=2, log_root=exp.out_dir / "logs")
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import cache
from pathlib import Path
from typing import Any, TextIO

from p3o.experiments.grid.spec import RunSpec

DEFAULT_TRAIN_CMD: tuple[str, ...] = (sys.executable, "-m", "p3o", "train")


@dataclass
class RunOutcome:
    """What happened to one run: `done` (trained now), `skipped` (already finished) or `failed`."""

    spec: RunSpec
    status: str
    seconds: float = 0.0
    returncode: int | None = None
    log_path: Path | None = None
    message: str = ""


def is_finished(run_dir: Path) -> bool:
    """A run is finished when it has a DONE marker or a non-empty final/ checkpoint."""
    final = run_dir / "final"
    return (run_dir / "DONE").is_file() or (final.is_dir() and any(final.iterdir()))


def format_value(value: Any) -> str:
    """A config value as a command-line token: booleans lower-case, None as 'null', lists as JSON."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value)
    return str(value)


def train_argv(spec: RunSpec, train_cmd: Sequence[str] = DEFAULT_TRAIN_CMD) -> list[str]:
    """The full command line of one run: `train_cmd --key value ...` for every merged override."""
    argv = list(train_cmd)
    for key, value in spec.overrides.items():
        argv += [f"--{key}", format_value(value)]
    return argv


def utc_now() -> str:
    """The current time, ISO 8601 in UTC with its offset (``2026-12-02T07:31:23.123456+00:00``)."""
    return datetime.now(timezone.utc).isoformat()


@cache
def cpu_kind() -> str:
    """This machine's CPU as one string: /proc/cpuinfo's model name and the ISA extensions the results depend on
    (``"AMD EPYC 9B14 (avx512, avx512_bf16)"``; ``"unknown"`` parts where /proc/cpuinfo is not readable)."""
    model, flags = "", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and not model:
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    isa = [f for f in ("avx512f", "avx512_bf16", "amx_tile") if f in flags] or [f for f in ("avx2",) if f in flags]
    names = {"avx512f": "avx512", "amx_tile": "amx"}
    return f"{model or 'unknown'} ({', '.join(names.get(f, f) for f in isa) or 'unknown ISA'})"


def base_key(run_dir: Path, model_name: str | None) -> str | None:
    """The key of the policy a run started from: the shipped base its checkpoint records (``final/config.json``'s
    ``p3o_base``: ``"tiny@<sha256 of the weights, 12 hex>"``, `p3o.models.bases.base_id`), else the directory it says
    it was loaded from (``_name_or_path``); else, for a built-in tiny name, the shipped base's id (``tiny``,
    ``tiny-pad``, ``tiny-agent``) or the cache key of its warm-started base when that entry exists
    (``p3o.models.tiny.base_key``: size, task, seed and the code version); else the configured ``model.name``; None
    when neither is known. Never builds anything."""
    from p3o.models.bases import base_id, shipped_dir, stamp  # call-time: a tiny model's base (no torch)

    try:
        saved = json.loads((run_dir / "final" / "config.json").read_text())
        loaded, shipped = saved.get("_name_or_path"), base_id(saved.get("p3o_base"))
    except (OSError, json.JSONDecodeError, AttributeError):
        loaded = shipped = None
    if shipped is not None:
        return shipped
    if isinstance(loaded, str) and loaded:
        return Path(loaded).name if os.sep in loaded else loaded
    if model_name is not None and shipped_dir(model_name) is not None:
        return base_id(stamp(model_name))
    if model_name is not None:
        from p3o.models.tiny import base_dir, parse_tiny  # call-time: only for a tiny model's base key (no torch)

        tiny = parse_tiny(model_name)
        if tiny is not None and not tiny[1]:  # an unknown size or a testbed name has no such entry
            path = base_dir(tiny[0])
            if path.is_dir():
                return path.name
    return model_name


def run_record_fields(spec: RunSpec, started_at: str, ended_at: str, seconds: float) -> dict[str, Any]:
    """What DONE records about a run besides its command: ``started_at`` / ``ended_at`` (ISO 8601 UTC),
    ``wall_s``, ``cpu`` (:func:`cpu_kind`) and ``base_key`` (:func:`base_key`)."""
    name = spec.overrides.get("model.name")
    return {
        "started_at": started_at,
        "ended_at": ended_at,
        "wall_s": round(seconds, 2),
        "cpu": cpu_kind(),
        "base_key": base_key(spec.run_dir, None if name is None else str(name)),
    }


def _read_done(run_dir: Path) -> dict[str, Any] | None:
    try:
        done = json.loads((run_dir / "DONE").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return done if isinstance(done, dict) else None


def _pairs(args: Sequence[str]) -> dict[str, str]:
    return {args[i]: args[i + 1] for i in range(0, len(args) - 1, 2)}


def _log_path(log_root: Path, spec: RunSpec) -> Path:
    return log_root / spec.regime / spec.objective / f"seed{spec.seed}.log"


def _last_line(path: Path) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1].strip()[:300] if lines else ""


def run_one(
    spec: RunSpec,
    *,
    log_root: Path,
    train_cmd: Sequence[str] = DEFAULT_TRAIN_CMD,
    env: dict[str, str] | None = None,
    timeout_s: float | None = None,
    in_process: bool = False,
) -> RunOutcome:
    """Train one run unless it is finished; write DONE (wall time, command) into its directory on success.

    in_process: call `p3o.train.cli.main(argv)` here instead of a subprocess (`train_cmd` and `timeout_s` unused).
    """
    log_path = _log_path(log_root, spec)
    args = train_argv(spec, ())
    if is_finished(spec.run_dir):
        done = _read_done(spec.run_dir)
        if done is not None and "args" in done and done["args"] != args:
            # Never mix results of other settings into a grid, and never delete them silently.
            changed = sorted(set(_pairs(done["args"]).items()) ^ set(_pairs(args).items()))
            keys = sorted({k for k, _ in changed})
            why = f"{spec.run_dir} finished with other settings ({', '.join(keys)}): remove it or use another out_dir"
            return RunOutcome(spec, "failed", log_path=log_path, message=why)
        return RunOutcome(spec, "skipped", log_path=log_path)
    if spec.run_dir.exists() and log_path.exists():
        # Started by an earlier invocation of this grid and interrupted: start it again from scratch.
        shutil.rmtree(spec.run_dir)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    argv = train_argv(spec, train_cmd)
    started_at = utc_now()
    start = time.perf_counter()
    rc: int | None
    if in_process:
        argv = ["p3o", "train", *train_argv(spec, ())]
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(argv) + "\n")
        log.flush()
        if in_process:
            rc = _train_in_process(argv[2:], log)
        else:
            try:
                proc = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=timeout_s)
                rc = proc.returncode
            except subprocess.TimeoutExpired:
                rc = None
    seconds = time.perf_counter() - start
    if rc != 0:
        why = f"timed out after {timeout_s:.0f} s" if rc is None else f"exit {rc}: {_last_line(log_path)}"
        return RunOutcome(spec, "failed", seconds, rc, log_path, why)
    spec.run_dir.mkdir(parents=True, exist_ok=True)
    done = {"seconds": round(seconds, 2), "argv": argv, "args": args}
    done.update(run_record_fields(spec, started_at, utc_now(), seconds))
    (spec.run_dir / "DONE").write_text(json.dumps(done) + "\n")
    return RunOutcome(spec, "done", seconds, rc, log_path)


def _train_in_process(args: list[str], log: TextIO) -> int:
    """`p3o train ARGS` in this process, its output in `log`; an unexpected exception is logged and gives exit 1."""
    from p3o.train.cli import main as train_main  # heavy start-up (transformers): only for --in-process

    with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        try:
            return int(train_main(args) or 0)
        except SystemExit as err:
            return err.code if isinstance(err.code, int) else 1
        except Exception:
            traceback.print_exc(file=log)
            return 1


def run_grid(
    runs: Sequence[RunSpec],
    *,
    log_root: Path,
    jobs: int = 1,
    train_cmd: Sequence[str] = DEFAULT_TRAIN_CMD,
    threads_per_job: int | None = None,
    timeout_s: float | None = None,
    in_process: bool = False,
    on_outcome: Callable[[RunOutcome], None] | None = None,
    after: Callable[[RunSpec], str | None] | None = None,
) -> list[RunOutcome]:
    """Run every unfinished run, `jobs` processes at a time; a failed run is reported and the others go on.

    `after(spec)` runs in the same worker once a run is finished (trained now or skipped), e.g. its evaluation, so
    it overlaps with the other workers' training; its return value goes into the outcome's message and an exception
    from it is reported there without failing the run.

    Each process gets OMP_NUM_THREADS = threads_per_job (default: the machine's cores divided by `jobs`), so
    parallel jobs do not oversubscribe the CPU. Outcomes come back in the order of `runs`.
    """
    if jobs < 1:
        raise ValueError(f"jobs must be ≥ 1, got {jobs}")
    if in_process and jobs > 1:
        raise ValueError("in_process runs one at a time: use jobs=1")
    threads = threads_per_job or max(1, (os.cpu_count() or 1) // jobs)
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    lock = threading.Lock()

    def work(spec: RunSpec) -> RunOutcome:
        outcome = run_one(
            spec, log_root=log_root, train_cmd=train_cmd, env=env, timeout_s=timeout_s, in_process=in_process
        )
        if after is not None and outcome.status != "failed":
            try:
                outcome.message = after(spec) or ""
            except Exception as err:  # an evaluation problem must not lose the finished run
                outcome.message = f"after-run step failed: {type(err).__name__}: {err}"
        if on_outcome is not None:
            with lock:
                on_outcome(outcome)
        return outcome

    if jobs == 1:
        return [work(spec) for spec in runs]
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(work, runs))
