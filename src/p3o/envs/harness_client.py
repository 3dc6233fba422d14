"""The harness's side of the endpoint: episodes run as clients of p3o's server, on an event loop kept across
batches, in the trainer's process or in harness processes of their own.

A harness is ``agent.harness: package.module:function``:

    async def solve(client: openai.AsyncOpenAI, model: str, problem: p3o.tasks.Problem) -> float | dict

(a plain ``def`` gets an ``openai.OpenAI`` and runs in a thread). ``client`` is bound to its episode's base URL on
the endpoint (``/episodes/<id>/v1``) and the run's key; it returns the episode's reward, or a dict with ``reward``
and extra numeric metrics (averaged per step into ``episode/<name>``).

Where the episodes run (``agent.harness_processes``):

* ``0``: `EpisodeLoop`, one asyncio loop on a thread of the trainer's process;
* ``P ≥ 1``: `HarnessProcesses`, P child processes (``python -m p3o.envs.harness_client``, started once per engine),
  each with an `EpisodeLoop` of its own; a batch's episodes are dealt round-robin. The ``openai`` SDK costs
  2-5 ms of CPU per request (its parameter transform, ``httpx``, parsing the reply: docs/benchmarks.md), which in
  process runs under the trainer's interpreter lock, beside the endpoint's routes and the engine's Python; in a
  process of its own it runs on another core, as an external harness does. A harness in a child process shares no
  Python state with the trainer: it is imported there by its spec.

Either way the loop and its ``httpx`` connection pool live as long as the engine, so a batch reuses the previous
batch's connections (no connect, no client setup per batch). n episodes of every problem run concurrently (at most
``concurrency`` at once per loop, each under ``timeout_s``); the caller gets one `HarnessEpisode` per episode, in
order (rows b·n … b·n + n − 1 are problem b's). What an episode trains on is never the harness's text: it is what
the endpoint recorded for that episode's key, popped by the caller (`p3o.envs.harness.HarnessEngine`).

Faults, each counted and never a crash, a hang or a row (`FAULTS`): the harness raised (``error``), ran past its
time limit (``timeout``: the task is cancelled; a plain ``def`` keeps its thread, and whatever it still sends under
its key is dropped), returned something that is no reward (``bad_reward``), never called the model (``no_calls``,
decided by the caller from the endpoint's records), or asked for another model than the one served
(``wrong_model``, seen on the requests of the client it was given). A harness process that dies or stops answering
fails its unfinished episodes (``error``) and is started again for the next batch.

This module imports neither torch nor the endpoint, so a harness process starts in a fraction of a second.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures as cf
import contextlib
import functools
import inspect
import json
import math
import os
import pickle
import queue
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from p3o.envs.tools import _import_module as import_user_module
from p3o.errors import ConfigError
from p3o.tasks.base import Problem

__all__ = [
    "FAULTS",
    "EpisodeLoop",
    "HarnessEpisode",
    "HarnessProcesses",
    "episode_result",
    "fail",
    "is_async",
    "load_harness",
    "new_episodes",
    "run_harness",
]

FAULTS = ("error", "timeout", "bad_reward", "no_calls", "wrong_model")
"""Why an episode failed: the harness raised; it ran past ``agent.episode_timeout_s``; it returned no number (or a
dict without a numeric ``reward``); the endpoint recorded no call under its key; it named another model."""

Harness = Callable[..., Any]
BaseURL = Callable[[str], str] | str
"""An episode's base URL: ``f(episode_id)``, or a template with ``{episode}`` (what a harness process is sent)."""


@dataclass
class HarnessEpisode:
    """One harness episode: its problem and group (problem index), its endpoint key, and how it ended.

    ``reward`` is the harness's return (0 when ``fault`` is set); ``metrics`` its extra numbers; ``calls`` the
    model requests it sent under its key; ``wrong_model`` the requests naming another model; ``seconds`` wall time.
    """

    problem: Problem
    group: int
    episode_id: str
    reward: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)
    fault: str | None = None
    error: str = ""
    calls: int = 0
    wrong_model: int = 0
    seconds: float = 0.0


