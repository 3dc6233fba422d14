"""One thread in front of the engine: the requests that arrive together and sample alike go in one `generate` call.

A request becomes a `Job` (its prompt ids, n, its token budget and its `Sampling`). The batcher thread takes the
first waiting job, waits up to ``window_s`` for more while other requests are on their way (read, rendered; none: it
runs at once), and runs every job with the same sampling settings (temperature,
top-p, top-k; a seeded job runs alone, so its draws depend on its seed only) as one engine call: each prompt is
repeated n times, the call's token limit is the largest budget, and each row is cut back to its own job's budget.
The engine's sampling settings are set for the call under its lock (`SamplingEngine._lock`, which `load_weights`
takes too), so weights load between engine calls and every token carries the version that sampled it.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import dataclasses
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from p3o.errors import ConfigError, P3OError
from p3o.rollout.hf import process_logits
from p3o.serve.tools import BadRequest
from p3o.types import Rollouts

__all__ = ["Batcher", "Draw", "Job", "Sampling"]


@dataclass(frozen=True)
class Sampling:
    """A request's sampling settings: τ ≥ 0, top-p in (0, 1], top-k ≥ 0 (0 = off), an optional seed."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None


@dataclass
class Draw:
    """One sampled row: ids (the engine's stop id kept), a log-prob and a version per id, each id's kept set (None
    when the engine records none), and whether the engine stopped it (a stop id) rather than the budget."""

    ids: list[int]
    logprobs: list[float]
    versions: list[int]
    stopped: bool
    kept: list[list[int]] | None = None
    top: list[list[tuple[int, float]]] | None = None


@dataclass
class Job:
    """A request's draws to make: n completions of `prompt_ids`, at most `max_tokens` each."""

    prompt_ids: list[int]
    n: int
    max_tokens: int
    sampling: Sampling
    top: int = 0
    future: cf.Future = field(default_factory=cf.Future)


