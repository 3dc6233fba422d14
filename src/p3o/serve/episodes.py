"""What the endpoint recorded, episode by episode: rows built from the server's own ids, never from the harness's text.

An episode is a key (the ``/episodes/<id>/v1`` base URL, or an ``X-Episode-Id`` / ``X-Session-ID`` header). Each of
its calls is matched against the rows the episode has open:

* chat calls by messages: the request's messages must start with a row's transcript followed by one of the
  assistant messages the server returned for that row's last call (content and tool calls compared, ids and
  whitespace of JSON arguments ignored). Only the messages after it are rendered, by the fixed-base delta of
  `p3o.envs.render.Renderer` (``observation``), and appended with mask 0;
* token calls (``/v1/completions`` with ids, ``/inference/v1/generate``) by ids: the request's prompt ids must start
  with a row's ids followed by one returned choice's ids; the ids after it are appended with mask 0.

The served assistant turn is the exact ids that were sampled: nothing is re-tokenised. A call that matches no open
row starts a new row from its whole rendered prompt (mask 0): ``start`` for the episode's first, ``rewrite`` when the
harness rewrote or truncated its history, or retried from an earlier turn (counted), ``fork`` when the row it extends
is being extended by a concurrent call of the same episode (counted). A call with ``n`` > 1 leaves n
choices; the one the next call extends continues the row and every other becomes a ``branch`` row (its prompt = the
row so far, its response = that choice). At `EpisodeStore.pop` the last call's first choice continues the row.

A row is the layout of `p3o.envs.runner` rows (`Row`): prompt ids | response ids, the loss mask True on sampled ids
only; a log-prob and a policy version per sampled id (0.0 and −1 elsewhere); template, observation and fix-up ids
(an EOS the template needs after a turn that ended at a stop string) mask 0. A trailing observation never exists: a
row ends with its last sampled turn.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Choice", "EpisodeStore", "Pending", "Row", "canonical"]

SPLIT_REASONS = ("rewrite", "fork")
"""Why a row started although its episode had rows: the history extends none of them (rewrite), or the row it
extends is busy with a concurrent call (fork). Counted in `EpisodeStore.counters` as ``split_<reason>``."""


def _text(content: Any) -> str:
    """A message's content as text: a string, None (""), or OpenAI content parts (their ``text`` joined)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content)


def _arguments(args: Any) -> Any:
    """Tool-call arguments as a JSON value (a JSON string is parsed; one that does not parse stays a string)."""
    if isinstance(args, str):
        try:
            return json.loads(args)
        except ValueError:
            return args
    return args


def canonical(message: dict[str, Any]) -> tuple:
    """What identifies a message for prefix matching: role, text content and, for an assistant turn, its tool calls
    as (name, parsed arguments) — not their ids, not the JSON's spacing, not extra fields."""
    role = str(message.get("role", ""))
    given = message.get("tool_calls")
    fns = [c.get("function") for c in given if isinstance(c, dict)] if isinstance(given, list) else []
    calls = tuple(
        (str(f.get("name", "")), json.dumps(_arguments(f.get("arguments")), sort_keys=True, default=str))
        for f in fns
        if isinstance(f, dict)
    )
    return (role, _text(message.get("content")), calls)


@dataclass
class Choice:
    """One sampled completion of a call: its ids, a log-prob and a version per id, each id's kept set (None when the
    engine records none), whether it ended with EOS, and the assistant message returned (chat calls)."""

    ids: list[int]
    logprobs: list[float]
    versions: list[int]
    ended_with_eos: bool
    finish_reason: str
    message: tuple | None = None
    kept: list[list[int]] | None = None