def load_harness(spec: str) -> Harness:
    """The harness ``spec`` names: ``package.module:function`` (async or plain), or ``verifiers:<module>``, a
    `verifiers` environment run as a harness (`p3o.envs.verifiers_harness.load_verifiers`). A wrong spec: one-line
    ConfigError."""
    if not isinstance(spec, str) or ":" not in spec:
        raise ConfigError(f"agent.harness: {spec!r} is not package.module:function (or verifiers:<module>)")
    module_name, _, attr = spec.partition(":")
    if module_name == "verifiers":
        from p3o.envs.verifiers_harness import load_verifiers  # optional: the verifiers extra

        return load_verifiers(attr)
    try:
        module = import_user_module(module_name)  # with the working directory, as for a tool's module
    except Exception as exc:  # a user module's import error, named in one line
        raise ConfigError(f"agent.harness: cannot import {module_name!r} ({type(exc).__name__}: {exc})") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(f"agent.harness: {module_name!r} has no function {attr!r}")
    return fn


def is_async(harness: Harness) -> bool:
    """Whether the harness is a coroutine function (or an object whose ``__call__`` is one)."""
    call = type(harness).__call__ if not inspect.isfunction(harness) else None
    return inspect.iscoroutinefunction(harness) or (call is not None and inspect.iscoroutinefunction(call))


