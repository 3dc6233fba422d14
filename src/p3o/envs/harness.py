"""Harnesses: agents people already have, run against p3o's endpoint, many episodes at once.

A harness is ``agent.harness: package.module:function``:

    async def solve(client: openai.AsyncOpenAI, model: str, problem: p3o.tasks.Problem) -> float | dict

(a plain ``def`` gets an ``openai.OpenAI`` and runs in a thread). ``client`` is bound to its episode's base URL on
the endpoint (``/episodes/<id>/v1``) and the run's key; it returns the episode's reward, or a dict with ``reward``
and extra numeric metrics (averaged per step into ``episode/<name>``).

`run_harness` runs n episodes of every problem concurrently (asyncio, at most ``concurrency`` at once, each under
``timeout_s``) and hands back one `HarnessEpisode` per episode, in order (rows b·n … b·n + n − 1 are problem b's).
What an episode trains on is never the harness's text: it is what the endpoint recorded for that episode's key
(``server.store.pop(id)``), popped by the caller (`p3o.train.harness_source`).

Faults, each counted and never a crash, a hang or a row (`FAULTS`): the harness raised (``error``), ran past its
time limit (``timeout``: the task is cancelled; a plain ``def`` keeps its thread, and whatever it still sends under
its key is dropped), returned something that is no reward (``bad_reward``), never called the model (``no_calls``),
or asked for another model than the one served (``wrong_model``, seen on the requests of the client it was given).
``no_calls`` (nothing recorded under its key) is decided by the caller from the endpoint's records (`fail`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import functools
import importlib
import inspect
import json
import math
import ssl
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from p3o.envs.engine import ProblemEngine, episode_rollouts
from p3o.errors import ConfigError
from p3o.tasks.base import Problem
from p3o.types import Rollouts

__all__ = [
    "FAULTS",
    "ROW_STATS",
    "HarnessEngine",
    "HarnessEpisode",
    "harness_rows",
    "episode_result",
    "fail",
    "is_async",
    "load_harness",
    "run_harness",
]

FAULTS = ("error", "timeout", "bad_reward", "no_calls", "wrong_model")
"""Why an episode failed: the harness raised; it ran past ``agent.episode_timeout_s``; it returned no number (or a
dict without a numeric ``reward``); the endpoint recorded no call under its key; it named another model."""

Harness = Callable[..., Any]


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
        module = importlib.import_module(module_name)
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


def episode_result(value: Any) -> tuple[float, dict[str, float]] | None:
    """(reward, extra metrics) of a harness's return: a finite number, or a dict with a finite numeric ``reward``
    (its other finite numeric values are metrics, anything else ignored); None when it is neither."""
    if isinstance(value, dict):
        reward = value.get("reward")
        extra = {
            str(k): float(v)
            for k, v in value.items()
            if k != "reward" and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        }
    else:
        reward, extra = value, {}
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
        return None
    return float(reward), extra


def run_harness(
    harness: Harness,
    problems: Sequence[Problem],
    n: int,
    *,
    base_url: Callable[[str], str],
    api_key: str,
    model: str,
    timeout_s: float,
    concurrency: int = 64,
    run_id: str = "",
    on_episode: Callable[[int], None] | None = None,
) -> list[HarnessEpisode]:
    """Run `n` episodes of every problem through the endpoint; one `HarnessEpisode` each, problem-major.

    Args:
        harness: `load_harness`'s result.
        base_url: ``base_url(episode_id)`` -> the episode's OpenAI base URL (``EndpointServer.episode_url``).
        api_key: the run's bearer key (given to each episode's client, never logged).
        model: the served model name; a request naming another is counted (``wrong_model``).
        timeout_s: wall-clock limit of one episode; concurrency: episodes at once.
        run_id: prefix of the episode ids (ids are ``<run_id><uuid4 hex>``: unique, never reused).
        on_episode: called with +1 when an episode starts and −1 when it ends (the endpoint's batcher waits for the
            running episodes' next calls: `p3o.serve.batcher.Batcher.gather`).
    """
    episodes = [
        HarnessEpisode(problem=p, group=b, episode_id=f"{run_id}{uuid.uuid4().hex}")
        for b, p in enumerate(problems)
        for _ in range(n)
    ]
    if episodes:
        asyncio.run(_run_all(harness, episodes, base_url, api_key, model, timeout_s, max(1, concurrency), on_episode))
    return episodes


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """The default TLS context, made once per process and shared by every batch's clients."""
    return ssl.create_default_context()


async def _run_all(harness, episodes, base_url, api_key, model, timeout_s, concurrency, on_episode) -> None:
    # optional: httpx and openai (extra serve), the clients a harness is handed
    import httpx
    import openai

    by_id = {ep.episode_id: ep for ep in episodes}

    def watch(request: httpx.Request) -> None:
        """Count each episode's model calls and the ones naming another model (the request's JSON ``model``)."""
        ep = next((by_id[part] for part in request.url.path.split("/") if part in by_id), None)
        if ep is None or request.method != "POST":
            return
        ep.calls += 1
        try:
            named = json.loads(request.content or b"{}").get("model")
        except (ValueError, AttributeError):
            named = None
        if named is not None and named != model:
            ep.wrong_model += 1

    async def watch_async(request: httpx.Request) -> None:
        watch(request)

    # a pooled connection is dropped after 2 s idle, before the server's keep-alive (uvicorn's 5 s) closes it under a
    # request (an APIConnectionError; requests are never retried: a retried call the server did serve would split)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency, keepalive_expiry=2.0)
    gate = asyncio.Semaphore(concurrency)
    timeout = httpx.Timeout(timeout_s + 5.0)
    tls = _tls_context()  # built once per process: each client would load the CA store again (30-45 ms apiece)
    hooks = {"request": [watch_async]}
    async with httpx.AsyncClient(limits=limits, timeout=timeout, event_hooks=hooks, verify=tls) as http:
        sync_http = httpx.Client(timeout=timeout, limits=limits, event_hooks={"request": [watch]}, verify=tls)
        # plain-def harnesses run on threads of their own: a thread past its limit is abandoned, never waited for
        threads = cf.ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="p3o-harness")
        loop = asyncio.get_running_loop()
        async_harness = is_async(harness)
        try:

            async def one(ep: HarnessEpisode) -> None:
                async with gate:
                    if on_episode is not None:
                        on_episode(1)
                    try:
                        await one_episode(ep)
                    finally:
                        if on_episode is not None:
                            on_episode(-1)

            async def one_episode(ep: HarnessEpisode) -> None:
                url = base_url(ep.episode_id)
                if async_harness:
                    client = openai.AsyncOpenAI(base_url=url, api_key=api_key, http_client=http, max_retries=0)
                    call = harness(client, model, ep.problem)
                else:
                    client = openai.OpenAI(base_url=url, api_key=api_key, http_client=sync_http, max_retries=0)
                    call = loop.run_in_executor(threads, harness, client, model, ep.problem)
                await _episode(ep, call, timeout_s)

            await asyncio.gather(*(one(ep) for ep in episodes))
        finally:
            threads.shutdown(wait=False, cancel_futures=True)
            sync_http.close()


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