@dataclass
class Row:
    """One training row of an episode (the `p3o.envs.runner` layout, as lists).

    prompt_ids (P,) are context (mask 0); ids (T,) the response: sampled ids (mask True, their log-prob and version)
    and the observation / template ids between turns (mask False, log-prob 0.0, version −1). ``kept`` holds each
    response id's kept set where the engine recorded it ([] elsewhere), or None when nothing was recorded.
    ``reason`` says why the row started ("start", "rewrite", "fork", "branch"); ``calls`` model calls in it;
    ``finish_reason`` the last call's; ``stats`` turns, model_tokens, obs_tokens, versions (distinct), tool_calls.
    """

    episode: str
    prompt_ids: list[int]
    ids: list[int] = field(default_factory=list)
    mask: list[bool] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    kept: list[list[int]] | None = None
    reason: str = "start"
    calls: int = 0
    finish_reason: str = ""
    stats: dict[str, float] = field(default_factory=dict)

    def add_turn(self, c: Choice) -> None:
        """Append a sampled turn (mask True)."""
        self._extend(c.ids, True, c.logprobs, c.versions, c.kept)
        self.calls += 1
        self.finish_reason = c.finish_reason
        tool_calls = len(c.message[2]) if c.message is not None else 0
        self.stats["tool_calls"] = self.stats.get("tool_calls", 0.0) + tool_calls

    def add_observation(self, ids: Sequence[int]) -> None:
        """Append ids the server rendered or the caller sent (mask False, log-prob 0, version −1)."""
        self._extend(list(ids), False, [0.0] * len(ids), [-1] * len(ids), None)
        self.stats["obs_tokens"] = self.stats.get("obs_tokens", 0.0) + len(ids)

    def _extend(self, ids, sampled, lps, vers, kept) -> None:
        if kept is not None and self.kept is None:
            self.kept = [[] for _ in self.ids]  # ids before the first recorded set have none
        if self.kept is not None:
            self.kept += kept if kept is not None else [[] for _ in ids]
        self.ids += ids
        self.mask += [sampled] * len(ids)
        self.logprobs += list(lps)
        self.versions += list(vers)

    def finish(self) -> Row:
        """The row as handed out: its turn, token and version statistics filled in."""
        sampled = [v for v, m in zip(self.versions, self.mask) if m]
        self.stats.update(turns=float(self.calls), model_tokens=float(len(sampled)),
                          versions=float(len(set(sampled))))  # fmt: skip
        self.stats.setdefault("obs_tokens", 0.0)
        self.stats.setdefault("tool_calls", 0.0)
        return self


@dataclass
class _Open:
    """A row still open to extension: the row so far, the transcript it stands for (chat), and the choices of its
    last call, one of which the next call of the episode should extend."""

    row: Row
    messages: list[tuple] | None
    tools_key: str | None
    choices: list[Choice] = field(default_factory=list)
    busy: bool = False


@dataclass
class Pending:
    """A call between `EpisodeStore.prepare_*` and `commit` / `abort`: the ids to generate from and where the
    choices go. ``reason`` is set when the call starts a new row."""

    episode: str | None
    prompt_ids: list[int]
    open: _Open | None = None
    choice: int | None = None
    tail: list[int] = field(default_factory=list)
    messages: list[tuple] | None = None
    tools_key: str | None = None
    reason: str = ""


