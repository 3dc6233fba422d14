"""A rollout worker: one engine and the task's verifier in a process of its own (a Ray actor).

The worker is built from the config alone (`p3o.train.wiring.build_rollout_side`): it loads `model.name` for the
architecture and tokenizer, then takes every weight version from the trainer (`p3o.cluster.weights`). Ray is not
imported here at module level, so the class is also usable (and tested) in-process:

    worker = RolloutWorker(to_dict(cfg), worker_id=0, threads=1)
    state, info, pid = worker.produce(index=5, version=3, weights=[ref_or_dict])   # batch 5 from version 3

`weights` is a one-element list holding an object-store reference (or, in-process, the dict itself): wrapped so that
Ray hands the reference over unresolved and the worker fetches the tensors only when it needs that version. With
``rollout.weight_sync collective`` it is empty: the version arrived over the weight group (`join_weight_group`,
`receive_weights`) and the worker holds it.

Threads: the worker runs torch (and vLLM's CPU kernels) with the trainer's thread count, and its process starts with
``OMP_NUM_THREADS`` at that count (`RaySource` sets it in the actor's runtime environment; Ray would force 1): vLLM's
CPU attention sizes its work plan by ``torch.get_num_threads()`` and runs it with the OpenMP threads of the calling
thread, and a Ray actor's calls run in threads of their own, which take their OpenMP count from that variable.
"""

from __future__ import annotations

import os
import socket
import threading
from typing import Any

import torch
from torch import Tensor

from p3o.cluster.weights import HeldVersions, TensorSpec
from p3o.config import from_dict
from p3o.train.sources import Producer, PromptStream, rollouts_to_state


def _fetch(box: list[Any]) -> dict[str, Tensor]:
    """The state dict in `box[0]`: an object-store reference (fetched) or the dict itself."""
    item = box[0]
    if isinstance(item, dict):
        return item
    import ray  # optional: ray (extra ray); only an object-store reference needs it

    return ray.get(item)


