"""Weight sync per version, object store against collective, side by side in one run: ms and MB/s until every
rollout worker holds the version.

    .venv/bin/p3o convert-smollm2                                   # once: SmolLM2-135M-Instruct, fp32
    .venv/bin/python benchmarks/weight_sync.py                      # SmolLM2-135M, 1 worker, 6 versions per mode
    .venv/bin/python benchmarks/weight_sync.py --model tiny-5m-random --workers 2 --versions 10

The trainer's side is exactly `RaySource`'s (`p3o.cluster.weights`: `ObjectStoreChannel.send` /
`CollectiveChannel.send`, the state dict a run would push: tied tensors once). The workers are light actors
holding no model (a rollout worker's model load is the same in both modes and not part of a sync): in object-store
mode each fetches the version (`ray.get` of the reference the request would carry, as `RolloutWorker.produce`
does), in collective mode each receives it over the gloo group (`HeldVersions.receive`, what
`RolloutWorker.receive_weights` runs). Per version:

    ms    = wall time from the trainer's send to every worker holding the tensors (median over --versions)
    MB/s  = sync_bytes / that time (decimal MB)

The engine's own load (`load_weights`) follows in both modes alike and is left out. Every process uses one torch
thread; one local Ray instance (`--ray-cpus`) serves both modes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from typing import Any

import torch


class _Holder:
    """A rollout worker's weight side without a model: fetch from the object store, or join and receive."""

    def __init__(self) -> None:
        from p3o.cluster.weights import HeldVersions

        torch.set_num_threads(1)
        self.held = HeldVersions()

    def join_weight_group(self, host: str, port: int, generation: int, rank: int, size: int, backend: str) -> None:
        self.held.join(host, port, generation, rank, size, backend)

    def receive_weights(self, version: int, specs: list[Any], keep: list[int], bucket_bytes: int, gen: int) -> bool:
        return self.held.receive(version, specs, keep, bucket_bytes, gen)

    def fetch(self, box: list[Any]) -> int:
        import ray

        weights = ray.get(box[0])
        return sum(v.numel() for v in weights.values())


def _state(model: str) -> dict[str, torch.Tensor]:
    from p3o.models import load_policy

    policy, _ = load_policy(model)
    return {k: v.detach().float() for k, v in policy.state_dict().items()}


def _bench(mode: str, ray: Any, actors: list[Any], state: dict[str, torch.Tensor], versions: int) -> dict[str, float]:
    from p3o.cluster.weights import make_channel

    def dead(w: int, why: str) -> None:
        raise RuntimeError(f"worker {w} died during the benchmark ({why})")

    channel = make_channel(mode, ray, actors, on_dead=dead)
    times = []
    nbytes = 0
    try:
        for v in range(versions + 1):  # version 0 warms up (first allocation, first connection)
            t0 = time.perf_counter()
            nbytes = channel.send(state, v)
            if mode == "object_store":
                ray.get([a.fetch.remote(channel.box(v)) for a in actors])
            if v > 0:
                times.append(time.perf_counter() - t0)
            channel.keep({v})
    finally:
        channel.close()
    ms = statistics.median(times) * 1e3
    return {
        "mode": mode,
        "ms": ms,
        "ms_min": min(times) * 1e3,
        "ms_max": max(times) * 1e3,
        "mb": nbytes / 1e6,
        "mb_per_s": nbytes / 1e6 / (ms / 1e3),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2", help="p3o model name (default smollm2: run p3o convert-smollm2)")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--versions", type=int, default=6)
    ap.add_argument("--ray-cpus", type=int, default=3)
    ap.add_argument("--json", default=None, help="also write the rows to this file")
    args = ap.parse_args(argv)

    import ray

    torch.set_num_threads(1)
    state = _state(args.model)
    ray.init(
        address="local",
        num_cpus=args.ray_cpus,
        object_store_memory=max(4 * sum(v.numel() * 4 for v in state.values()), 200 * 2**20),
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}},
    )
    try:
        remote = ray.remote(_Holder).options(num_cpus=1, max_concurrency=4)
        rows = []
        for mode in ("object_store", "collective"):
            actors = [remote.remote() for _ in range(args.workers)]
            ray.get([a.__ray_ready__.remote() for a in actors])
            rows.append(_bench(mode, ray, actors, state, args.versions))
            for a in actors:
                ray.kill(a)
    finally:
        ray.shutdown()
    obj, coll = rows
    print(f"model {args.model}, {args.workers} worker(s), {args.versions} versions per mode, {rows[0]['mb']:.1f} MB")
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}"
    )
    print("| weight sync | ms per version (median, min-max) | MB/s |")
    print("|---|---|---|")
    for r in rows:
        print(f"| {r['mode']} | {r['ms']:.0f} ({r['ms_min']:.0f}-{r['ms_max']:.0f}) | {r['mb_per_s']:.0f} |")
    print(f"collective / object store: {obj['ms'] / coll['ms']:.2f}x faster")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows, "loadavg": os.getloadavg()[0]}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
