"""Several trainer ranks fed by Ray rollout workers: 2 gloo ranks (spawned processes, torchrun's environment) with
`--rollout.workers 1 --loop.mode sync` end bit-identical to 2 ranks with in-process engines (HF engine, fp32): the
worker produces each rank's share of every batch exactly as that rank's own engine would, rank 0 hands the shares out
and publishes the versions, and the statistics are all-reduced as without workers."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import torch
from cluster_args import ray_args


def _rank(rank: int, world: int, port: int, run_dir: str, overrides: dict[str, object]) -> None:
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    torch.set_num_threads(1)
    from p3o import dist
    from p3o.cluster import RaySource
    from p3o.config import load_config
    from p3o.train.loop import run

    try:
        run(load_config(ray_args(Path(run_dir), **overrides)), remote_source=RaySource)
    finally:
        dist.destroy()


def _two_ranks(run_dir: Path, **overrides: object) -> tuple[list[dict], dict[str, torch.Tensor]]:
    from safetensors.torch import load_file

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.multiprocessing.start_processes(
        _rank, args=(2, port, str(run_dir), overrides), nprocs=2, join=True, start_method="spawn"
    )
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return rows, load_file(str(run_dir / "final" / "model.safetensors"))


def _training(rows: list[dict]) -> list[dict]:
    skip = ("sync_bytes", "worker_restarts", "dropped_batches", "tokens_per_s")
    return [{k: v for k, v in r.items() if not k.startswith("time_") and k not in skip} for r in rows]


def test_two_trainer_ranks_fed_by_one_worker_equal_two_ranks_in_process(ray_cluster, tmp_path):
    base = {"loop.mode": "sync", "steps": 3}
    rows0, p0 = _two_ranks(tmp_path / "inproc", **{**base, "rollout.workers": 0})
    address = ray_cluster.get_runtime_context().gcs_address  # rank 0 joins the suite's 2-node cluster
    rows1, p1 = _two_ranks(tmp_path / "workers", **{**base, "rollout.workers": 1, "ray.address": address})
    assert [r["step"] for r in rows1] == [1, 2, 3]
    assert any(r["loss"] != 0 for r in rows0)
    assert _training(rows0) == _training(rows1)
    assert p0.keys() == p1.keys() and all(torch.equal(p0[k], p1[k]) for k in p0)
    assert rows1[-1]["tokens"] == rows0[-1]["tokens"]  # both ranks' shares counted (summed over ranks)
    workers = json.loads((tmp_path / "workers" / "rollout_workers.json").read_text())["workers"]
    assert len(workers) == 1
