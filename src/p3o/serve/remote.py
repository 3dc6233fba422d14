"""`RemoteEngine`: the endpoint's engine inside a Ray rollout worker, so one endpoint serves through a worker.

    source = RaySource(worker_cfg, run_dir, weights)               # p3o.cluster: the workers and the weight channel
    engine = RemoteEngine.from_source(source, worker=0)            # the batcher's engine, forwarded to worker 0
    server = EndpointServer(engine, tokenizer, model_name="tiny-chat").start()
    server.load_weights(state_dict, version=1)                     # through the run's channel, between worker calls

Every call the batcher makes (`p3o.serve.batcher`: concurrent requests that sample alike, one `generate`) becomes ONE
call of the worker actor (`p3o.cluster.RolloutWorker`, any engine it was built with: the HF engine, vLLM in
.venv-vllm), which samples with the call's settings (temperature, top-p, top-k) under its engine's lock and returns the
`Rollouts` (ids, recorded log-probs, each token's version, kept sets). The worker's own class is not changed: the calls
run in the actor through Ray's ``__ray_call__`` (`_describe`, `_generate`, `_load` below, each given the worker).

Weights: `load_weights` sends a version through the channel the worker source already has (``rollout.weight_sync``:
one object-store put, or the collective weight group) and has the worker load it between two of its calls (the
adapter's ``_lock``, which the batcher holds around a call); with ``inflight`` (``rollout.inflight_updates``) it is
published to the worker instead, which takes it between two decode steps of a running call or before its next
call, and every token keeps the version that sampled it.

A worker that dies (e.g. SIGKILL) is restarted by Ray (the source's ``max_restarts``): the adapter waits for the new
process, gives it the engine's version (the channel forms its weight group again where it has one) and runs the call
again, once (``restarts`` counts it).

Serve sits below train and cluster and imports neither: the worker, the channel and Ray arrive as objects
(`from_source` reads a `p3o.cluster.RaySource`'s ``actors``, ``channel``, ``ray``, ``inflight`` and ``version``).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

import torch
from torch import Tensor

from p3o.errors import ConfigError, P3OError
from p3o.rollout.base import GenerateCall
from p3o.rollout.settings import EngineSettings
from p3o.types import Rollouts

__all__ = ["RemoteEngine"]

#: The sampling fields a call may set (the batcher's `Sampling`, less its seed, which `generate` takes).
CALL_FIELDS = ("temperature", "top_p", "top_k")


class RemoteEngine(GenerateCall):
    """The batcher's engine, forwarded to one Ray rollout worker (module docstring).

    Args:
        actor: a `p3o.cluster.RolloutWorker` actor handle (built by `RaySource`, or by ``ray.remote(RolloutWorker)``).
        ray: the ``ray`` module (the caller's: this floor never imports Ray).
        channel: how a version reaches the worker (`p3o.cluster.weights`: ``send(weights, version)``,
            ``box(version)``, ``keep(versions)``, ``rejoin()``), e.g. ``ObjectStoreChannel(ray, [actor])`` or the
            worker source's own.
        inflight: publish versions for the worker to take between decode steps (``rollout.inflight_updates``).
        timeout_s: the longest wait for one worker call (and for a restarted worker to answer again).

    Attributes:
        settings: the worker engine's `EngineSettings` (the batcher swaps its sampling fields per call).
        version: the newest version loaded (or published) here; each token's own comes back with it.
        calls: worker calls made by `generate` (one per batcher call).
        restarts: times the worker died (e.g. SIGKILL) and Ray restarted it: the new process is given this engine's
            version (the channel forms its weight group again where it has one) and the call runs again, once.
    """

    def __init__(
        self,
        actor: Any,
        *,
        ray: Any,
        channel: Any,
        inflight: bool = False,
        timeout_s: float = 600.0,
    ) -> None:
        self.ray = ray
        self.actor, self.inflight, self.timeout_s = actor, bool(inflight), float(timeout_s)
        self.channel = channel
        info = self._call(_describe)
        self.settings = EngineSettings(**info["settings"])
        self.stop_token_ids: list[int] = list(info["stop_token_ids"])
        self.pad_token_id = int(info["pad_token_id"])
        self.max_model_len = info["max_model_len"]
        self.version = int(info["version"])
        self.engine_name = str(info["engine"])
        self.device = torch.device("cpu")  # where the returned Rollouts are
        self.tokenizer = None
        self.model = None  # the weights live in the worker: the batcher refuses top_logprobs, as for vLLM
        self.calls = 0
        self.restarts = 0
        self._lock = threading.RLock()  # the batcher holds it around a call; `load_weights` takes it between calls

    @classmethod
    def from_source(cls, source: Any, worker: int = 0, **kwargs: Any) -> RemoteEngine:
        """The engine of worker `worker` of a `p3o.cluster.RaySource` (its ``actors``, ``channel``, ``ray``,
        ``inflight`` and ``version``: a worker that holds no version yet loads the newest one the source sent);
        `kwargs` as for the constructor. A worker index out of range is a one-line ConfigError."""
        actors = list(getattr(source, "actors", []))
        if not 0 <= worker < len(actors):
            raise ConfigError(f"rollout.workers: no worker {worker} to serve through ({len(actors)} running)")
        kwargs.setdefault("inflight", bool(getattr(source, "inflight", False)))
        engine = cls(actors[worker], ray=source.ray, channel=source.channel, **kwargs)
        if engine.version < 0:  # a fresh worker holds no version yet: the source's newest, which it sent already
            with engine._lock:
                engine._call(_load, int(source.version), source.channel.box(source.version))
            engine.version = int(source.version)
        return engine

    def _call(self, fn: Any, *args: Any) -> Any:
        """``fn(worker, *args)`` in the actor; its result."""
        return self.ray.get(self.actor.__ray_call__.remote(fn, *args), timeout=self.timeout_s)

    def _call_or_recover(self, fn: Any, *args: Any) -> Any:
        """`_call`; when the worker died under it, wait for Ray's restart, give the new process this engine's
        version, and call once more (a second death is raised)."""
        dead = (self.ray.exceptions.RayActorError, self.ray.exceptions.ActorUnavailableError)
        try:
            return self._call(fn, *args)
        except dead:
            self._recover()
        return self._call(fn, *args)

    def _recover(self) -> None:
        """The worker died: once Ray's restart answers, load `version` into the new process (which holds none)."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                held = int(self._call(_describe)["version"])
                break
            except (self.ray.exceptions.RayActorError, self.ray.exceptions.ActorUnavailableError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        self.restarts += 1
        if held != self.version and self.version >= 0:
            rejoin = getattr(self.channel, "rejoin", None)
            if rejoin is not None and not self.channel.box(self.version):  # collective: resend the kept versions
                rejoin()
            self._call(_load, self.version, self.channel.box(self.version))

    def _generate(
        self, prompt_ids: list[list[int]], n: int, seed: int | None, answers: list[str] | None, limit: int | None
    ) -> Rollouts:
        """`p3o.rollout.RolloutEngine.generate` in ONE worker call, with this engine's sampling fields of the moment
        (the batcher's settings for the call).

        Returns:
            The worker engine's `Rollouts` on the CPU: (N, P) prompts, (N, T) ids / mask / recorded log-probs /
            versions, N = len(prompt_ids) · n.
        """
        prompts = [[int(t) for t in p] for p in prompt_ids]
        sampling = {k: getattr(self.settings, k) for k in CALL_FIELDS}
        ro = self._call_or_recover(_generate, prompts, int(n), seed, answers, limit, sampling, self.inflight)
        self.calls += 1
        return ro

    def load_weights(self, state_dict: dict[str, Tensor], version: int) -> None:
        """Version `version` to the worker through the channel: loaded between two worker calls, or (inflight)
        published for the worker to take at its next decode step or call. Later tokens carry `version`."""
        version = int(version)
        self.channel.send(state_dict, version)
        box = self.channel.box(version)
        if self.inflight:
            self.ray.get(self.actor.publish.remote(version, box), timeout=self.timeout_s)
        else:
            with self._lock:
                self._call_or_recover(_load, version, box)
        self.channel.keep({version})
        self.version = version


# -- run inside the worker actor (`__ray_call__` hands each the `RolloutWorker` first) ------------------------------


def _describe(worker: Any) -> dict[str, Any]:
    """What the endpoint needs of the worker's engine: its settings, stop and pad ids, context length, version."""
    eng = worker.engine
    vllm_cfg = getattr(getattr(getattr(eng, "llm", None), "llm_engine", None), "model_config", None)
    length = getattr(vllm_cfg, "max_model_len", None) or getattr(worker.model.config, "max_position_embeddings", None)
    return {
        "settings": dataclasses.asdict(eng.settings),
        "stop_token_ids": [int(i) for i in eng.stop_token_ids],
        "pad_token_id": int(eng.pad_token_id),
        "max_model_len": int(length) if length else None,
        "version": int(eng.version),
        "engine": type(eng).__name__,
    }


def _generate(
    worker: Any,
    prompts: list[list[int]],
    n: int,
    seed: int | None,
    answers: list[str] | None,
    max_new_tokens: int | None,
    sampling: dict[str, Any],
    inflight: bool,
) -> Rollouts:
    """One `generate` of the worker's engine with `sampling` set for the call (under the engine's lock, so neither
    a weight load nor another call interleaves; restored after); inflight: a newer published version first."""
    eng = worker.engine
    with eng._lock:
        if inflight:
            worker._take_newer(-1)  # a version published while no call ran: loaded before this call samples
        if eng.version < 0:
            raise P3OError("serve: the rollout worker holds no policy version yet (load_weights first)")
        saved, record = eng.settings, getattr(eng, "_record_mask", None)
        eng.settings = dataclasses.replace(saved, **sampling)
        if record is not None:
            eng._record_mask = eng.settings.records_sampling_mask
        try:
            ro = eng.generate(prompts, n, seed=seed, answers=answers, max_new_tokens=max_new_tokens)
        finally:
            eng.settings = saved
            if record is not None:
                eng._record_mask = record
    return ro.to("cpu")


def _load(worker: Any, version: int, box: list[Any]) -> None:
    """Load version `version` into the worker's engine (from the object store, or as received over the weight
    group), as `RolloutWorker.produce` does."""
    worker.engine.load_weights(worker._weights(version, box), version)
