"""Rollout workers as Ray actors on a real local 2-node Ray cluster (tiny random model, CPU; conftest.py): placement
changes nothing (workers 1 sync on the second node ≡ workers 0, through the object store and over the collective
weight group), the lag bound holds per token with 2 workers, in-flight updates stamp several versions in one response,
and a SIGKILLed worker is restarted (and rejoins the weight group) without losing or duplicating a batch."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch
from cluster_args import before_each_update, ray_args
from conftest import WORKER_RESOURCE

from p3o.cluster import RaySource
from p3o.config import load_config
from p3o.train.loop import run


def _run(run_dir: Path, **overrides: object) -> tuple[list[dict], dict[str, torch.Tensor]]:
    """Run; returns (metrics rows, final parameters)."""
    from safetensors.torch import load_file

    out = run(load_config(ray_args(run_dir, **overrides)), remote_source=RaySource)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    (weights,) = sorted((out / "final").glob("*.safetensors"))
    return rows, load_file(str(weights))


def _training(rows: list[dict]) -> list[dict]:
    skip = ("sync_bytes", "worker_restarts", "dropped_batches", "tokens_per_s")
    return [{k: v for k, v in r.items() if not k.startswith("time_") and k not in skip} for r in rows]


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_one_worker_sync_is_bit_identical_to_in_process(ray_cluster, tmp_path):
    # the held-out evaluation runs on the worker (its own engine) and must give the in-process numbers too; the worker
    # sits on the second node (ray.worker_resource), so every version crosses nodes through the object store
    ev = {"task.n_eval": 8, "log.eval_every": 2}
    rows0, p0 = _run(tmp_path / "w0", **{"rollout.workers": 0, "loop.mode": "sync", **ev})
    on_second = {"ray.worker_resource": WORKER_RESOURCE}
    rows1, p1 = _run(tmp_path / "w1", **{"rollout.workers": 1, "loop.mode": "sync", **ev, **on_second})
    assert any(r.get("loss", 0) != 0 for r in rows0)  # the updates really move the policy
    assert _same(p0, p1)
    assert _training(rows0) == _training(rows1)
    assert [r["step"] for r in rows1 if "eval_score" in r] == [0, 2, 4]  # the starting policy is step 0
    assert rows1[-1]["sync_bytes"] == sum(v.numel() * v.element_size() for v in p1.values()) > 0
    workers = json.loads((tmp_path / "w1" / "rollout_workers.json").read_text())["workers"]
    assert len(workers) == 1 and workers[0]["engine"] == "hf" and workers[0]["pid"] != os.getpid()
    assert workers[0]["node"] == ray_cluster.test_nodes["second"] != ray_cluster.get_runtime_context().get_node_id()


def test_two_workers_async_keep_every_token_within_max_lag(ray_cluster, tmp_path):
    # fixed schedule: two workers generate up to max_lag + 1 batches at once, and the run is exactly the in-process
    # async run (and so the stale FIFO, n = max_lag); the lag histogram covers every consumed token. The versions go
    # over the collective weight group (gloo) to both workers on the second node: each holds the versions its
    # pending batches need
    collective = {"rollout.weight_sync": "collective", "ray.worker_resource": WORKER_RESOURCE}
    rows_ray, p_ray = _run(
        tmp_path / "fixed", **{"rollout.workers": 2, "loop.mode": "async", "loop.max_lag": 2, **collective}
    )
    rows_in, p_in = _run(tmp_path / "inproc", **{"rollout.workers": 0, "loop.mode": "async", "loop.max_lag": 2})
    assert _training(rows_ray) == _training(rows_in) and _same(p_ray, p_in)
    assert [r["lag_max"] for r in rows_ray] == [0, 1, 2, 2]
    for r in rows_ray:
        assert 0 <= r["lag_min"] <= r["lag_max"] <= 2
        hist = {k: v for k, v in r.items() if k.startswith("lag_hist_")}
        assert set(hist) <= {"lag_hist_0", "lag_hist_1", "lag_hist_2"} and abs(sum(hist.values()) - 1) < 1e-9
    workers = json.loads((tmp_path / "fixed" / "rollout_workers.json").read_text())["workers"]
    assert len({w["pid"] for w in workers}) == 2
    assert {w["node"] for w in workers} == {ray_cluster.test_nodes["second"]}
    assert rows_ray[-1]["sync_bytes"] == sum(v.numel() * v.element_size() for v in p_ray.values())


def test_drop_policy_never_trains_on_a_token_too_old(ray_cluster, tmp_path):
    # free schedule, lag_policy drop, max_lag 0: two eager workers generate ahead from older versions, so batches
    # arrive too old; each is dropped whole and counted, and every trained token is on-policy
    rows, _ = _run(
        tmp_path / "drop",
        **{
            "rollout.workers": 2,
            "loop.mode": "async",
            "loop.schedule": "free",
            "loop.lag_policy": "drop",
            "loop.max_lag": 0,
        },
    )
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all(r["lag_max"] == 0 for r in rows)
    assert rows[-1]["dropped_batches"] > 0 and rows[-1]["dropped_rows"] == 8 * rows[-1]["dropped_batches"]


def test_resumed_lora_trainer_with_workers_ends_as_an_uninterrupted_run(ray_cluster, tmp_path, monkeypatch):
    from test_determinism import _Stop, stop_after

    # with LoRA: the workers receive only the merged adapted layers (sync_bytes below the full model's), here over
    # the collective weight group; the resumed trainer forms a new group with a new worker
    fixed = {
        "rollout.workers": 1,
        "loop.mode": "async",
        "loop.max_lag": 1,
        "ckpt.every": 1,
        "model.lora.r": 4,
        "rollout.weight_sync": "collective",
    }
    with monkeypatch.context() as m:
        stop_after(m, 2)  # the trainer dies after step 2 (its checkpoint holds the queued batches)
        with pytest.raises(_Stop):
            _run(tmp_path / "resumed", **fixed)
    rows, params = _run(tmp_path / "resumed", **{**fixed, "ckpt.resume": True})
    rows_ok, params_ok = _run(
        tmp_path / "ok", **{"rollout.workers": 0, "loop.mode": "async", "loop.max_lag": 1, "model.lora.r": 4}
    )
    assert _training(rows) == _training(rows_ok) and _same(params, params_ok)
    assert 0 < rows[-1]["sync_bytes"] < sum(v.numel() * v.element_size() for v in params.values())


def test_inflight_updates_stamp_several_versions_in_one_response(ray_cluster, tmp_path, monkeypatch):
    mixed: list[int] = []

    def recording(batch):
        v = batch.policy_version.masked_fill(~batch.mask, -1)
        lo = batch.policy_version.masked_fill(~batch.mask, 1 << 30).min(1).values
        mixed.append(int((v.max(1).values > lo).sum()))  # responses holding >= 2 versions

    # Whether a new version lands while a consumed batch is still decoding is a matter of the two processes' speeds
    # (it is what in-flight updates are for), and those differ between CPUs (AVX2 vs AVX-512 kernels): up to three
    # independent runs. Whether any run meets one is timing (a clean-clone suite on this idle 2-core box saw five runs
    # in a row without one), so the mechanism itself is checked without timing in test_worker.py, and here a
    # machine that never lands a version mid-response skips with that reason instead of failing on its speed.
    for attempt in range(5):
        mixed.clear()
        with before_each_update(recording):
            rows, _ = _run(
                tmp_path / f"inflight-{attempt}",
                steps=6,
                **{
                    "rollout.workers": 1,
                    "rollout.inflight_updates": True,
                    "rollout.max_new_tokens": 96,
                    "rollout.prompts_per_step": 8,
                    "loop.mode": "async",
                    "loop.schedule": "free",
                    "loop.lag_policy": "drop",  # the worker never waits: every new version reaches a running batch
                    "loop.max_lag": 2,
                },
            )
        assert all(r["lag_max"] <= 2 for r in rows)
        if sum(mixed) > 0:
            break
    if sum(mixed) == 0:
        pytest.skip("no new version reached a running response in 5 runs on this machine (timing; see test_worker.py)")


@pytest.mark.parametrize("weight_sync", ["object_store", "collective"])
def test_sigkilled_worker_is_restarted_and_no_batch_is_lost(ray_cluster, tmp_path, monkeypatch, weight_sync):
    # collective: the restarted process joins the weight group again and receives the versions its re-issued
    # requests need before it generates
    run_dir = tmp_path / "killed"
    calls = {"n": 0}
    killed: list[int] = []

    def kill_at_the_second_update(batch):
        calls["n"] += 1
        if calls["n"] == 2:  # the worker is generating the next batches now (async, fixed schedule)
            pid = json.loads((run_dir / "rollout_workers.json").read_text())["workers"][0]["pid"]
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    with before_each_update(kill_at_the_second_update):
        rows, params = _run(
            run_dir,
            steps=5,
            **{"rollout.workers": 1, "loop.mode": "async", "loop.max_lag": 1, "rollout.weight_sync": weight_sync},
        )
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]  # every step logged exactly once
    assert rows[-1]["worker_restarts"] >= 1
    worker = json.loads((run_dir / "rollout_workers.json").read_text())["workers"][0]
    assert worker["pid"] != killed[0] and worker["restarts"] >= 1
    # the re-issued requests carried their versions: the run equals an uninterrupted one
    rows_ok, params_ok = _run(
        tmp_path / "ok", steps=5, **{"rollout.workers": 0, "loop.mode": "async", "loop.max_lag": 1}
    )
    assert _training(rows) == _training(rows_ok) and _same(params, params_ok)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"rollout.workers": -1}, "rollout.workers"),
        ({"rollout.workers": 1, "ray.address": "127.0.0.1:9"}, "ray.address: cannot reach"),
        ({"rollout.workers": 1, "ray.worker_python": "/nonexistent/python"}, "ray.worker_python: /nonexistent"),
        (  # Ray starts (preflight), then the missing resource is refused before any model loads
            {"rollout.workers": 2, "ray.num_cpus": 2, "ray.worker_resource": "nosuch"},
            "ray.worker_resource: the Ray cluster declares 0 units of 'nosuch'",
        ),
    ],
)
def test_bad_settings_exit_2_with_one_line(tmp_path, overrides, message):
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "p3o", "train", *ray_args(tmp_path / "bad", **overrides)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr
