"""Agent episodes on any rollout engine: a tick loop that batches every episode waiting on the model into one
`generate` call and steps the environments of the finished turns concurrently.

Token in, token out. An episode's row is built from an append-only list of segments:

    prompt ids (rendered once, from env.reset's messages)
    | model turn 1 (the engine's sampled ids, log-probs, versions)   mask 1
    | observation 1 (ids the renderer appended)                       mask 0, log-prob 0, version −1
    | model turn 2 | …

Nothing is decoded and re-tokenised: the text of a turn is decoded only for the environment to parse. Each engine call
gets the ids of the whole history as its prompt and returns only that turn's ids, appended as they are. A weight push
between turns (or, with in-flight updates, inside one) stamps the later tokens with the new version, so one row may
carry several versions; each token keeps its own recorded log-prob, which is what P3O's ratio is taken against.

    rollouts = run_episodes(engine, lambda: make_env("calc"), problems, n=4, renderer=renderer,
                            limits=EnvLimits(max_turns=3), seed=0)
    rollouts.mask      # (N, T) model tokens (the loss mask);  rollouts.attn: every real token
    rollouts.extras    # per-row turns, tool_calls, tool_errors, obs_tokens, versions, cut, ...

Scheduling: in ``overlap=False`` mode (the default) every tick waits for all environment steps of that tick, so the
engine calls and their seeds are a function of (seed, tick) alone and a run reproduces; tools of different episodes
still run at the same time (a thread pool). ``overlap=True`` generates for the episodes that are ready while the
others' tools run (more throughput, not reproducible).

An environment is the user's code, run in the trainer's process: a `step` that raises ends its episode (stop reason
``env_error``, counted as ``env_errors``, scored 0; the first traceback is printed once, shortened), a `step` still
running after ``limits.env_timeout_s`` is abandoned in its daemon thread (``env_timeout``, counted as
``env_timeouts``, scored 0) and the batch goes on; the process still exits. An episode that would run past the
model's context (``context``: prompt + history + the next turn) is cut there (``context``).
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import functools
import hashlib
import inspect
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from p3o.envs.base import Environment, EnvLimits, Step, info_number
from p3o.envs.engine import ProblemEngine, episode_rollouts
from p3o.errors import P3OError
from p3o.rollout.base import RolloutEngine
from p3o.tasks.base import Problem
from p3o.types import Rollouts, SamplingMask

__all__ = ["EPISODE_STATS", "STOP_KEYS", "STOP_REASONS", "Episode", "EpisodeEngine", "model_context", "run_episodes"]

STOP_REASONS = ("done", "max_turns", "length", "turn_length", "context", "env_error", "env_timeout")
"""Why an episode ended: the environment said done; the turn limit; the episode's token budget
(``max_total_tokens``); a model turn hit ``max_turn_tokens`` without a stop; the model's context (prompt + history
+ the next turn past it); the environment's `step` raised; it ran past ``env_timeout_s`` (both scored 0)."""

STOP_KEYS = tuple(f"stop_{r}" for r in STOP_REASONS)
"""Per-row `Rollouts.extras` keys: 1.0 on the row of the reason its episode ended, 0.0 on the others."""

EPISODE_STATS = (
    "turns",
    "tool_calls",
    "tool_errors",
    "tool_timeouts",
    "parse_errors",
    "tool_latency_s",
    "obs_tokens",
    "obs_cut",
    "model_tokens",
    "versions",
    "cut",
    "env_errors",
    "env_timeouts",
    *STOP_KEYS,
)
"""Per-row `Rollouts.extras` keys always written by `run_episodes` (float32 each): model turns; the summed `Step.info`
counters; observation tokens appended and observations cut to ``max_obs_tokens``; model tokens; distinct policy
versions among the model tokens; 1 when anything but the environment's done ended the episode; the environment's
errors and timeouts; the stop reason (`STOP_KEYS`). Every other numeric `Step.info` key an environment reports (its
own counters) is summed per episode and written too, under its own name (0 on rows that never reported it)."""


@dataclass
class Episode:
    """One running episode: its environment, its prompt and its segments so far."""

    env: Environment
    problem: Problem
    group: int
    prompt: list[int]
    ids: list[int] = field(default_factory=list)
    model: list[bool] = field(default_factory=list)
    logp: list[float] = field(default_factory=list)
    version: list[int] = field(default_factory=list)
    turns: int = 0
    reward: float = 0.0
    stats: dict[str, float] = field(default_factory=dict)
    stop_reason: str = ""
    ended_with_eos: bool = True
    kept_counts: list[int] = field(default_factory=list)
    kept_ids: list[Tensor] = field(default_factory=list)
    abandoned: bool = False

    @property
    def done(self) -> bool:
        return bool(self.stop_reason)

    def add(self, key: str, value: float) -> None:
        self.stats[key] = self.stats.get(key, 0.0) + float(value)

    def append(self, ids: list[int], model: bool, logp: list[float], version: list[int], kept: tuple | None) -> None:
        """Append a segment: a model turn (its log-probs, versions and kept sets) or an observation (model False)."""
        self.ids += ids
        self.model += [model] * len(ids)
        self.logp += logp if model else [0.0] * len(ids)
        self.version += version if model else [-1] * len(ids)
        counts, kept_ids = kept if kept is not None else ([0] * len(ids), None)
        self.kept_counts += counts
        if kept_ids is not None:
            self.kept_ids.append(kept_ids)


class Reporter:
    """Says each kind of trouble once, on stderr (``p3o: warning: ... (reported once)``)."""

    def __init__(self) -> None:
        self.said: set[str] = set()

    def __call__(self, kind: str, message: str) -> None:
        if kind not in self.said:
            self.said.add(kind)
            print(f"p3o: warning: {message} (reported once)", file=sys.stderr, flush=True)


def _short_traceback(exc: BaseException) -> str:
    """``ValueError: msg (at file.py:12 in step)``: the exception and the innermost frame of its traceback."""
    where = ""
    frames = traceback.extract_tb(exc.__traceback__)
    if frames:
        f = frames[-1]
        where = f" (at {f.filename.rsplit('/', 1)[-1]}:{f.lineno} in {f.name})"
    text = str(exc).splitlines()[0][:200] if str(exc) else ""
    return f"{type(exc).__name__}: {text}{where}"


def _cut_at_stop(ids: list[int], stops: set[int]) -> tuple[int, bool]:
    """Length of the turn up to and including its first stop id, and whether it has one."""
    for i, t in enumerate(ids):
        if t in stops:
            return i + 1, True
    return len(ids), False


def run_episodes(
    engine: RolloutEngine,
    make_env: Callable[[], Environment],
    problems: Sequence[Problem],
    n: int,
    *,
    renderer,  # p3o.envs.render.Renderer
    limits: EnvLimits,
    seed: int,
    eos_ids: Sequence[int],
    stop_ids: Sequence[int] = (),
    overlap: bool = False,
    on_tick: Callable[[int], None] | None = None,
    context: int | None = None,
    report: Callable[[str, str], None] | None = None,
) -> Rollouts:
    """Run `n` episodes of every problem to their end; one row per episode, rows of a problem consecutive.

    Args:
        engine: any `RolloutEngine`; its ``generate`` takes each episode's history as a prompt (n = 1) and, where it
            accepts it, ``max_new_tokens`` per call (clamped to what the episodes have left).
        make_env: a fresh `Environment` per episode (closed at the end, also on error).
        problems: B problems; rows b·n … b·n + n − 1 are problem b's episodes (one GRPO group).
        renderer: turns messages into ids (`p3o.envs.render.Renderer`): ``prompt_ids(messages)`` and
            ``observation(messages, turn_ended_with_eos) -> Observation(ids, cut)`` (or ``observation_ids -> ids``).
        limits: `EnvLimits` (turns, tokens per turn / episode / observation, ``env_timeout_s`` of one `step`; tool
            limits live in the tools).
        seed: the episode seeds (env.reset) and each tick's engine seed derive from it.
        eos_ids: ids that end a turn as a finished message; `stop_ids`: the environment's other turn-ending ids
            (a tool call's close). A turn is cut after its first id of either set, whatever the engine did.
        overlap: generate for ready episodes while others' tools run (not reproducible); see the module docstring.
        on_tick: called with the tick number before each engine call (tests push weights there).
        context: the model's context in tokens (`model_context`; None: unbounded): a turn never runs past it.
        report: ``report(kind, message)`` says an environment's first error, timeout, ... (default: once per call).
    Returns:
        `Rollouts`: prompt (B·n, P) left-padded; response (B·n, T) = turns and observations; ``mask`` model tokens,
        ``attn`` every real token; ``rollout_logp`` / ``policy_version`` per model token (0 / −1 elsewhere);
        ``rewards`` the episodes' returns; ``truncated`` = a limit ended it; ``extras`` = `EPISODE_STATS` and the
        environment's own counters; ``sampling_mask`` the engine's kept sets where it recorded them.
    """
    if n < 1:
        raise P3OError(f"run_episodes: n must be >= 1, got {n}")
    eos, stops = set(int(i) for i in eos_ids), set(int(i) for i in stop_ids)
    ends = eos | stops
    report = report if report is not None else Reporter()
    episodes: list[Episode] = []
    try:
        for b, problem in enumerate(problems):
            for j in range(n):
                env = make_env()
                ep = Episode(env=env, problem=problem, group=b, prompt=[])
                episodes.append(ep)
                messages = env.reset(problem, seed=_mix(seed, 0, b, j))
                ep.prompt = list(renderer.prompt_ids(messages))
                if not ep.prompt:
                    raise P3OError(f"environment {type(env).__name__}: reset returned no prompt")
        _tick_loop(engine, episodes, renderer, limits, seed, (eos, ends), overlap, on_tick, context, report)
    finally:
        for ep in episodes:
            if ep.abandoned:  # its step still runs (hung): close it from a daemon thread, never wait for it
                threading.Thread(target=_quiet_close, args=(ep.env,), daemon=True).start()
            else:
                _quiet_close(ep.env)
    return _rows(episodes, engine)


def _quiet_close(env: Environment) -> None:
    with contextlib.suppress(Exception):  # a user env's close must not lose the batch
        env.close()


def _tick_loop(engine, episodes, renderer, limits, seed, ids, overlap, on_tick, context, report) -> None:
    """Generate for the ready episodes, step their environments (one daemon thread per step), repeat; without
    `overlap` a tick waits for every step it started (the reproducible barrier); a step past ``env_timeout_s`` is
    abandoned and its episode cut."""
    eos, ends = ids
    pending: dict[cf.Future, tuple[Episode, float]] = {}
    order = {id(ep): i for i, ep in enumerate(episodes)}  # an episode's row: ticks keep the rows' order
    ready = list(episodes)
    tick = 0
    limit = limits.env_timeout_s
    while ready or pending:
        if ready and (overlap or not pending):
            if on_tick is not None:
                on_tick(tick)
            finished = _generate_turn(engine, ready, limits, _mix(seed, 1, tick), ends, eos, context)
            tick += 1
            ready = []
            for ep, text in finished:
                if not ep.done:
                    pending[_start_step(ep.env, text)] = (ep, time.monotonic())
        if not pending:
            continue
        wait = max(0.0, min(t0 for _, t0 in pending.values()) + limit - time.monotonic())  # the oldest step's limit
        done, _ = cf.wait(pending, timeout=wait, return_when=cf.FIRST_COMPLETED if overlap else cf.ALL_COMPLETED)
        now = time.monotonic()
        late = {f for f, (_, t0) in pending.items() if f not in done and now - t0 >= limit}
        for fut in sorted(done | late, key=lambda f: order[id(pending[f][0])]):
            ep, _t0 = pending.pop(fut)
            if fut in late:
                _abandon(ep, limit, report)
            elif _after_step(ep, fut.result(), renderer, limits, report, context):
                ready.append(ep)
        ready.sort(key=lambda ep: order[id(ep)])


def _start_step(env: Environment, text: str) -> cf.Future:
    """``env.step(text)`` in a daemon thread (a hung step never keeps the process alive); its future holds the
    `Step` or the exception it raised."""
    fut: cf.Future = cf.Future()

    def work() -> None:
        try:
            result: Step | BaseException = env.step(text)
        except Exception as exc:  # a user environment's bug ends its episode, never the run
            result = exc
        fut.set_result(result)

    threading.Thread(target=work, daemon=True, name="p3o-env-step").start()
    return fut


def _abandon(ep: Episode, limit: float, report: Callable[[str, str], None]) -> None:
    """Cut an episode whose environment step overran ``env_timeout_s`` (scored 0, counted)."""
    ep.add("env_timeouts", 1)
    ep.stop_reason, ep.reward, ep.abandoned = "env_timeout", 0.0, True
    report(
        "env_timeout",
        f"environment {type(ep.env).__name__}.step ran past agent.env_timeout_s = {limit:g}s: the episode is cut and "
        "scores 0, counted as episode/env_timeouts",
    )


def _mix(*ints: int) -> int:
    """A 62-bit seed from integers (blake2b of their decimal forms): tick and episode seeds that never overflow."""
    digest = hashlib.blake2b(",".join(str(int(i)) for i in ints).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 2


def _budget(ep: Episode, limits: EnvLimits, context: int | None) -> tuple[int, str]:
    """(tokens this episode's next turn may sample, the limit that binds: "length" or "context")."""
    budget, reason = min(limits.max_turn_tokens, limits.max_total_tokens - len(ep.ids)), "length"
    if context is not None and context - len(ep.prompt) - len(ep.ids) < budget:
        budget, reason = context - len(ep.prompt) - len(ep.ids), "context"
    return budget, reason


def _generate_turn(engine, ready: list[Episode], limits: EnvLimits, seed: int, ends, eos, context: int | None):
    """One engine call for every ready episode; appends each turn; returns (episode, the turn's text for its
    environment: its ids decoded, special tokens kept, without the EOS that ended it)."""
    ready = list(ready)
    budgets = [_budget(ep, limits, context) for ep in ready]
    for ep, (budget, reason) in zip(ready, budgets):
        if budget < 1:  # no room for one more token: the context binds (the token budget never leaves 0)
            ep.stop_reason = reason
    live = [(ep, b) for ep, (b, _) in zip(ready, budgets) if not ep.done]
    if not live:
        return []
    kw = {"seed": seed}
    if _takes_max_new_tokens(type(engine)):
        kw["max_new_tokens"] = max(b for _, b in live)
    ro = engine.generate([ep.prompt + ep.ids for ep, _ in live], 1, **kw)
    tok = getattr(engine, "tokenizer", None)
    # one host copy of the call's tensors (and the kept sets' row offsets), not one per episode
    masks, resp, logps, versions = ro.mask.cpu(), ro.response_ids.cpu(), ro.rollout_logp.cpu(), ro.policy_version.cpu()
    kept = _kept_source(ro.sampling_mask)
    out = []
    for i, (ep, budget) in enumerate(live):
        valid = masks[i]
        ids = resp[i][valid].tolist()
        k, stopped = _cut_at_stop(ids, ends)
        if k > budget:  # the engine sampled past this episode's budget: those tokens were never its own
            k, stopped = budget, False
        lps = logps[i][valid].tolist()[:k]
        vers = versions[i][valid].tolist()[:k]
        ep.append(ids[:k], True, lps, vers, _kept_sets(kept, i, valid, k))
        ep.turns += 1
        ids = ids[:k]
        ep.ended_with_eos = bool(ids) and ids[-1] in eos
        if not stopped:
            ep.stop_reason = _budget_reason(ep, limits, context)
        said = ids[:-1] if ep.ended_with_eos else ids  # the EOS ends the turn; it is not part of what was said
        out.append((ep, tok.decode(said, skip_special_tokens=False) if tok is not None else ""))
    return out


def _budget_reason(ep: Episode, limits: EnvLimits, context: int | None) -> str:
    """Why a turn that found no stop ended: the episode's token budget, the model's context, or the turn's own."""
    if len(ep.ids) >= limits.max_total_tokens:
        return "length"
    if context is not None and len(ep.prompt) + len(ep.ids) >= context:
        return "context"
    return "turn_length"


def _kept_source(mask: SamplingMask | None) -> tuple[Tensor, Tensor, list[int]] | None:
    """An engine call's kept sets on the host: (counts (N, T), ids, each row's first index into ids), or None."""
    if mask is None:
        return None
    counts = mask.counts.cpu().long()
    totals = counts.sum(-1)
    return counts, mask.ids.cpu(), (totals.cumsum(0) - totals).tolist()


def _kept_sets(
    src: tuple[Tensor, Tensor, list[int]] | None, row: int, valid: Tensor, k: int
) -> tuple[list[int], Tensor] | None:
    """(per-token kept-set sizes, their ids) of the first `k` valid tokens of `row`, or None (nothing recorded)."""
    if src is None:
        return None
    all_counts, all_ids, starts = src
    counts = all_counts[row]
    row_ids = all_ids[starts[row] : starts[row] + int(counts.sum())]
    owner = torch.arange(counts.numel()).repeat_interleave(counts)  # the position each kept id belongs to
    positions = valid.nonzero().flatten()[:k]
    take = torch.isin(owner, positions)
    return counts[positions].tolist(), row_ids[take].to(torch.int32)


@functools.cache
def _takes_max_new_tokens(engine_cls: type) -> bool:
    """Whether an engine class's ``generate`` takes ``max_new_tokens`` (read once per class)."""
    try:
        return "max_new_tokens" in inspect.signature(engine_cls.generate).parameters
    except (TypeError, ValueError, AttributeError):
        return False


def _after_step(ep: Episode, result: Step | BaseException, renderer, limits: EnvLimits, report, context) -> bool:
    """Apply the environment's answer; True when the episode goes on (its observation appended)."""
    if isinstance(result, BaseException):
        ep.add("env_errors", 1)
        ep.stop_reason = "env_error"
        ep.reward = 0.0
        report(
            "env_error",
            f"environment {type(ep.env).__name__}.step raised {_short_traceback(result)}: the episode is cut and "
            "scores 0, counted as episode/env_errors",
        )
        return False
    ep.reward += float(result.reward)
    for key in result.info:
        ep.add(key, info_number(result.info, key))
    if result.done:
        ep.stop_reason = "done"
        return False
    if ep.turns >= limits.max_turns:
        ep.stop_reason = "max_turns"
        return False
    if hasattr(renderer, "observation"):  # p3o.envs.render.Renderer: ids and how many tokens were cut
        rendered = renderer.observation(result.observation, ep.ended_with_eos)
        obs, cut = list(rendered.ids), bool(rendered.cut)
    else:
        obs, cut = list(renderer.observation_ids(result.observation, ep.ended_with_eos)), False
    if len(obs) > limits.max_obs_tokens:  # a renderer that does not cut: keep the limit anyway
        obs, cut = obs[: limits.max_obs_tokens], True
    if len(ep.ids) + len(obs) >= limits.max_total_tokens:
        ep.stop_reason = "length"  # no room for the observation and a model token: the trailing observation is dropped
        return False
    if context is not None and len(ep.prompt) + len(ep.ids) + len(obs) >= context:
        ep.stop_reason = "context"  # the same within the model's context
        return False
    ep.add("obs_tokens", len(obs))
    ep.add("obs_cut", float(bool(cut)))
    ep.append(obs, False, [], [], None)
    return True


def _rows(episodes: list[Episode], engine) -> Rollouts:
    """The episodes as one `Rollouts` (see `run_episodes`' Returns)."""
    pad = int(getattr(engine, "pad_token_id", 0) or 0)
    own = sorted({k for ep in episodes for k in ep.stats} - set(EPISODE_STATS))  # the environments' own counters
    extras: dict[str, list[float]] = {k: [] for k in (*EPISODE_STATS, *own)}
    for ep in episodes:
        model_versions = {v for v, m in zip(ep.version, ep.model) if m}
        row = {
            "turns": float(ep.turns),
            "obs_tokens": ep.stats.get("obs_tokens", 0.0),
            "obs_cut": ep.stats.get("obs_cut", 0.0),
            "model_tokens": float(sum(ep.model)),
            "versions": float(len(model_versions)),
            "cut": float(ep.stop_reason not in ("done",)),
            **{f"stop_{r}": float(ep.stop_reason == r) for r in STOP_REASONS},
        }
        for key in extras:
            extras[key].append(row[key] if key in row else ep.stats.get(key, 0.0))
    tok = getattr(engine, "tokenizer", None)
    rollouts = episode_rollouts(
        [ep.prompt for ep in episodes],
        [(ep.ids, ep.model, ep.logp, ep.version) for ep in episodes],
        pad,
        groups=[ep.group for ep in episodes],
        rewards=[ep.reward for ep in episodes],
        truncated=[ep.stop_reason != "done" for ep in episodes],
        answers=[ep.problem.answer for ep in episodes],
        extras=extras,
        texts=[tok.decode(ep.ids, skip_special_tokens=False) for ep in episodes] if tok is not None else (),
    )
    rollouts.sampling_mask = _sampling_mask(episodes, rollouts.response_ids.shape[1])
    return rollouts.to(getattr(engine, "device", torch.device("cpu")))


def _sampling_mask(episodes: list[Episode], t: int) -> SamplingMask | None:
    """The episodes' kept sets as one (N, T) `SamplingMask` (observations: none), or None when no turn recorded one."""
    if not any(ep.kept_ids for ep in episodes):
        return None
    counts = torch.zeros((len(episodes), t), dtype=torch.int32)
    for i, ep in enumerate(episodes):
        if ep.kept_counts:
            counts[i, : len(ep.kept_counts)] = torch.tensor(ep.kept_counts, dtype=torch.int32)
    ids = [x for ep in episodes for x in ep.kept_ids]
    return SamplingMask(counts, torch.cat(ids) if ids else torch.zeros(0, dtype=torch.int32))


class EpisodeEngine(ProblemEngine):
    """A `RolloutEngine` whose ``generate`` runs agent episodes on an inner engine: what the training loop, its
    sources, the held-out evaluation and the Ray rollout workers hold when ``agent.env`` is set, so every one of them
    runs episodes without knowing it (a prompt's id list names its problem).

    Weights, versions and in-flight updates are the inner engine's (``load_weights``, ``version``,
    ``on_decode_step`` pass through), so a push between two turns of one episode stamps the later turns with the new
    version.

        engine = EpisodeEngine(HFEngine(model, tok), lambda: make_env("calc"), problems_by_prompt, renderer=r,
                               limits=EnvLimits(), eos_ids=[tok.eos_token_id], stop_ids=r.stop_ids(("</calc>",)))
        rollouts = engine.generate(prompt_ids, n=4, seed=0)     # episodes; rewards filled by the environment
    """

    def __init__(
        self,
        engine: RolloutEngine,
        make_env: Callable[[], Environment],
        problems: dict[Any, Problem],
        *,
        renderer,
        limits: EnvLimits,
        eos_ids: Sequence[int],
        stop_ids: Sequence[int] = (),
        overlap: bool = False,
    ) -> None:
        self.inner = engine
        self.make_env, self.problems = make_env, problems
        self.renderer, self.limits, self.overlap = renderer, limits, overlap
        self.eos_ids, self.stop_ids = list(eos_ids), list(stop_ids)
        self._calls = 0
        self.report = Reporter()  # each environment error / timeout / context clamp said once per engine
        self.context = model_context(engine)

    # the inner engine's weights, version and in-flight hook
    @property
    def version(self) -> int:
        return self.inner.version

    @version.setter
    def version(self, value: int) -> None:
        self.inner.version = value

    @property
    def on_decode_step(self):
        return getattr(self.inner, "on_decode_step", None)

    @on_decode_step.setter
    def on_decode_step(self, hook) -> None:
        self.inner.on_decode_step = hook

    def load_weights(self, state_dict: dict[str, Tensor], version: int) -> None:
        self.inner.load_weights(state_dict, version)

    def __getattr__(self, name: str):
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def _episodes(self, prompt_ids: list[list[int]], problems: list[Problem], n: int, seed: int | None) -> Rollouts:
        """`n` episodes of every problem on the inner engine (`run_episodes`); ``agent.max_turn_tokens`` and
        ``agent.max_total_tokens`` bound them. ``seed`` None: one of its own per call."""
        if seed is None:
            seed = 1_000_000_007 + self._calls
        self._calls += 1
        longest = max((len(p) for p in prompt_ids), default=0)
        if self.context is not None and longest + self.limits.max_total_tokens > self.context:
            self.report(
                "context",
                f"agent.max_total_tokens = {self.limits.max_total_tokens} after a {longest}-token prompt passes the "
                f"model's context of {self.context} tokens: episodes are clamped to "
                f"{max(0, self.context - longest)} tokens there (cut, counted as episode/stop_context)",
            )
        return run_episodes(
            self.inner,
            self.make_env,
            problems,
            n,
            renderer=self.renderer,
            limits=self.limits,
            seed=int(seed),
            eos_ids=self.eos_ids,
            stop_ids=self.stop_ids,
            overlap=self.overlap,
            context=self.context,
            report=self.report,
        )


def model_context(engine: Any) -> int | None:
    """The context in tokens of an engine's model (prompt and response together), or None when it says none: the
    engine's ``max_context`` if it has one, vLLM's ``max_model_len``, an HF model's ``max_position_embeddings``."""
    own = getattr(engine, "max_context", None)
    if isinstance(own, int):
        return own
    with contextlib.suppress(Exception):
        return int(engine.llm.llm_engine.model_config.max_model_len)
    config = getattr(getattr(engine, "model", None), "config", None)
    value = getattr(config, "max_position_embeddings", None)
    return int(value) if isinstance(value, int) and value > 0 else None