def fail(ep: HarnessEpisode, fault: str, error: str) -> None:
    """Mark a finished episode failed after the fact (e.g. ``no_calls``: the endpoint recorded nothing under its
    key, which the caller learns from the endpoint, not from the harness's client)."""
    ep.fault, ep.error, ep.reward, ep.metrics = fault, error, 0.0, {}


# -- episodes as training rows ---------------------------------------------------------------------------------------

ROW_STATS = ("turns", "tool_calls", "obs_tokens", "model_tokens", "versions", "version_span", "split", "failed")
"""Per-row `Rollouts.extras` of a harness batch (plus ``stop_<how>``, 1 on an episode's first row for how it ended:
``stop_done`` or ``stop_<fault>`` for each of `FAULTS`, the plot's "Episode ends" panel; and each numeric metric
the harness returned, 0 where an episode has none): the endpoint's row statistics; ``version_span`` = newest − oldest
policy version among the row's sampled tokens (verifiers' PolicySpan); ``split`` 1 for a row that is not its
episode's first (a rewritten history, a concurrent fork, an n > 1 branch); ``failed`` 1 for a failed episode's row."""


STOPS = ("stop_done", *(f"stop_{f}" for f in FAULTS))
"""How a harness episode ended, one extras key each (1 on its rows): finished, or failed by one of `FAULTS`."""


