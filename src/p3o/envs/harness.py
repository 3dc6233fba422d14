"""Harness episodes as training rows: `HarnessEngine`, the rollout engine of a run with ``agent.harness``.

A harness is an agent people already have (``agent.harness: package.module:function``, an ``openai``-SDK loop, or
``verifiers:<module>``), run against p3o's endpoint; the client side (loading a harness, running its episodes on a
loop of their own or in harness processes, the faults) is `p3o.envs.harness_client`, whose names this module
re-exports. What an episode trains on is never the harness's text: it is what the endpoint recorded for that
episode's key (``server.store.pop(id)``), turned into rows here (`harness_rows`).
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Sequence
from typing import Any

from p3o.envs.engine import ProblemEngine, episode_rollouts
from p3o.envs.harness_client import (
    FAULTS,
    EpisodeLoop,
    Harness,
    HarnessEpisode,
    HarnessProcesses,
    episode_result,
    fail,
    is_async,
    load_harness,
    new_episodes,
    run_harness,
)
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

    Where the episodes run: ``processes`` 0, an `p3o.envs.harness_client.EpisodeLoop` in this process (the given
    ``harness``); P > 0, `p3o.envs.harness_client.HarnessProcesses`, P processes importing the harness by its
    ``spec``, each running at most ⌈concurrency / P⌉ episodes at once. ``active`` counts the running episodes either
    way (the endpoint's batcher gathers their next calls).
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
        processes: int = 0,
        spec: str | None = None,
    ) -> None:
        self.server, self.harness, self.problems = server, harness, problems
        self.concurrency, self.pad_token_id = int(concurrency), int(pad_id)
        self.run_id = f"h{uuid.uuid4().hex[:8]}-"
        self.faults: dict[str, int] = {k: 0 for k in FAULTS}
        self.late_rows = 0
        self.said: set[str] = set()
        self.episodes_run = 0
        settings = {"api_key": server.api_key, "model": server.model_name, "timeout_s": float(timeout_s),
                    "concurrency": self.concurrency}  # fmt: skip
        self.clients: EpisodeLoop | HarnessProcesses
        if processes > 0:
            if spec is None:
                raise ValueError("HarnessEngine: harness processes import the harness by its spec; none given")
            per_process = -(-self.concurrency // processes)  # ``concurrency`` bounds the episodes over all of them
            self.clients = HarnessProcesses(spec, processes, **{**settings, "concurrency": per_process})
        else:
            self.clients = EpisodeLoop(harness, **settings)

    @property
    def active(self) -> int:
        """Episodes running now, in this process or in the harness processes (read by the endpoint's batcher to
        gather their next calls)."""
        return self.clients.active

    @property
    def timeout_s(self) -> float:
        """The wall-clock limit of one episode (``agent.episode_timeout_s``): the clients', so a change holds from
        the next batch on."""
        return self.clients.timeout_s

    @timeout_s.setter
    def timeout_s(self, value: float) -> None:
        self.clients.timeout_s = float(value)

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
        episodes = self.clients.run(new_episodes(problems, n, self.run_id), self.server.episode_url_template)
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

    def _drop_late(self, episodes: list[HarnessEpisode]) -> None:
        """Pop and drop what abandoned episodes (a thread past its limit) recorded since their batch ended."""
        mine = {ep.episode_id for ep in episodes}
        for episode in self.server.store.episodes():
            if episode.startswith(self.run_id) and episode not in mine:
                self.late_rows += len(self.server.store.pop(episode))

    def close(self) -> None:
        """Stop the harness's clients (its processes) and the endpoint."""
        self.clients.close()
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
