"""A rollout worker: one engine and the task's verifier in a process of its own (a Ray actor).

The worker is built from the config alone (`p3o.train.wiring.build_rollout_side`): it loads `model.name` for the
architecture and tokenizer, then takes every weight version from the trainer through the object store. Ray is not
imported here at module level, so the class is also usable (and tested) in-process:

    worker = RolloutWorker(to_dict(cfg), worker_id=0, threads=1)
    state, info, pid = worker.produce(index=5, version=3, weights=[ref_or_dict])   # batch 5 from version 3

`weights` is a one-element list holding an object-store reference (or, in-process, the dict itself): wrapped so that
Ray hands the reference over unresolved and the worker fetches the tensors only when it needs that version.
"""

from __future__ import annotations

import os
import socket
import threading
from typing import Any

import torch
from torch import Tensor


def _fetch(box: list[Any]) -> dict[str, Tensor]:
    """The state dict in `box[0]`: an object-store reference (fetched) or the dict itself."""
    item = box[0]
    if isinstance(item, dict):
        return item
    import ray

    return ray.get(item)


class RolloutWorker:
    """Generate → verify → advantages for batch indices it is handed, at the policy version it is told.

    Args:
        cfg_dict: `p3o.config.to_dict(cfg)` of the run (rebuilt here with `from_dict`).
        worker_id: its index among the run's workers (in `rollout_workers.json`).
        threads: torch intra-op threads (the trainer's count by default, so kernels match the in-process engine).
    """

    def __init__(self, cfg_dict: dict[str, Any], worker_id: int, threads: int = 1) -> None:
        from p3o.config import from_dict
        from p3o.models import load_policy
        from p3o.train.evaluation import Evaluator
        from p3o.train.sft import resolve_model_name
        from p3o.train.stream import PromptStream, make_producer
        from p3o.train.wiring import build_rollout_side, resolve_device

        torch.set_num_threads(max(1, int(threads)))
        cfg = from_dict(cfg_dict)
        self.cfg, self.worker_id = cfg, worker_id
        name = resolve_model_name(cfg.model.name, cfg.model.cache_dir)
        model, tokenizer = load_policy(name, cache_dir=cfg.model.cache_dir)
        self.model = model.to(device=resolve_device(cfg.model.device), dtype=getattr(torch, cfg.model.dtype)).eval()
        side = build_rollout_side(cfg, lambda: tokenizer)
        self.engine = side.make_engine(self.model)
        self.engine.version = -1  # holds no trainer version yet: the first request loads one
        stream = PromptStream(len(side.prompts), cfg.rollout.prompts_per_step, cfg.seed, 0, 1)
        self._produce = make_producer(cfg.rollout, cfg.loop, cfg.advantage, cfg.seed, side, stream)
        self._evaluate = Evaluator(side, cfg.seed)
        self._latest: tuple[int, list[Any]] | None = None  # in-flight: the newest version published
        self._latest_lock = threading.Lock()
        if cfg.rollout.inflight_updates:
            self.engine.on_decode_step = self._take_newer

    def info(self) -> dict[str, Any]:
        """{"worker", "pid", "node", "host", "engine", "device"}: where this worker runs."""
        node = ""
        try:
            import ray

            if ray.is_initialized():
                node = ray.get_runtime_context().get_node_id()
        except ImportError:  # in-process use
            pass
        return {
            "worker": self.worker_id,
            "pid": os.getpid(),
            "node": node,
            "host": socket.gethostname(),
            "engine": self.cfg.rollout.engine,
            "device": str(getattr(self.engine, "device", "")),
        }

    def produce(self, index: int, version: int, weights: list[Any]) -> tuple[dict[str, Any], dict[str, float], int]:
        """Batch `index` of the data stream from policy `version` (loaded from `weights` unless already held).

        Returns (`p3o.train.sources.rollouts_to_state` of the scored batch, its info floats, this process's pid: a
        request that reached a restarted worker without failing still tells the trainer about the restart).
        """
        from p3o.train.sources import rollouts_to_state

        if self.engine.version != version:
            self.engine.load_weights(_fetch(weights), version)
        batch, info = self._produce(index, self.engine)
        return rollouts_to_state(batch.to("cpu")), info, os.getpid()

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
            self.engine.load_weights(_fetch(latest[1]), latest[0])

    def evaluate(self, version: int, weights: list[Any]) -> dict[str, float]:
        """Held-out pass@1 of policy `version` (`p3o.train.evaluation.Evaluator`: one engine for the run)."""

        def model_at() -> torch.nn.Module:
            self.model.load_state_dict(_fetch(weights), strict=False)
            return self.model

        return self._evaluate(version, lambda: _fetch(weights), model_at)


__all__ = ["RolloutWorker"]
