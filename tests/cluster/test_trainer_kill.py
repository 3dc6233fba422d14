"""SIGKILL of the trainer mid-run with Ray rollout workers, then `p3o train --resume`: the run ends with the
parameters of an uninterrupted one (HF engine, fp32, async with the fixed schedule). The killed run is a real
`p3o train` process, a driver of the suite's Ray cluster: its worker dies with it (Ray ends a dead driver's actors),
and the resumed run starts a new one."""

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


def test_sigkilled_trainer_resumes_to_the_uninterrupted_run(ray_cluster, tmp_path):
    from safetensors.torch import load_file

    from p3o.config import load_config
    from p3o.train.loop import run

    fixed = {"steps": 5, "loop.mode": "async", "loop.max_lag": 1, "ckpt.every": 1, "ckpt.keep_last": 5}
    run_dir = tmp_path / "killed"
    address = ray_cluster.get_runtime_context().gcs_address
    args = ray_args(run_dir, **fixed, **{"rollout.workers": 1, "ray.address": address})
    proc = subprocess.Popen(_cmd(*args), env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    try:
        while not (run_dir / "checkpoints" / "step_000002").is_dir():
            assert proc.poll() is None, f"the run ended before its second checkpoint: {proc.stderr.read()[-2000:]}"
            assert time.monotonic() < deadline, "no second checkpoint within 300 s"
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGKILL)  # mid-run: steps 3-5 are not done
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert not (run_dir / "final").exists()
    orphan = json.loads((run_dir / "rollout_workers.json").read_text())["workers"][0]["pid"]
    deadline = time.monotonic() + 60
    while _alive(orphan):  # Ray ends the actors of a dead driver
        assert time.monotonic() < deadline, f"the dead trainer's worker (pid {orphan}) is still running"
        time.sleep(0.5)
    resumed = subprocess.run(
        _cmd("--run_dir", str(run_dir), "--resume"), env=_env(), capture_output=True, text=True, timeout=600
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]  # every step once, the resumed ones rewritten

    ok = run(load_config(ray_args(tmp_path / "ok", **fixed, **{"rollout.workers": 0})))
    a = load_file(str(run_dir / "final" / "model.safetensors"))
    b = load_file(str(ok / "final" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