class HarnessEngine(ProblemEngine):
    """A `RolloutEngine` whose ``generate`` runs harness episodes against an endpoint and returns the rows the
    endpoint recorded: what the training loop, its sources and the held-out evaluation hold when ``agent.harness`` is
    set (a prompt's id list names its problem, as for `p3o.envs.EpisodeEngine`).

    Rows: every row the endpoint recorded for a successful episode (``server.store.pop``), each with the episode's
    reward; ``prompt_ids`` = the ids the endpoint rendered for the row's first call, ``response_ids`` = sampled ids
    (mask 1, their recorded log-prob and version) and the observation / template ids between turns (mask 0). A failed
    episode (`FAULTS`) gives one row with an empty response (mask all 0: nothing of it is trained) and reward 0; its
    records are popped and dropped. Rows of problem b carry group id b (`relative_group_ids`), so an episode that
    split into several rows keeps them in its problem's group.

    Weights and versions are the server's engine's (``load_weights`` passes through), so a push between two calls of
    one episode gives two versions in one row; admission by the oldest token's version is the source's own rule.

        engine = HarnessEngine(server, load_harness("p3o.examples.agent_openai:solve"), problems_by_prompt,
                               timeout_s=60, concurrency=64)
        rollouts = engine.generate(prompt_ids, n=4)        # episodes through the endpoint, rewards filled in
    """

    relative_group_ids = True

    def __init__(
        self,
        server: Any,
        harness: Harness,
        problems: dict[Any, Problem],
        *,
        timeout_s: float,
        concurrency: int = 64,
        pad_id: int = 0,
    ) -> None:
        self.server, self.harness, self.problems = server, harness, problems
        self.timeout_s, self.concurrency, self.pad_token_id = float(timeout_s), int(concurrency), int(pad_id)
        self.run_id = f"h{uuid.uuid4().hex[:8]}-"
        self.faults: dict[str, int] = {k: 0 for k in FAULTS}
        self.late_rows = 0
        self.said: set[str] = set()
        self.episodes_run = 0
        self.active = 0  # episodes running now (read by the endpoint's batcher to gather their next calls)

    @property
    def version(self) -> int:
        return int(self.server.version)

    @version.setter
    def version(self, value: int) -> None:
        self.server.engine.version = value

    @property
    def tokenizer(self) -> Any:
        return self.server.tokenizer

    def load_weights(self, state_dict: dict[str, Any], version: int) -> None:
        self.server.load_weights(state_dict, version)

    def __getattr__(self, name: str) -> Any:
        if name == "server":
            raise AttributeError(name)
        return getattr(self.server.engine, name)

    def _episodes(self, prompt_ids: list[list[int]], problems: list[Problem], n: int, seed: int | None) -> Rollouts:
        """`n` harness episodes of every problem; their recorded rows (see the class docstring). ``seed`` is the
        harness's business (its requests carry it), ignored here."""
        del seed
        episodes = run_harness(
            self.harness,
            problems,
            n,
            base_url=self.server.episode_url,
            api_key=self.server.api_key,
            model=self.server.model_name,
            timeout_s=self.timeout_s,
            concurrency=self.concurrency,
            run_id=self.run_id,
            on_episode=self._count,
        )
        recorded = [self.server.store.pop(ep.episode_id) for ep in episodes]  # popped for failed episodes too
        self._drop_late(episodes)
        for ep, rows in zip(episodes, recorded):
            if ep.fault is None and not rows:
                fail(ep, "no_calls", "the endpoint recorded no call under the episode's key")
            if ep.fault is not None:
                self.faults[ep.fault] += 1
                if ep.fault not in self.said:  # the first episode of each fault says why, once per run
                    self.said.add(ep.fault)
                    print(f"p3o: a harness episode failed ({ep.fault}): {ep.error}", file=sys.stderr)
        self.episodes_run += len(episodes)
        return harness_rows(episodes, recorded, [list(p) for p in prompt_ids], n, self.pad_token_id)

    def _count(self, delta: int) -> None:
        self.active += delta

    def _drop_late(self, episodes: list[HarnessEpisode]) -> None:
        """Pop and drop what abandoned episodes (a thread past its limit) recorded since their batch ended."""
        mine = {ep.episode_id for ep in episodes}
        for episode in self.server.store.episodes():
            if episode.startswith(self.run_id) and episode not in mine:
                self.late_rows += len(self.server.store.pop(episode))

    def close(self) -> None:
        """Stop the endpoint."""
        self.server.stop()