class EpisodeStore:
    """Every recorded call, by episode. Thread-safe; at most ``max_episodes`` episodes are kept (the oldest is
    dropped and counted, ``dropped_episodes``, when an unpopped one would exceed it)."""

    def __init__(self, max_episodes: int = 100_000) -> None:
        self.max_episodes = int(max_episodes)
        self._lock = threading.Lock()
        self._open: OrderedDict[str, list[_Open]] = OrderedDict()
        self._done: dict[str, list[Row]] = {}
        self._counts: dict[str, int] = {"split_rewrite": 0, "split_fork": 0, "rows": 0, "dropped_episodes": 0}

    # -- matching --------------------------------------------------------------------------------------------------

    def prepare_chat(
        self,
        episode: str | None,
        messages: list[tuple],
        tools_key: str | None,
        render_prompt: Callable[[], list[int]],
        render_tail: Callable[[int, bool], list[int]],
    ) -> Pending:
        """Where a chat call with (canonical) `messages` goes: the ids to generate from.

        ``render_tail(k, ended_with_eos)`` renders the request's messages from index k on as an observation after a
        turn (`Renderer.observation`); ``render_prompt()`` renders them all as a prompt. Neither is called under the
        lock's guard of another episode's rows changing: the matched row is reserved (busy) until `commit`/`abort`.
        """
        with self._lock:
            found = None
            for op in reversed(self._open.get(episode, [])) if episode is not None else []:
                if op.messages is None or op.tools_key != tools_key:
                    continue
                k = len(op.messages)
                if len(messages) <= k + 1 or messages[:k] != op.messages:
                    continue
                j = next((i for i, c in enumerate(op.choices) if c.message == messages[k]), None)
                if j is not None:
                    found = (op, j, k + 1)
                    break
            reason = self._reason(episode, found)
            if reason == "":
                op, j, k = found
                op.busy = True
        if reason:
            return Pending(episode, render_prompt(), messages=messages, tools_key=tools_key, reason=reason)
        try:
            tail = render_tail(k, op.choices[j].ended_with_eos)
        except Exception:
            self.abort(Pending(episode, [], open=op))
            raise
        ids = op.row.prompt_ids + op.row.ids + op.choices[j].ids + tail
        return Pending(episode, ids, open=op, choice=j, tail=tail, messages=messages, tools_key=tools_key)

    def prepare_tokens(self, episode: str | None, prompt_ids: list[int]) -> Pending:
        """Where a token call with `prompt_ids` goes: a row whose ids + one choice's ids are a prefix of them."""
        with self._lock:
            found = None
            for op in reversed(self._open.get(episode, [])) if episode is not None else []:
                if op.messages is not None:
                    continue
                base = op.row.prompt_ids + op.row.ids
                if prompt_ids[: len(base)] != base:
                    continue
                j = next((i for i, c in enumerate(op.choices)
                          if prompt_ids[len(base): len(base) + len(c.ids)] == c.ids), None)  # fmt: skip
                if j is not None:
                    found = (op, j, len(base) + len(op.choices[j].ids))
                    break
            reason = self._reason(episode, found)
            if reason:
                return Pending(episode, list(prompt_ids), reason=reason)
            op, j, k = found
            op.busy = True
        return Pending(episode, list(prompt_ids), open=op, choice=j, tail=list(prompt_ids[k:]))

    def _reason(self, episode: str | None, found) -> str:
        """ "" when `found` (a free row) is extended, else why a new row starts; counts splits. Under the lock."""
        if episode is None:
            return "unrecorded"
        if found is not None and not found[0].busy:
            return ""
        if found is not None:
            self._counts["split_fork"] += 1
            return "fork"
        if self._open.get(episode) or self._done.get(episode):
            self._counts["split_rewrite"] += 1
            return "rewrite"
        return "start"

    # -- recording -------------------------------------------------------------------------------------------------

    def commit(self, pending: Pending, choices: list[Choice]) -> None:
        """Record a served call: its chosen predecessor and tail join the row, the other predecessors become branch
        rows, and `choices` wait for the next call. Nothing is recorded for an unrecorded call."""
        if pending.episode is None or pending.reason == "unrecorded":
            return
        with self._lock:
            op = pending.open
            if op is None:
                row = Row(pending.episode, list(pending.prompt_ids), reason=pending.reason)
                op = _Open(row, pending.messages, pending.tools_key)
                self._remember(pending.episode).append(op)
            else:
                self._settle(op, pending.choice or 0)
                op.row.add_observation(pending.tail)
                op.messages = pending.messages
                op.busy = False
            op.choices = list(choices)

    def abort(self, pending: Pending) -> None:
        """A call that was refused or failed after `prepare_*`: its row is free again, unchanged."""
        if pending.open is not None:
            with self._lock:
                pending.open.busy = False

    def _settle(self, op: _Open, j: int) -> None:
        """Choice j of the row's last call joins the row; each other choice is a finished branch row."""
        base = op.row.prompt_ids + op.row.ids
        for i, c in enumerate(op.choices):
            if i != j:
                branch = Row(op.row.episode, list(base), reason="branch")
                branch.add_turn(c)
                self._done.setdefault(op.row.episode, []).append(branch.finish())
        if op.choices:
            op.row.add_turn(op.choices[j])
        op.choices = []

    def _remember(self, episode: str) -> list[_Open]:
        if episode not in self._open:
            self._open[episode] = []
            while len(self._open) > self.max_episodes:
                old, _ = self._open.popitem(last=False)
                self._done.pop(old, None)
                self._counts["dropped_episodes"] += 1
        return self._open[episode]

    # -- handing out -----------------------------------------------------------------------------------------------

    def pop(self, episode: str) -> list[Row]:
        """The episode's rows, in the order they started (branch rows after the row they branched from), and forget
        it. Each open row takes its last call's first choice. [] for an episode that made no recorded call."""
        with self._lock:
            rows = []
            for op in self._open.pop(episode, []):
                self._settle(op, 0)
                rows.append(op.row.finish())
            rows += self._done.pop(episode, [])
            self._counts["rows"] += len(rows)
            return rows

    def episodes(self) -> list[str]:
        """The episodes with recorded calls not yet popped."""
        with self._lock:
            return list(self._open)

    def counters(self) -> dict[str, int]:
        """split_rewrite, split_fork, rows (handed out by `pop`), dropped_episodes, open_episodes."""
        with self._lock:
            return {**self._counts, "open_episodes": len(self._open)}
