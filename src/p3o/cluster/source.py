"""`RaySource`: the trainer's `BatchSource` when rollouts come from Ray actors (`rollout.workers` = N > 0).

    source = RaySource(cfg, run_dir, sync_weights(policy), start_step=0)
    batch, info = source.get(step)                 # batch `step` of the data stream, from a worker
    source.push_weights(sync_weights(policy), step + 1)   # ONE object-store put per version

Each of the N actors (`p3o.cluster.worker.RolloutWorker`) hosts an engine built by `p3o.rollout.factory` from the
config alone and the task's verifier; the trainer hands out batch indices (the prompts of batch b are a function of
(seed, b): `p3o.train.sources.PromptStream`) and the policy version each must be generated from:

* `loop.mode sync`: batch s from version s (one worker busy at a time); bit-identical to `rollout.workers 0` when the
  engines compute alike (HF engine, fp32, same torch thread count: the workers take the trainer's).
* `loop.mode async`, `loop.schedule fixed`: batch b from version max(start, b − max_lag) exactly, on whichever worker
  is free: up to max_lag + 1 batches are generated at once, and the numbers equal the in-process async and the stale
  FIFO (n = max_lag).
* `loop.schedule free`: batch b from the newest version at dispatch. `loop.lag_policy wait`: b is dispatched only once
  version ≥ b − max_lag exists, so no token can be too old when it is consumed; `drop`: workers never wait (up to
  max_lag + N batches ahead) and a batch holding a token older than max_lag versions is dropped whole, counted in
  `dropped_batches` / `dropped_rows`, and the schedule moves on.
* `rollout.inflight_updates`: every new version is also published to the busy workers, whose HF engine takes it
  between two decode steps (PipelineRL): one response then holds tokens of several versions, each stamped with its
  own version and recorded log-prob. Timing-dependent by nature.

Batches are consumed in index order. A version reaches the workers through `p3o.cluster.weights`
(`rollout.weight_sync`): put into the object store once, or broadcast over a process group of its own (`sync_bytes`
logged either way), and forgotten once no pending or future request needs it. A worker that dies (e.g. SIGKILL) is
restarted by Ray (`max_restarts`), comes back with fresh state (under the collective sync it joins the group again
and receives the versions still needed before any request reaches it), and each request it had not finished is
re-issued with its version: no batch is lost or duplicated, `worker_restarts` counts it and
`run_dir/rollout_workers.json` (pid, node id and address, engine per worker) is rewritten.

Workers run with the trainer's torch thread count (`OMP_NUM_THREADS` in their runtime environment), in the driver's
interpreter or `ray.worker_python` (e.g. .venv-vllm's, for vLLM workers beside a trainer in another environment),
and on the nodes that declare `ray.worker_resource` when it is set.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from p3o import dist
from p3o.cluster.runtime import connect, gpus_per_worker, import_ray, preflight
from p3o.cluster.weights import make_channel
from p3o.cluster.worker import RolloutWorker
from p3o.config import to_dict
from p3o.errors import P3OError
from p3o.train.sources import Batch, _batch_from_state, _batch_state, rollouts_from_state, rollouts_to_state

MAX_RESTARTS = 8
"""Restarts Ray grants each worker before a death becomes fatal for the run."""


class RaySource:
    """A `p3o.train.sources.BatchSource` over N Ray rollout workers (see the module docstring for the schedules).

    Built on every trainer rank: rank 0 gets the source proper (it joins Ray, owns the workers, publishes the
    versions); any other rank gets a `RankShare`, which receives its share of each batch from rank 0.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if dist.rank() != 0:
            cfg = args[0] if args else kwargs["cfg"]
            return RankShare(overlaps_generation=cfg.loop.mode != "sync")
        return super().__new__(cls)

    def __init__(
        self,
        cfg: Any,
        run_dir: str | Path,
        weights: dict[str, torch.Tensor],
        *,
        start_step: int = 0,
        state: dict[str, Any] | None = None,
        object_store_memory: int | None = None,
    ) -> None:
        ray = import_ray()
        self.ray = ray
        lp, ro = cfg.loop, cfg.rollout
        self.sync = lp.mode == "sync"
        self.overlaps_generation = not self.sync
        self.max_lag = 0 if self.sync else lp.max_lag
        self.schedule = "fixed" if self.sync else lp.schedule
        self.lag_policy = "wait" if self.sync else lp.lag_policy
        self.inflight = bool(ro.inflight_updates)
        self.run_dir = Path(run_dir)
        self.dropped_rows = 0
        self.dropped_batches = 0
        self.restarts = 0
        self.sync_bytes = 0
        self.weight_sync = ro.weight_sync
        self.world = dist.world_size()  # trainer ranks: every batch index is produced once per rank
        st = state or {}
        self.floor = start_step
        self.done: dict[int, list[Batch]] = dict(_parts_from_state(item) for item in st.get("queue", []))
        self.consume_index = int(st.get("consume_index", start_step))
        self.next_index = int(st.get("next_index", max([start_step, *[i + 1 for i in self.done]])))
        self.skipped = int(st.get("skipped", 0))
        self.version = start_step
        self.running: dict[Any, tuple[int, int, int]] = {}  # task ref -> (worker, batch index, version)
        self.busy: set[int] = set()

        self.started = connect(cfg.ray, object_store_memory=object_store_memory)
        try:
            n = ro.workers
            threads = torch.get_num_threads()
            runtime_env: dict[str, Any] = {"env_vars": {"OMP_NUM_THREADS": str(threads)}}
            if cfg.ray.worker_python:
                runtime_env["py_executable"] = str(cfg.ray.worker_python)
            remote = ray.remote(RolloutWorker).options(
                num_cpus=1,
                num_gpus=gpus_per_worker(n, ro.colocate),
                resources={cfg.ray.worker_resource: 1} if cfg.ray.worker_resource else None,
                max_restarts=MAX_RESTARTS,
                max_task_retries=0,  # this source re-issues a dead worker's requests itself
                max_concurrency=4,  # `publish` / `evaluate` / the weight group's calls while `produce` runs
                runtime_env=runtime_env,
            )
            cfg_dict = to_dict(cfg)
            self.actors = [remote.remote(cfg_dict, i, threads, self.world) for i in range(n)]
            self.infos = ray.get([a.info.remote() for a in self.actors])
            for info in self.infos:
                info["restarts"] = 0
            self._write_workers()
            self.channel = make_channel(
                ro.weight_sync, ray, self.actors, on_dead=self._mark_restarted, colocate=ro.colocate
            )
            self._put(weights, start_step)
        except BaseException:
            self.close()
            raise

    @staticmethod
    def preflight(cfg: Any) -> None:
        """`p3o.train.sources.RemoteSource.preflight` (`p3o.cluster.runtime.preflight`): Ray installed, `ray.address`
        reachable, the workers' interpreter, the weight-sync backend and the cluster's resources, before any model
        loads."""
        preflight(cfg)

    # -- versions and weights ------------------------------------------------------------------------
    def version_for(self, index: int) -> int:
        """The version batch `index` is generated from: fixed, max(floor, index − skipped − max_lag); free, the
        newest."""
        if self.schedule == "fixed":
            return max(self.floor, index - self.skipped - self.max_lag)
        return self.version

    def _put(self, weights: dict[str, torch.Tensor], version: int) -> None:
        self.version = version
        self.sync_bytes = self.channel.send(weights, version)  # tied weights are counted once

    def push_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        self._put(state_dict, version)
        if self.inflight:  # the busy workers take it between two decode steps
            for w in {w for w, _, _ in self.running.values()}:
                self.actors[w].publish.remote(version, self.channel.box(version))
        self._free_refs()
        self._pump()

    def _free_refs(self) -> None:
        keep = {self.version} | {v for _, _, v in self.running.values()}
        if self.schedule == "fixed":
            keep |= set(range(self.version_for(self.next_index), self.version + 1))
        self.channel.keep(keep)

    # -- dispatch and collection ---------------------------------------------------------------------
    def _dispatchable(self, index: int) -> bool:
        if self.schedule == "fixed":
            return self.version_for(index) <= self.version
        if self.lag_policy == "wait":  # generated from version ≥ index − max_lag: never too old when consumed
            return index - self.skipped - self.max_lag <= self.version
        return index < self.consume_index + self.max_lag + len(self.actors)  # drop: keep every worker busy

    def _pump(self) -> None:
        for w in range(len(self.actors)):
            if w in self.busy or not self._dispatchable(self.next_index):
                continue
            self._dispatch(w, self.next_index, self.version_for(self.next_index))
            self.next_index += 1

    def _dispatch(self, w: int, index: int, version: int) -> None:
        ref = self.actors[w].produce_parts.remote(index, version, self.channel.box(version))
        self.running[ref] = (w, index, version)
        self.busy.add(w)

    def _collect(self, timeout: float) -> None:
        ray = self.ray
        ready, _ = ray.wait(list(self.running), num_returns=1, timeout=timeout)
        for ref in ready:
            w, index, version = self.running.pop(ref)
            try:
                parts, pid = ray.get(ref)
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as err:
                self._restarted(w, type(err).__name__)
                self._dispatch(w, index, version)  # the same request again: same batch, same version
                continue
            if pid != self.infos[w]["pid"]:  # restarted while idle: the request reached the new process
                self._restarted(w, "restarted while idle")
            elif parts is None:
                raise P3OError(f"RaySource: worker {w} holds no version {version} though it never restarted")
            if parts is None:  # it lacked the version (collective sync): the group was formed again, re-issue
                self._dispatch(w, index, version)
                continue
            self.busy.discard(w)
            self.done[index] = [(rollouts_from_state(r), info) for r, info in parts]

    def _restarted(self, w: int, why: str) -> None:
        """Worker `w` died: wait for Ray's restart, record its new pid, and (collective sync) form the weight group
        again, so the new process holds the versions still needed before it generates."""
        self._mark_restarted(w, why)
        self.channel.rejoin()

    def _mark_restarted(self, w: int, why: str) -> None:
        """Worker `w` died: wait for Ray's restart, record its new pid in rollout_workers.json."""
        old = self.infos[w]["pid"]
        info = self._wait_alive(w)
        if info["pid"] == old:  # this death was recorded already (another call of the dead process failed first)
            return
        self.restarts += 1
        info["restarts"] = self.infos[w]["restarts"] + 1
        self.infos[w] = info
        self._write_workers()
        print(
            f"p3o train: rollout worker {w} died (pid {old}: {why}); restarted by Ray as pid "
            f"{info['pid']}, its unfinished request re-issued",
            file=sys.stderr,
        )

    def _wait_alive(self, w: int, timeout_s: float = 300.0) -> dict[str, Any]:
        """Worker `w`'s `info()` once Ray has restarted it (calls fail with ActorUnavailableError meanwhile)."""
        ray = self.ray
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return ray.get(self.actors[w].info.remote(), timeout=timeout_s)
            except ray.exceptions.ActorUnavailableError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def _write_workers(self) -> None:
        path = self.run_dir / "rollout_workers.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps({"workers": self.infos}, indent=1) + "\n")
        tmp.replace(path)

    # -- the BatchSource interface -------------------------------------------------------------------
    def get(self, step: int) -> Batch:
        while True:
            self._pump()
            if self.consume_index in self.done:
                parts = self.done.pop(self.consume_index)
                self.consume_index += 1
                self._pump()
                lags = [step - b.policy_version[b.mask] for b, _ in parts]
                if any(lag.numel() and int(lag.max()) > self.max_lag for lag in lags):  # too old: never trained on
                    self.dropped_batches += 1
                    self.dropped_rows += len(parts[0][0])
                    self.skipped += 1
                    continue
                if self.world > 1:  # every other rank takes its share (RankShare.get), with this step's counters
                    shares = [(rollouts_to_state(b), info) for b, info in parts]
                    dist.broadcast_object((shares, self.metrics(), self.dropped_rows))
                return parts[0]
            if not self.running:
                raise P3OError(f"RaySource: nothing is generating batch {self.consume_index} (version {self.version})")
            self._collect(timeout=1.0)

    def metrics(self) -> dict[str, float]:
        """Per-step extras: bytes of the last weight put, worker restarts and batches dropped so far."""
        return {
            "sync_bytes": float(self.sync_bytes),
            "worker_restarts": float(self.restarts),
            "dropped_batches": float(self.dropped_batches),
        }

    def evaluate(self, version: int) -> dict[str, float]:
        """Held-out pass@1 of `version` (the newest pushed) on worker 0, with that worker's evaluation engine."""
        ray = self.ray
        for _ in range(MAX_RESTARTS + 1):
            try:
                return ray.get(self.actors[0].evaluate.remote(version, self.channel.box(version)))
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as err:
                self._restarted(0, type(err).__name__)
        raise P3OError("RaySource.evaluate: worker 0 keeps dying")

    def state(self) -> dict[str, Any]:
        """Finished, unconsumed batches (and the cursors). Every running request is finished first and, under the
        fixed schedule, every batch generated from a version older than the newest: a resumed run holds only the
        newest weights."""
        while True:
            if self.schedule == "fixed":
                self._pump()
            if not self.running and (self.schedule != "fixed" or self.version_for(self.next_index) >= self.version):
                break
            self._collect(timeout=1.0)
        return {
            "queue": [_parts_state(i, self.done[i]) for i in sorted(self.done)],
            "consume_index": self.consume_index,
            "next_index": self.next_index,
            "skipped": self.skipped,
        }

    def close(self) -> None:
        """Kill the workers; shut Ray down if this source started it."""
        ray = self.ray
        if getattr(self, "channel", None) is not None:
            self.channel.close()
        for actor in getattr(self, "actors", []):
            with contextlib.suppress(Exception):  # an actor already gone is fine
                ray.kill(actor, no_restart=True)
        self.actors = []
        self.running.clear()
        if self.started and ray.is_initialized():
            ray.shutdown()
        self.started = False