def _finite_number(value: Any) -> bool:
    """Whether `value` is a finite int or float (not a bool): what a harness may report as a reward or a metric."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def episode_result(value: Any) -> tuple[float, dict[str, float]] | None:
    """(reward, extra metrics) of a harness's return: a finite number, or a dict with a finite numeric ``reward``
    (its other finite numeric values are metrics, anything else ignored); None when it is neither."""
    if isinstance(value, dict):
        reward = value.get("reward")
        extra = {str(k): float(v) for k, v in value.items() if k != "reward" and _finite_number(v)}
    else:
        reward, extra = value, {}
    return (float(reward), extra) if _finite_number(reward) else None


def fail(ep: HarnessEpisode, fault: str, error: str) -> None:
    """Mark a finished episode failed after the fact (e.g. ``no_calls``: the endpoint recorded nothing under its
    key, which the caller learns from the endpoint, not from the harness's client)."""
    ep.fault, ep.error, ep.reward, ep.metrics = fault, error, 0.0, {}


def new_episodes(problems: Sequence[Problem], n: int, run_id: str = "") -> list[HarnessEpisode]:
    """`n` episodes of every problem, problem-major; ids ``<run_id><uuid4 hex>`` (unique, never reused)."""
    return [
        HarnessEpisode(problem=p, group=b, episode_id=f"{run_id}{uuid.uuid4().hex}")
        for b, p in enumerate(problems)
        for _ in range(n)
    ]


def run_harness(
    harness: Harness,
    problems: Sequence[Problem],
    n: int,
    *,
    base_url: BaseURL,
    api_key: str,
    model: str,
    timeout_s: float,
    concurrency: int = 64,
    run_id: str = "",
    on_episode: Callable[[int], None] | None = None,
) -> list[HarnessEpisode]:
    """Run `n` episodes of every problem through the endpoint on a loop of their own (closed after); one
    `HarnessEpisode` each, problem-major.

    Args:
        harness: `load_harness`'s result.
        base_url: ``base_url(episode_id)`` -> the episode's OpenAI base URL (``EndpointServer.episode_url``), or a
            template with ``{episode}``.
        api_key: the run's bearer key (given to each episode's client, never logged).
        model: the served model name; a request naming another is counted (``wrong_model``).
        timeout_s: wall-clock limit of one episode; concurrency: episodes at once.
        run_id: prefix of the episode ids (ids are ``<run_id><uuid4 hex>``: unique, never reused).
        on_episode: called with +1 when an episode starts and −1 when it ends (the endpoint's batcher waits for the
            running episodes' next calls: `p3o.serve.batcher.Batcher.gather`).
    """
    episodes = new_episodes(problems, n, run_id)
    if episodes:
        loop = EpisodeLoop(harness, api_key=api_key, model=model, timeout_s=timeout_s, concurrency=concurrency)
        try:
            loop.run(episodes, base_url, on_episode)
        finally:
            loop.close()
    return episodes


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """The default TLS context, made once per process and shared by every client (each client would otherwise load
    the CA store again: 30-45 ms apiece)."""
    return ssl.create_default_context()


def _url(base_url: BaseURL, episode_id: str) -> str:
    return base_url.format(episode=episode_id) if isinstance(base_url, str) else base_url(episode_id)


class EpisodeLoop:
    """Harness episodes on one asyncio loop (a daemon thread of its own) with the clients a harness is handed: one
    ``httpx`` pool, kept from batch to batch, so a batch's requests reuse open connections. ``active`` is the
    episodes running now (the endpoint's batcher reads it), as `HarnessProcesses`' is.

        loop = EpisodeLoop(harness, api_key=key, model="tiny-chat", timeout_s=60, concurrency=64)
        episodes = loop.run(new_episodes(problems, 4), server.episode_url_template)   # each with its reward or fault
        loop.close()
    """

    def __init__(self, harness: Harness, *, api_key: str, model: str, timeout_s: float, concurrency: int = 64) -> None:
        self.harness, self.api_key, self.model = harness, api_key, model
        self.timeout_s, self.concurrency = float(timeout_s), max(1, int(concurrency))
        self.active = 0
        self._live: dict[str, HarnessEpisode] = {}  # the running batch's episodes by id (the request hook's view)
        self._openai, self._http, self._sync_http = self._clients()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="p3o-harness-loop", daemon=True)
        self._thread.start()
        atexit.register(self.close)  # an engine nobody closed: its clients' sessions closed before the process ends

    def run(
        self, episodes: list[HarnessEpisode], base_url: BaseURL, on_episode: Callable[[int], None] | None = None
    ) -> list[HarnessEpisode]:
        """Run the episodes (at most ``concurrency`` at once) and return them, each with its reward or its fault;
        ``on_episode(±1)`` too as one starts and ends (a harness process tells the trainer)."""
        if episodes:
            asyncio.run_coroutine_threadsafe(self._run(episodes, base_url, on_episode), self._loop).result()
        return episodes

    def close(self) -> None:
        """Close the clients and stop the loop (a plain-def harness thread past its limit is abandoned)."""
        atexit.unregister(self.close)
        if self._loop.is_closed():
            return
        if self._thread.is_alive():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self._close_clients(), self._loop).result(timeout=5.0)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5.0)
        if not self._thread.is_alive():
            self._loop.close()

    async def _close_clients(self) -> None:
        await self._http.aclose()
        self._sync_http.close()

    def _watch(self, request: Any) -> None:
        """Count each episode's model calls and the ones naming another model (the request's JSON ``model``)."""
        ep = next((self._live[part] for part in request.url.path.split("/") if part in self._live), None)
        if ep is None or request.method != "POST":
            return
        ep.calls += 1
        try:
            named = json.loads(request.content or b"{}").get("model")
        except (ValueError, AttributeError):
            named = None
        if named is not None and named != self.model:
            ep.wrong_model += 1

    def _clients(self) -> tuple[Any, Any, Any]:
        """The ``openai`` module and the ``httpx`` clients (async, sync) every batch's episodes share, made with the
        loop (a harness process imports them before it says it is ready). The async one runs on aiohttp's transport
        where ``httpx-aiohttp`` is installed (``openai[aiohttp]``, in the serve extra: the SDK's own
        ``DefaultAioHttpClient``), else on httpx's own: with 32 episodes at once, httpx's connection pool costs
        about twice the CPU per request (docs/benchmarks.md)."""
        # optional: the serve extra (the harness's clients)
        import httpx
        import openai

        try:
            from httpx_aiohttp import HttpxAiohttpClient as AsyncClient  # optional: openai[aiohttp], the faster pool
        except ImportError:
            AsyncClient = httpx.AsyncClient

        async def watch_async(request: httpx.Request) -> None:
            self._watch(request)

        # a pooled connection is dropped after 2 s idle, before the server's keep-alive (30 s) closes it under a
        # request (an APIConnectionError; requests are never retried: a retried call the server did serve would
        # split its row)
        n = self.concurrency
        limits = httpx.Limits(max_connections=n, max_keepalive_connections=n, keepalive_expiry=2.0)
        timeout = httpx.Timeout(self.timeout_s + 5.0)
        tls = _tls_context()
        aio = AsyncClient(limits=limits, timeout=timeout, event_hooks={"request": [watch_async]}, verify=tls)
        sync = httpx.Client(limits=limits, timeout=timeout, event_hooks={"request": [self._watch]}, verify=tls)
        return openai, aio, sync

    async def _run(self, episodes: list[HarnessEpisode], base_url: BaseURL, on_episode: Any) -> None:
        openai = self._openai
        self._live.update((ep.episode_id, ep) for ep in episodes)
        gate = asyncio.Semaphore(self.concurrency)
        # plain-def harnesses run on threads of their own, per batch: a thread past its limit is abandoned, never
        # waited for, and never holds a later batch's slot
        threads = cf.ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="p3o-harness")
        loop = asyncio.get_running_loop()
        async_harness = is_async(self.harness)

        async def one(ep: HarnessEpisode) -> None:
            async with gate:
                self.active += 1
                if on_episode is not None:
                    on_episode(1)
                try:
                    url = _url(base_url, ep.episode_id)
                    if async_harness:
                        client = openai.AsyncOpenAI(base_url=url, api_key=self.api_key, http_client=self._http,
                                                    max_retries=0)  # fmt: skip
                        call = self.harness(client, self.model, ep.problem)
                    else:
                        client = openai.OpenAI(base_url=url, api_key=self.api_key, http_client=self._sync_http,
                                               max_retries=0)  # fmt: skip
                        call = loop.run_in_executor(threads, self.harness, client, self.model, ep.problem)
                    await _episode(ep, call, self.timeout_s)
                finally:
                    self.active -= 1
                    if on_episode is not None:
                        on_episode(-1)

        try:
            await asyncio.gather(*(one(ep) for ep in episodes))
        finally:
            threads.shutdown(wait=False, cancel_futures=True)
            for ep in episodes:
                self._live.pop(ep.episode_id, None)