def harness_rows(
    episodes: Sequence[HarnessEpisode], recorded: Sequence[Sequence[Any]], prompts: list[list[int]], n: int, pad: int
) -> Rollouts:
    """`Rollouts` of a harness batch: every recorded row of each successful episode, one empty row (mask 0) per failed
    one, in episode order; group id = the episode's problem index; extras `ROW_STATS`, ``stop_<how>`` and the
    harness's own metrics. ``recorded[i]``: episode i's `p3o.serve.episodes.Row` list (prompt_ids, ids, mask,
    logprobs, versions, reason, stats)."""
    flat: list[tuple[HarnessEpisode, Any, int]] = []  # (episode, row or None, index of the row in its episode)
    for ep, rows in zip(episodes, recorded):
        if ep.fault is not None or not rows:
            flat.append((ep, None, 0))
        else:
            flat.extend((ep, row, j) for j, row in enumerate(rows))
    metric_names = sorted({k for ep in episodes for k in ep.metrics})
    extras: dict[str, list[float]] = {k: [] for k in (*ROW_STATS, *STOPS, *metric_names)}
    row_prompts = []
    for ep, row, j in flat:
        stats = dict(row.stats) if row is not None else {}
        if row is not None:
            sampled = [v for v, m in zip(row.versions, row.mask) if m]
            stats["version_span"] = float(max(sampled) - min(sampled)) if sampled else 0.0
            row_prompts.append(list(row.prompt_ids))
        else:
            row_prompts.append(prompts[ep.group])
        stats["split"] = float(j > 0)
        stats["failed"] = float(ep.fault is not None)
        for f in FAULTS:  # how the episode ended: on its first row only, so their sums count episodes
            stats[f"stop_{f}"] = float(ep.fault == f and j == 0)
        stats["stop_done"] = float(ep.fault is None and j == 0)
        for name in metric_names:
            stats[name] = ep.metrics.get(name, 0.0)
        for key in extras:
            extras[key].append(float(stats.get(key, 0.0)))
    return episode_rollouts(
        row_prompts,
        [([], [], [], []) if row is None else (row.ids, row.mask, row.logprobs, row.versions) for _, row, _ in flat],
        pad,
        groups=[ep.group for ep, _, _ in flat],
        rewards=[ep.reward for ep, _, _ in flat],
        truncated=[row is None or row.finish_reason == "length" for _, row, _ in flat],
        answers=[ep.problem.answer for ep, _, _ in flat],
        extras=extras,
    )
