"""SIGKILL of the trainer mid-run with Ray rollout workers, then `p3o train --resume`: the run ends with the
parameters of an uninterrupted one (HF engine, fp32, async with the fixed schedule). The killed run is a real
`p3o train` process, a driver of the suite's Ray cluster: its worker dies with it (Ray ends a dead driver's actors),
and the resumed run starts a new one. With 2 trainer ranks (torchrun, gloo) the whole trainer is killed (torchrun's
agent and both ranks, one process group) while rank 0's checkpoint holds both ranks' shares of a queued batch."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from cluster_args import ray_args

ROOT = Path(__file__).resolve().parents[2]


def _cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "p3o", "train", *args]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _torchrun(*args: str) -> list[str]:
    """2 trainer ranks on one host (gloo; `--standalone` picks a free rendezvous port)."""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    return [*launcher, "-m", "p3o", "train", *args]


def _kill_after_second_checkpoint(cmd: list[str], run_dir: Path) -> None:
    """Start `cmd` in a process group of its own, SIGKILL the whole group once `step_000002` is written, and wait until
    the worker it started (the driver's actor, in rollout_workers.json) is gone."""
    proc = subprocess.Popen(
        cmd, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    deadline = time.monotonic() + 300
    try:
        while not (run_dir / "checkpoints" / "step_000002").is_dir():
            assert proc.poll() is None, f"the run ended before its second checkpoint: {proc.stderr.read()[-2000:]}"
            assert time.monotonic() < deadline, "no second checkpoint within 300 s"
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGKILL)  # mid-run: the later steps are not done
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert not (run_dir / "final").exists()
    orphan = json.loads((run_dir / "rollout_workers.json").read_text())["workers"][0]["pid"]
    deadline = time.monotonic() + 60
    while _alive(orphan):  # Ray ends the actors of a dead driver
        assert time.monotonic() < deadline, f"the dead trainer's worker (pid {orphan}) is still running"
        time.sleep(0.5)


def _same_parameters(a_dir: Path, b_dir: Path) -> bool:
    from safetensors.torch import load_file

    a = load_file(str(a_dir / "final" / "model.safetensors"))
    b = load_file(str(b_dir / "final" / "model.safetensors"))
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_sigkilled_trainer_resumes_to_the_uninterrupted_run(ray_cluster, tmp_path):
    from p3o.config import load_config
    from p3o.train.loop import run

    fixed = {"steps": 5, "loop.mode": "async", "loop.max_lag": 1, "ckpt.every": 1, "ckpt.keep_last": 5}
    run_dir = tmp_path / "killed"
    address = ray_cluster.get_runtime_context().gcs_address
    _kill_after_second_checkpoint(
        _cmd(*ray_args(run_dir, **fixed, **{"rollout.workers": 1, "ray.address": address})), run_dir
    )
    resumed = subprocess.run(
        _cmd("--run_dir", str(run_dir), "--resume"), env=_env(), capture_output=True, text=True, timeout=600
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]  # every step once, the resumed ones rewritten

    ok = run(load_config(ray_args(tmp_path / "ok", **fixed, **{"rollout.workers": 0})))
    assert _same_parameters(run_dir, ok)


def test_sigkilled_two_rank_trainer_resumes_to_the_uninterrupted_run(ray_cluster, tmp_path):
    fixed = {"steps": 4, "loop.mode": "async", "loop.max_lag": 1, "ckpt.every": 1, "ckpt.keep_last": 4}
    run_dir = tmp_path / "killed"
    address = ray_cluster.get_runtime_context().gcs_address  # rank 0 is a driver of the suite's cluster
    _kill_after_second_checkpoint(
        _torchrun(*ray_args(run_dir, **fixed, **{"rollout.workers": 1, "ray.address": address})), run_dir
    )
    saved = torch.load(run_dir / "checkpoints" / "step_000002" / "trainer_state.pt", weights_only=True)
    queue = saved["loop_state"]["rank_source"][0]["queue"]  # rank 0's: both ranks' shares of each queued batch
    assert queue and all(len(shares) == 2 for _, shares, _ in queue)
    resumed = subprocess.run(
        _torchrun("--run_dir", str(run_dir), "--resume"), env=_env(), capture_output=True, text=True, timeout=600
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]

    ok = tmp_path / "ok"  # uninterrupted, 2 ranks with in-process engines
    cmd = _torchrun(*ray_args(ok, **fixed, **{"rollout.workers": 0}))
    done = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _same_parameters(run_dir, ok)
    ok_rows = [json.loads(line) for line in (ok / "metrics.jsonl").read_text().splitlines()]
    assert [r["loss"] for r in rows] == [r["loss"] for r in ok_rows]