async def _episode(ep: HarnessEpisode, call: Any, timeout_s: float) -> None:
    """Await one harness call under its time limit and classify how it ended (`FAULTS`)."""
    t0 = time.perf_counter()
    try:
        value = await asyncio.wait_for(call, timeout_s)
    except TimeoutError:
        ep.fault, ep.error = "timeout", f"past {timeout_s:g} s"
    except Exception as exc:  # the harness's own bug or an endpoint error it did not catch: counted, never raised
        ep.fault, ep.error = "error", f"{type(exc).__name__}: {exc}"[:300]
    else:
        result = episode_result(value)
        if result is None:
            ep.fault, ep.error = "bad_reward", f"returned {type(value).__name__}, not a reward"
        else:
            ep.reward, ep.metrics = result
    ep.seconds = time.perf_counter() - t0
    if ep.wrong_model:  # the endpoint refused it (404), whatever the harness then did
        ep.fault, ep.error = "wrong_model", f"{ep.wrong_model} request(s) named another model"
    if ep.fault is not None:
        ep.reward, ep.metrics = 0.0, {}


# -- harness processes -----------------------------------------------------------------------------------------------

_START_S = 120.0
"""How long a harness process may take to import its harness and say it is ready."""


class _Child:
    """One harness process: its ``subprocess.Popen``, its end of a socket pair (pickled messages), a reader thread
    that keeps ``active`` (its episodes running now) and hands every other message to ``inbox``; `wait_ready`
    before its first batch."""

    def __init__(self, spec: str, settings: dict[str, Any], k: int) -> None:
        mine, theirs = socket.socketpair()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "p3o.envs.harness_client", str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            start_new_session=True,  # a Ctrl-C reaches the trainer, which closes its harness processes
        )
        theirs.close()
        self.conn = Connection(mine.detach())
        self.active, self.inbox, self.k = 0, queue.Queue(), k
        path = [p or os.getcwd() for p in sys.path]  # what this process imports from, the harness's module included
        self.conn.send({"spec": spec, "path": path, **settings})
        self.reader = threading.Thread(target=self._read, name=f"p3o-harness-proc-{k}", daemon=True)
        self.reader.start()

    def wait_ready(self) -> None:
        """Wait for the process to import its harness (ConfigError, one line, when it cannot)."""
        said = self.take(_START_S)
        if said is None or said[0] != "ready":
            self.close()
            if said is None:
                why = f"no answer in {_START_S:g} s"
            else:
                why = f"it exited with code {self.proc.returncode}" if said[0] == "gone" else str(said[-1])
            raise ConfigError(f"agent.harness: the harness process did not start ({why})")

    def _read(self) -> None:
        while True:
            try:
                message = self.conn.recv()
            except (EOFError, OSError, pickle.UnpicklingError):
                self.inbox.put(("gone",))  # the process is gone (or closed its end)
                return
            if message[0] == "active":
                self.active += message[1]
            else:
                self.inbox.put(message)

    def take(self, timeout_s: float) -> tuple[Any, ...] | None:
        """The next message (``("gone",)`` once the process has gone), or None when `timeout_s` passed without
        one."""
        try:
            return self.inbox.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def close(self) -> None:
        """Ask the process to stop, then kill it (its whole session: what a hung tool started dies too)."""
        with contextlib.suppress(OSError, ValueError):
            self.conn.send(None)
        try:
            self.proc.wait(2.0)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5.0)
        self.conn.close()
        self.active = 0