def _parts_state(index: int, parts: list[Batch]) -> Any:
    """A queued batch index in a checkpoint: one trainer rank's share as `_batch_state` wrote it; several ranks' as
    (index, [state per rank], [info per rank])."""
    if len(parts) == 1:
        return _batch_state((index, parts[0]))
    return index, [rollouts_to_state(b) for b, _ in parts], [dict(info) for _, info in parts]


def _parts_from_state(item: Any) -> tuple[int, list[Batch]]:
    idx, r, info = item
    if isinstance(r, list):
        return int(idx), [(rollouts_from_state(x), dict(i)) for x, i in zip(r, info)]
    i, batch = _batch_from_state(item)
    return i, [batch]


class RankShare:
    """The batch source of trainer rank r > 0 when rollouts come from Ray workers: rank 0's `RaySource` produces every
    rank's share of each batch and broadcasts them over the data-parallel group in `get`; this rank keeps its own.
    Versions are published by rank 0 only (every rank holds the same weights after the all-reduced update), and the
    held-out evaluation runs on rank 0."""

    def __init__(self, *, overlaps_generation: bool) -> None:
        self.overlaps_generation = overlaps_generation
        self.dropped_rows = 0
        self._metrics: dict[str, float] = {}

    def get(self, step: int) -> Batch:
        shares, self._metrics, self.dropped_rows = dist.broadcast_object(None)
        state, info = shares[dist.rank()]
        return rollouts_from_state(state), info

    def push_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """Rank 0 publishes the versions."""

    def metrics(self) -> dict[str, float]:
        return dict(self._metrics)

    def evaluate(self, version: int) -> dict[str, float]:
        raise P3OError("RankShare.evaluate: the held-out evaluation runs on trainer rank 0")

    def state(self) -> dict[str, Any]:
        return {}  # rank 0's checkpoint holds every rank's queued shares

    def close(self) -> None:
        """Nothing to stop: rank 0 owns the workers."""


__all__ = ["MAX_RESTARTS", "RankShare", "RaySource"]