class Batcher:
    """Runs `Job`s on `engine` from one thread, batching jobs that sample alike (see the module docstring).

    Counters: ``engine_calls``, ``batched_jobs`` (jobs that shared a call with another), ``sampled_tokens``.
    """

    def __init__(self, engine: Any, *, window_s: float = 0.005, max_batch: int = 64) -> None:
        self.engine = engine
        self.window_s = float(window_s)
        self.max_batch = int(max_batch)
        self.counts = {"engine_calls": 0, "batched_jobs": 0, "sampled_tokens": 0}
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._arriving = 0
        self._expect: Callable[[], int] | None = None
        self._max_wait_s = 0.0
        self._arriving_lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="p3o-serve-batcher", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=60)
            self._thread = None

    def submit(self, job: Job) -> cf.Future:
        """Queue `job`; its future gives ``list[Draw]`` (n of them) or raises what the engine raised."""
        self._queue.put(job)
        return job.future

    @contextlib.contextmanager
    def arriving(self) -> Iterator[Callable[[], None]]:
        """Around a request, from its arrival: it is on its way until the callable it yields is called (right after
        its `submit`) or it ends. While any request is on its way, the batcher waits up to ``window_s`` for it
        before running a call; with none, a job runs at once."""
        with self._arriving_lock:
            self._arriving += 1
        left = [False]

        def arrived() -> None:
            with self._arriving_lock:
                if not left[0]:
                    left[0] = True
                    self._arriving -= 1

        try:
            yield arrived
        finally:
            arrived()

    def gather(self, expect: Callable[[], int], max_wait_s: float) -> None:
        """Wait for the requests a caller expects: having a first job, the batcher runs the call as soon as it
        holds ``expect()`` jobs (e.g. the episodes now running, each about to send its next turn) and none is
        queued behind them, or once ``max_wait_s`` has passed, so the turns of concurrent episodes share one engine
        call as the tick runner's do. Without it, the batcher waits only for requests on their way (`arriving`)."""
        self._expect, self._max_wait_s = expect, float(max_wait_s)

    def _collect(self, first: Job) -> list[Job]:
        """The jobs of the next engine call: `first` and those that join it (see `gather` and `arriving`)."""
        jobs, t0 = [first], time.monotonic()
        expect = self._expect
        while len(jobs) < self.max_batch:
            elapsed = time.monotonic() - t0
            if expect is not None:
                if (len(jobs) >= expect() and self._queue.empty()) or elapsed >= self._max_wait_s:
                    break  # every running episode has sent its turn: no reason to wait longer
            elif self._queue.empty() and (self._arriving <= 0 or elapsed >= self.window_s):
                break  # nothing queued and nothing on its way (being read or rendered)
            try:
                nxt = self._queue.get(timeout=0.001)
            except queue.Empty:
                continue
            if nxt is None:
                self._queue.put(None)
                break
            jobs.append(nxt)
        return jobs

    def _loop(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            groups: dict[Any, list[Job]] = {}
            for j in self._collect(first):
                key = (j.sampling.temperature, j.sampling.top_p, j.sampling.top_k)
                groups.setdefault(key if j.sampling.seed is None else id(j), []).append(j)
            for group in groups.values():
                self._run(group)

    def _run(self, group: list[Job]) -> None:
        try:
            draws = self.draw(group)
        except BaseException as err:  # the engine's error goes to every caller of the call, the thread runs on
            for j in group:
                if not j.future.done():
                    j.future.set_exception(err)
            return
        self.counts["engine_calls"] += 1
        if len(group) > 1:
            self.counts["batched_jobs"] += len(group)
        for j, d in zip(group, draws):
            self.counts["sampled_tokens"] += sum(len(x.ids) for x in d)
            j.future.set_result(d)

    def draw(self, group: list[Job]) -> list[list[Draw]]:
        """One engine call for `group` (jobs of one `Sampling`); each job's n draws, cut to its budget."""
        s = group[0].sampling
        prompts = [j.prompt_ids for j in group for _ in range(j.n)]
        t_max = max(j.max_tokens for j in group)
        budgets = [j.max_tokens for j in group for _ in range(j.n)]
        lock = getattr(self.engine, "_lock", None) or contextlib.nullcontext()
        top = max(j.top for j in group)
        if top and getattr(self.engine, "model", None) is None:
            raise BadRequest(f"top_logprobs: {type(self.engine).__name__} gives no alternatives (the HF engine does)")
        with lock:
            with self._settings(s):
                ro = self.engine.generate(prompts, 1, seed=s.seed, max_new_tokens=t_max)
            rows = [_cut(d, b) for d, b in zip(_rows(ro), budgets)]
            if len(rows) != len(prompts):
                raise P3OError(f"engine returned {len(rows)} rows for {len(prompts)} prompts")
            if top:  # under the lock: the alternatives come from the weights that sampled
                for p, d in zip(prompts, rows):
                    d.top = alternatives(self.engine.model, p, d.ids, top, s)
        out, i = [], 0
        for j in group:
            out.append(rows[i : i + j.n])
            i += j.n
        return out

    @contextlib.contextmanager
    def _settings(self, s: Sampling) -> Iterator[None]:
        """The engine's sampling settings set to `s` for one call (the caller holds the engine's lock); an HF
        engine records each token's kept set when `s` truncates (top-p / top-k), as its own settings would."""
        saved = getattr(self.engine, "settings", None)
        record = getattr(self.engine, "_record_mask", None)
        if saved is None:
            if (s.temperature, s.top_p, s.top_k) != (1.0, 1.0, 0):
                raise BadRequest(f"{type(self.engine).__name__} samples with its own settings only")
            yield
            return
        try:
            new = dataclasses.replace(saved, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k)
        except ConfigError as err:
            raise BadRequest(str(err).replace("rollout.", "")) from err
        self.engine.settings = new
        if record is not None:
            self.engine._record_mask = new.records_sampling_mask
        try:
            yield
        finally:
            self.engine.settings = saved
            if record is not None:
                self.engine._record_mask = record


def _cut(d: Draw, budget: int) -> Draw:
    """A draw cut back to its job's token budget (the call's limit was the largest budget)."""
    if len(d.ids) <= budget:
        return d
    return Draw(d.ids[:budget], d.logprobs[:budget], d.versions[:budget], False,
                d.kept[:budget] if d.kept is not None else None)  # fmt: skip


@torch.no_grad()
def alternatives(model: Any, prompt: list[int], ids: list[int], k: int, s: Sampling) -> list[list[tuple[int, float]]]:
    """The k most likely ids and their log-probs at each sampled position, under the distribution sampled from
    (logits / τ, then top-k and top-p; the raw distribution when τ = 0): one forward pass over prompt + ids.

    Returns:
        T lists of k (id, log-prob) pairs, T = len(ids).
    """
    if not ids:
        return []
    seq = torch.tensor([prompt + ids[:-1]], dtype=torch.long, device=next(model.parameters()).device)
    logits = model(input_ids=seq).logits[0, len(prompt) - 1 :].float()  # (T, V)
    if s.temperature > 0:
        logits = process_logits(logits, temperature=s.temperature, top_k=s.top_k, top_p=s.top_p)
    lp = torch.log_softmax(logits, dim=-1)
    vals, idx = lp.topk(min(k, lp.shape[-1]), dim=-1)
    return [list(zip(i.tolist(), v.tolist())) for i, v in zip(idx, vals)]


def _rows(ro: Rollouts) -> list[Draw]:
    """The rows of an engine call as `Draw`s (only the valid ids of each row)."""
    mask = ro.mask.cpu()
    ids, lps, vers = ro.response_ids.cpu(), ro.rollout_logp.cpu(), ro.policy_version.cpu()
    truncated = ro.truncated.cpu()
    kept = _kept_sets(ro)
    out = []
    for i in range(mask.shape[0]):
        valid = mask[i]
        k = int(valid.sum())
        out.append(Draw(ids[i][valid].tolist(), lps[i][valid].tolist(), vers[i][valid].tolist(),
                        not bool(truncated[i]), kept[i][:k] if kept is not None else None))  # fmt: skip
    return out


def _kept_sets(ro: Rollouts) -> list[list[list[int]]] | None:
    """Per row, per response position, the ids of the token's kept set (`Rollouts.sampling_mask`), or None."""
    sm = ro.sampling_mask
    if sm is None:
        return None
    counts = sm.counts.cpu().to(torch.long)
    flat = sm.ids.cpu().tolist()
    out, pos = [], 0
    for row in counts.tolist():
        sets = []
        for c in row:
            sets.append(flat[pos : pos + c])
            pos += c
        out.append(sets)
    return out
