"""Where the trainer's batches come from: now (sync), n steps late (stale), from a thread (async), or again (reuse).

Every source wraps one `produce(index, engine) -> (Rollouts, info)` callable (generate → verify → advantages
for the `index`-th batch of the data stream; seeds and prompts are functions of the index; `info` is a dict of
float statistics measured while producing) and hands the trainer the batch for step `s` via `get(s)`.
After each update the trainer calls `push_weights(state_dict, version)`. The four sources differ only in WHEN
a batch is produced relative to the weights the engine holds:

* `SyncSource`: batch s is produced at step s from version s (on-policy up to engine mismatch).
* `StaleSource(n)`: the MinPRO paper's FIFO delay — at step s the engine (version s) produces the batch
  that is trained at step s + n; batches for the first n steps are produced up front from version 0.
  n = 0 is exactly `SyncSource`.
* `AsyncSource(max_lag)`: a generator thread with its own engine produces batch b as soon as the trainer
  has pushed version ≥ b − max_lag (the producer waits), so no token is ever more than max_lag versions
  older than the trainer that consumes it; the consumer additionally drops rows that would violate the
  bound (a safety net, counted). max_lag = 0 is exactly `SyncSource`. A crash in the thread is re-raised
  in the trainer within `poll_s` seconds.
* `ReuseSource(epochs)`: one batch is produced every `epochs` steps and trained on at each of them.

    source = make_source("async", produce, engine, max_lag=2); batch = source.get(step)
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from dataclasses import fields
from typing import Any, Protocol

import torch

from p3o.types import Rollouts

Batch = tuple[Rollouts, dict[str, float]]
Produce = Callable[[int, Any], Batch]
"""produce(index, engine) -> (Rollouts with rewards and advantages filled in, info floats)."""


def rollouts_to_state(r: Rollouts) -> dict[str, Any]:
    """A plain dict of tensors and lists: what checkpoints store (`p3o.train.checkpoint` reads them back with
    `torch.load(weights_only=True)`, which rebuilds no Python classes)."""
    return {f.name: getattr(r, f.name) for f in fields(r)}


def rollouts_from_state(d: dict[str, Any]) -> Rollouts:
    """Inverse of `rollouts_to_state`."""
    return Rollouts(**d)


def _batch_state(item: tuple[int, Batch]) -> tuple[int, dict[str, Any], dict[str, float]]:
    idx, (r, info) = item
    return idx, rollouts_to_state(r), dict(info)


def _batch_from_state(item: Any) -> tuple[int, Batch]:
    idx, r, info = item
    return int(idx), (rollouts_from_state(r), dict(info))


def token_lag(batch: Rollouts, version: int) -> torch.Tensor:
    """(K,) long: trainer version − sampling version of every valid token (K = valid tokens)."""
    return version - batch.policy_version[batch.mask]


class BatchSource(Protocol):
    """What the training loop asks of a data source."""

    overlaps_generation: bool
    """True when batches are generated while the trainer updates (async): `get` then only waits, it does not
    generate, and the loop does not book its time as generation time."""
    dropped_rows: int
    """Rows dropped so far for violating the lag bound (0 for every source but async)."""

    def get(self, step: int) -> Batch: ...

    def push_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None: ...

    def state(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


class SyncSource:
    """Produce batch s at step s with the engine at version s."""

    overlaps_generation = False
    dropped_rows = 0

    def __init__(self, produce: Produce, engine: Any) -> None:
        self.produce, self.engine = produce, engine

    def get(self, step: int) -> Batch:
        return self.produce(step, self.engine)

    def push_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        self.engine.load_weights(state_dict, version)

    def state(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        pass


class StaleSource(SyncSource):
    """FIFO delay of n steps: the batch produced at step k (from version k) is trained on at step k + n.

    The FIFO holds the batches for steps s .. s+n−1 between steps; a fresh start fills it from version 0.
    """

    def __init__(self, produce: Produce, engine: Any, n: int, state: dict[str, Any] | None = None) -> None:
        super().__init__(produce, engine)
        if n < 0:
            raise ValueError(f"staleness must be >= 0, got {n}")
        self.n = n
        self.fifo: collections.deque[tuple[int, Batch]] = collections.deque()
        for item in (state or {}).get("fifo", []):
            self.fifo.append(_batch_from_state(item))

    def get(self, step: int) -> Batch:
        if not self.fifo:  # fresh start (or a checkpoint without a buffer): fill from the current version
            for j in range(step, step + self.n):
                self.fifo.append((j, self.produce(j, self.engine)))
        self.fifo.append((step + self.n, self.produce(step + self.n, self.engine)))
        idx, batch = self.fifo.popleft()
        assert idx == step, (idx, step)
        return batch

    def state(self) -> dict[str, Any]:
        return {"fifo": [_batch_state(item) for item in self.fifo]}


class ReuseSource(SyncSource):
    """A new batch every `epochs` steps (index step // epochs), trained on at each of those steps."""

    def __init__(self, produce: Produce, engine: Any, epochs: int, state: dict[str, Any] | None = None) -> None:
        super().__init__(produce, engine)
        if epochs < 1:
            raise ValueError(f"reuse epochs must be >= 1, got {epochs}")
        self.epochs = epochs
        cached = (state or {}).get("cached")
        self.cached: tuple[int, Batch] | None = _batch_from_state(cached) if cached is not None else None

    def get(self, step: int) -> Batch:
        idx = step // self.epochs
        if self.cached is None or self.cached[0] != idx:
            self.cached = (idx, self.produce(idx, self.engine))
        return self.cached[1]

    def state(self) -> dict[str, Any]:
        return {"cached": None if self.cached is None else _batch_state(self.cached)}


class GeneratorCrashed(RuntimeError):
    """The asynchronous generator thread raised; the original exception is the __cause__."""


class AsyncSource:
    """Bounded-lag asynchronous generation: a daemon thread owns `engine` and produces batches ahead.

    Producer rule: the next batch will be trained on at step s = (the step the trainer asks for next) +
    (batches already queued); it is produced only once the trainer has pushed version ≥ s − max_lag, so
    the trainer (at version s when it consumes it, or earlier if rows ahead of it get dropped) is at most
    max_lag versions ahead of every token. The queue therefore never holds more than max_lag + 1 batches.
    Consumer rule: rows holding a token older than max_lag versions are dropped (never happens under the
    producer rule, only with a restored queue; counted in `dropped_rows`); a batch dropped whole frees its
    slot, so the producer can never wait for a version the trainer cannot reach.

    The data index passed to `produce` counts produced batches (it equals the step when nothing is dropped).
    """

    overlaps_generation = True

    def __init__(
        self,
        produce: Produce,
        engine: Any,
        max_lag: int,
        *,
        start_version: int = 0,
        start_step: int = 0,
        state: dict[str, Any] | None = None,
        poll_s: float = 0.05,
    ) -> None:
        if max_lag < 0:
            raise ValueError(f"max_lag must be >= 0, got {max_lag}")
        self.produce, self.engine, self.max_lag, self.poll_s = produce, engine, max_lag, poll_s
        self.cond = threading.Condition()
        self.queue: collections.deque[tuple[int, Batch]] = collections.deque()
        for item in (state or {}).get("queue", []):
            self.queue.append(_batch_from_state(item))
        self.next_index = max([start_step] + [idx + 1 for idx, _ in self.queue])
        self.want = start_step  # the step the trainer will ask for next
        self.latest_version = start_version
        self.pending: tuple[dict[str, torch.Tensor], int] | None = None
        self.error: BaseException | None = None
        self.stop = False
        self.dropped_rows = 0
        self.thread = threading.Thread(target=self._run, name="p3o-generator", daemon=True)
        self.thread.start()

    # -- producer (generator thread) -------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                with self.cond:
                    # wait until the weights are fresh enough for the step that will consume the next batch
                    while not self.stop and self.latest_version < self.want + len(self.queue) - self.max_lag:
                        self.cond.wait(self.poll_s)
                    if self.stop:
                        return
                    idx = self.next_index
                    pending, self.pending = self.pending, None
                if pending is not None:
                    self.engine.load_weights(pending[0], pending[1])
                batch = self.produce(idx, self.engine)
                with self.cond:
                    self.queue.append((idx, batch))
                    self.next_index = idx + 1
                    self.cond.notify_all()
        except BaseException as err:  # surfaced in the trainer by get()
            with self.cond:
                self.error = err
                self.cond.notify_all()

    # -- consumer (trainer) ----------------------------------------------------------------------
    def get(self, step: int) -> Batch:
        with self.cond:
            self.want = step
            self.cond.notify_all()
            while True:
                if self.error is not None:
                    raise GeneratorCrashed(f"rollout generator thread crashed: {self.error!r}") from self.error
                while self.queue:
                    _, (batch, info) = self.queue.popleft()
                    self.cond.notify_all()
                    keep = self._fresh_rows(batch, step)
                    if len(keep) < len(batch):
                        self.dropped_rows += len(batch) - len(keep)
                        if not keep:
                            continue
                        batch = batch.select(keep)
                    self.want = step + 1
                    return batch, info
                if not self.thread.is_alive() and self.error is None:
                    raise GeneratorCrashed("rollout generator thread stopped without producing a batch")
                self.cond.wait(self.poll_s)

    def _fresh_rows(self, batch: Rollouts, step: int) -> list[int]:
        """Rows whose every valid token is at most max_lag versions behind the trainer (version = step)."""
        version = batch.policy_version.masked_fill(~batch.mask, step)
        ok = (step - version <= self.max_lag).all(dim=1)
        return ok.nonzero().flatten().tolist()

    def push_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        # clone: the trainer keeps changing its parameters in place while the thread may not have loaded yet
        snapshot = {k: v.detach().clone() for k, v in state_dict.items()}
        with self.cond:
            self.pending = (snapshot, version)
            self.latest_version = version
            self.cond.notify_all()

    def state(self) -> dict[str, Any]:
        with self.cond:
            return {"queue": [_batch_state(item) for item in self.queue]}

    def close(self, timeout: float = 30.0) -> None:
        with self.cond:
            self.stop = True
            self.cond.notify_all()
        self.thread.join(timeout)


def make_source(
    mode: str,
    produce: Produce,
    engine: Any,
    *,
    staleness: int = 0,
    max_lag: int = 0,
    epochs: int = 1,
    start_step: int = 0,
    start_version: int = 0,
    state: dict[str, Any] | None = None,
) -> BatchSource:
    """The source for `loop.mode` ∈ {sync, stale, async, reuse}."""
    if mode == "sync":
        return SyncSource(produce, engine)
    if mode == "stale":
        return StaleSource(produce, engine, staleness, state)
    if mode == "async":
        return AsyncSource(produce, engine, max_lag, start_version=start_version, start_step=start_step, state=state)
    if mode == "reuse":
        return ReuseSource(produce, engine, epochs, state)
    raise ValueError(f"unknown loop mode '{mode}'; known: sync, stale, async, reuse")


__all__ = [
    "AsyncSource",
    "Batch",
    "BatchSource",
    "GeneratorCrashed",
    "ReuseSource",
    "StaleSource",
    "SyncSource",
    "make_source",
    "rollouts_from_state",
    "rollouts_to_state",
    "token_lag",
]