class HarnessProcesses:
    """Harness episodes in `processes` child processes, each running an `EpisodeLoop` of its own (the module
    docstring); ``active`` is the episodes running now, over all of them (the endpoint's batcher reads it).

        procs = HarnessProcesses("p3o.examples.agent_openai:solve", 2, api_key=key, model="tiny-chat", timeout_s=60)
        episodes = procs.run(new_episodes(problems, 4), server.episode_url_template)
        procs.close()

    The harness is imported in each process by its spec (a wrong one: one-line ConfigError when starting). A batch
    waits for each process at most ``timeout_s`` × its waves of ``concurrency`` episodes + 30 s; a process that dies
    or runs past that is killed, its unfinished episodes fail (``error``), and a fresh one serves the next batch.
    """

    def __init__(
        self, spec: str, processes: int, *, api_key: str, model: str, timeout_s: float, concurrency: int = 64
    ) -> None:
        if spec.startswith("verifiers:") or ":" not in spec:
            raise ConfigError(f"agent.harness_processes: runs package.module:function harnesses, not {spec!r}")
        self.spec, self.timeout_s, self.concurrency = spec, float(timeout_s), max(1, int(concurrency))
        self.settings = {"api_key": api_key, "model": model, "timeout_s": self.timeout_s,
                         "concurrency": self.concurrency}  # fmt: skip
        self.restarts = 0
        self.children: list[_Child] = []
        try:
            for k in range(max(1, int(processes))):  # all start at once, then each is waited for
                self.children.append(_Child(spec, self.settings, k))
            for child in self.children:
                child.wait_ready()
        except BaseException:
            self.close()
            raise

    @property
    def active(self) -> int:
        return sum(c.active for c in self.children)

    def run(self, episodes: list[HarnessEpisode], base_url: str) -> list[HarnessEpisode]:
        """The episodes, dealt round-robin to the processes, run and returned in order (``base_url``: a template
        with ``{episode}``)."""
        shares = [episodes[k :: len(self.children)] for k in range(len(self.children))]
        sent = []
        for child, share in zip(self.children, shares):
            try:
                if share:
                    child.conn.send(("run", share, base_url, self.timeout_s))
                sent.append(True)
            except (OSError, ValueError):  # it died since the last batch: its share fails below, a fresh one starts
                sent.append(False)
        done: list[list[HarnessEpisode]] = []
        for k, (share, was_sent) in enumerate(zip(shares, sent)):
            if not share:
                done.append([])
                continue
            waves = -(-len(share) // self.concurrency)
            said = self.children[k].take(self.timeout_s * waves + 30.0) if was_sent else ("gone",)
            if said is not None and said[0] == "done":
                done.append(said[1])
            else:
                done.append(self._lost(k, share, "hung" if said is None else "died"))
        out: list[HarnessEpisode] = [None] * len(episodes)  # type: ignore[list-item]
        for k, share in enumerate(done):
            out[k :: len(self.children)] = share
        return out

    def _lost(self, k: int, share: list[HarnessEpisode], how: str) -> list[HarnessEpisode]:
        """Fail the episodes of process k (it died or stopped answering) and start a fresh one in its place."""
        child = self.children[k]
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.proc.wait(2.0 if how == "died" else 0.0)  # its exit code, once it has exited
        code = child.proc.poll()
        child.close()
        for ep in share:
            fail(ep, "error", f"the harness process {how} (exit code {code})")
        self.children[k] = _Child(self.spec, self.settings, k)
        self.children[k].wait_ready()
        self.restarts += 1
        return share

    def close(self) -> None:
        for child in self.children:
            child.close()
        self.children = []


def _serve(fd: int) -> int:
    """A harness process: read its settings, import the harness, then run each batch it is sent and send the
    episodes back (its ``active`` count as episodes start and end), until told to stop or the trainer is gone."""
    conn = Connection(fd)
    lock = threading.Lock()

    def send(message: Any) -> None:
        with lock:
            conn.send(message)

    try:
        settings = conn.recv()
        sys.path[:0] = [p for p in settings.pop("path") if p not in sys.path]
        harness = load_harness(settings.pop("spec"))
    except ConfigError as err:
        send(("error", str(err)))
        return 1
    except (EOFError, OSError):
        return 1
    loop = EpisodeLoop(harness, **settings)
    send(("ready", os.getpid()))
    try:
        while True:
            try:
                job = conn.recv()
            except (EOFError, OSError):
                return 0
            if job is None:
                return 0
            _, episodes, base_url, loop.timeout_s = job
            loop.run(episodes, base_url, lambda d: send(("active", d)))
            send(("done", episodes))
    finally:
        loop.close()


if __name__ == "__main__":  # a harness process (`HarnessProcesses`): python -m p3o.envs.harness_client FD
    if len(sys.argv) != 2 or not sys.argv[1].isdigit():
        raise SystemExit("usage: python -m p3o.envs.harness_client FD (started by p3o, not by hand)")
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.exit(_serve(int(sys.argv[1])))