class RolloutWorker:
    """Generate → verify → advantages for batch indices it is handed, at the policy version it is told.

    Args:
        cfg_dict: `p3o.config.to_dict(cfg)` of the run (rebuilt here with `from_dict`).
        worker_id: its index among the run's workers (in `rollout_workers.json`).
        threads: torch intra-op threads (the trainer's count by default, so kernels match the in-process engine).
        world: the trainer's data-parallel ranks; every batch index is produced once per rank (`produce_parts`),
            each share exactly as that rank's in-process engine would (its prompts, its seeds).
    """

    def __init__(self, cfg_dict: dict[str, Any], worker_id: int, threads: int = 1, world: int = 1) -> None:
        # heavy: transformers start-up (p3o.models), kept out of `p3o train --help`, which imports p3o.cluster
        from p3o.models import load_policy
        from p3o.train.evaluation import Evaluator
        from p3o.train.wiring import build_rollout_side, resolve_device

        torch.set_num_threads(max(1, int(threads)))
        cfg = from_dict(cfg_dict)
        self.cfg, self.worker_id = cfg, worker_id
        # a built-in base name loads the shipped base (p3o/models/shipped/) inside load_policy itself
        model, tokenizer = load_policy(cfg.model.name, cache_dir=cfg.model.cache_dir)
        self.model = model.to(device=resolve_device(cfg.model.device), dtype=getattr(torch, cfg.model.dtype)).eval()
        side = build_rollout_side(cfg, lambda: tokenizer)
        self.engine = side.make_engine(self.model)
        self.engine.version = -1  # holds no trainer version yet: the first request loads one
        self._producers = [
            Producer(
                cfg.rollout,
                cfg.loop,
                cfg.advantage,
                cfg.seed,
                side,
                PromptStream(len(side.prompts), cfg.rollout.prompts_per_step, cfg.seed, r, world),
                rank=r,
            )
            for r in range(world)
        ]
        self._evaluate = Evaluator(side, cfg.seed)
        self._latest: tuple[int, list[Any]] | None = None  # in-flight: the newest version published
        self._latest_lock = threading.Lock()
        self.held = HeldVersions()  # rollout.weight_sync collective: the versions received over the weight group
        if cfg.rollout.inflight_updates:
            self.engine.on_decode_step = self._take_newer

    def _weights(self, version: int, box: list[Any]) -> dict[str, Tensor]:
        """Version `version`'s tensors: from the object store (`box` = [ref]) or as received over the weight group."""
        return _fetch(box) if box else self.held.get(version)

    def join_weight_group(self, host: str, port: int, generation: int, rank: int, size: int, backend: str) -> None:
        """`rollout.weight_sync collective`: join the trainer's weight group (generation `generation`) as `rank`."""
        self.held.join(host, port, generation, rank, size, backend)

    def receive_weights(
        self, version: int, specs: list[TensorSpec], keep: list[int], bucket_bytes: int, generation: int
    ) -> bool:
        """`rollout.weight_sync collective`: receive `version` over generation `generation` of the weight group (the
        trainer broadcasts it); keep it and the versions in `keep`, drop the others. False when this process is not in
        that generation (`HeldVersions.receive`)."""
        return self.held.receive(version, specs, keep, bucket_bytes, generation)

    def info(self) -> dict[str, Any]:
        """{"worker", "pid", "node", "node_ip", "host", "engine", "device"}: where this worker runs (`node`: the Ray
        node id)."""
        node = node_ip = ""
        try:
            import ray  # optional: ray (extra ray); in-process use has none

            if ray.is_initialized():
                node = ray.get_runtime_context().get_node_id()
                node_ip = str(ray.util.get_node_ip_address())
        except ImportError:  # in-process use
            pass
        return {
            "worker": self.worker_id,
            "pid": os.getpid(),
            "node": node,
            "node_ip": node_ip,
            "host": socket.gethostname(),
            "engine": self.cfg.rollout.engine,
            "device": str(getattr(self.engine, "device", "")),
        }

    def produce(
        self, index: int, version: int, weights: list[Any]
    ) -> tuple[dict[str, Any] | None, dict[str, float], int]:
        """Batch `index` of the data stream from policy `version` (loaded from `weights` unless already held).

        Returns (`p3o.train.sources.rollouts_to_state` of the scored batch, its info floats, this process's pid: a
        request that reached a restarted worker without failing still tells the trainer about the restart). The
        state is None when the version came over the weight group and this (restarted) process never received it.
        """
        parts, pid = self.produce_parts(index, version, weights)
        return (None, {}, pid) if parts is None else (*parts[0], pid)

    def produce_parts(
        self, index: int, version: int, weights: list[Any]
    ) -> tuple[list[tuple[dict[str, Any], dict[str, float]]] | None, int]:
        """Batch `index` for every trainer rank (one share per rank, in rank order) from policy `version`; None
        when the version came over the weight group and this (restarted) process never received it."""
        if self.engine.version != version:
            if not weights and version not in self.held.versions:  # a restarted process: the group is formed again
                return None, os.getpid()
            self.engine.load_weights(self._weights(version, weights), version)
        parts = []
        for produce in self._producers:
            batch, info = produce(index, self.engine)
            parts.append((rollouts_to_state(batch.to("cpu")), info))
        return parts, os.getpid()

    def publish(self, version: int, weights: list[Any]) -> None:
        """In-flight updates: a newer version exists; the running batch takes it at its next decode step."""
        with self._latest_lock:
            if self._latest is None or version > self._latest[0]:
                self._latest = (version, weights)

    def _take_newer(self, t: int) -> None:
        """`HFEngine.on_decode_step`: between decode steps, load the newest published version if it is newer."""
        with self._latest_lock:
            latest = self._latest
        if latest is not None and latest[0] > self.engine.version:
            self.engine.load_weights(self._weights(*latest), latest[0])

    def evaluate(self, version: int, weights: list[Any]) -> dict[str, float]:
        """Held-out pass@1 of policy `version` (`p3o.train.evaluation.Evaluator`: one engine for the run)."""

        def model_at() -> torch.nn.Module:
            self.model.load_state_dict(self._weights(version, weights), strict=False)
            return self.model

        return self._evaluate(version, lambda: self._weights(version, weights), model_at)


__all__ = ["RolloutWorker"]
