"""Issue 51: episodes whose environment raises, hangs or reports its own counters, episodes that reach the model's
context, the stop reasons, the engine's kept sets on episode rows, and the turn text an environment reads."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import ClassVar

import torch
from episode_fakes import STOPS, FixedEngine, IdsRenderer, ScriptedEnv
from tiny_lm import make_tiny_lm

from p3o.envs.base import EnvLimits, Step
from p3o.envs.runner import STOP_KEYS, EpisodeEngine, run_episodes
from p3o.rollout import HFEngine
from p3o.tasks.base import Problem
from p3o.train.sources import episode_metrics

PROBLEMS = [Problem(prompt="abc", answer="1"), Problem(prompt="de", answer="2"), Problem(prompt="fgh", answer="3")]


class Troubled(ScriptedEnv):
    """Scripted episodes that report their own counter (``guesses``) and fail on problem "2": `mode` "raise" raises
    in step, "hang" sleeps far past any limit."""

    mode = "raise"

    def reset(self, problem: Problem, seed: int) -> list[dict[str, str]]:
        self.answer = problem.answer
        return super().reset(problem, seed)

    def step(self, turn: str) -> Step:
        if self.answer == "2":
            if self.mode == "hang":
                time.sleep(600)
            raise ValueError("no such problem")
        step = super().step(turn)
        step.info["guesses"] = 2.0
        return step


class Hangs(Troubled):
    mode = "hang"


def _run(env, engine=None, limits=None, **kw):
    engine = engine or HFEngine(make_tiny_lm(), None, max_new_tokens=6, seed=0)
    limits = limits or EnvLimits(max_turns=3, max_turn_tokens=6, max_total_tokens=64, max_obs_tokens=8)
    return run_episodes(
        engine, env, PROBLEMS, 2, renderer=IdsRenderer(), limits=limits, seed=3, eos_ids=[2], stop_ids=STOPS, **kw
    )


def _stop_reasons(ro) -> list[str]:
    keys = torch.stack([ro.extras[k] for k in STOP_KEYS], -1)
    assert (keys.sum(-1) == 1).all()  # every episode ended for exactly one reason
    return [STOP_KEYS[int(i)].removeprefix("stop_") for i in keys.argmax(-1)]


def test_environment_errors_and_own_counters_are_counted_and_said_once(capsys) -> None:
    """Item 2: a step that raises cuts its episode (env_errors 1, stop_env_error, reward 0), says its first traceback
    once; the environment's own counter is summed per episode and reaches the batch's metrics."""
    ro = _run(Troubled)
    assert ro.extras["env_errors"].tolist() == [0, 0, 1, 1, 0, 0]
    assert _stop_reasons(ro)[2:4] == ["env_error", "env_error"] and ro.rewards[2:4].tolist() == [0.0, 0.0]
    assert ro.extras["guesses"][2:4].tolist() == [0.0, 0.0] and (ro.extras["guesses"][[0, 1, 4, 5]] >= 2).all()
    err = capsys.readouterr().err
    assert err.count("Troubled.step raised ValueError: no such problem (at test_episode_faults.py:") == 1
    metrics = episode_metrics(ro)
    assert abs(metrics["episode/env_errors"] - 2 / 6) < 1e-6 and metrics["episode/guesses"] > 0
    assert metrics["episode/stop_env_error"] == 2.0 and sum(metrics[f"episode/{k}"] for k in STOP_KEYS) == 6


def test_a_hung_environment_step_is_cut_at_env_timeout_and_the_batch_goes_on() -> None:
    """Item 3: a step that never returns cuts its episode at limits.env_timeout_s (env_timeouts, stop_env_timeout);
    the other episodes finish."""
    limits = EnvLimits(max_turns=3, max_turn_tokens=6, max_total_tokens=64, max_obs_tokens=8, env_timeout_s=0.5)
    t0 = time.monotonic()
    ro = _run(Hangs, limits=limits)
    assert time.monotonic() - t0 < 10
    assert ro.extras["env_timeouts"].tolist() == [0, 0, 1, 1, 0, 0]
    assert _stop_reasons(ro)[2:4] == ["env_timeout"] * 2 and ro.rewards[2:4].tolist() == [0.0, 0.0]
    assert ro.extras["turns"][[0, 1, 4, 5]].min() >= 1 and ro.rewards[[0, 1, 4, 5]].sum() > 0


_EXIT_SCRIPT = """
import sys, time
sys.path[:0] = {paths!r}
from episode_fakes import STOPS, FixedEngine, IdsRenderer
from test_episode_faults import PROBLEMS, Hangs
from p3o.envs.base import EnvLimits
from p3o.envs.runner import run_episodes
limits = EnvLimits(max_turns=2, max_turn_tokens=4, max_total_tokens=32, env_timeout_s=0.3)
ro = run_episodes(FixedEngine([5, 10]), Hangs, PROBLEMS, 2, renderer=IdsRenderer(), limits=limits, seed=0,
                  eos_ids=[2], stop_ids=STOPS)
print("done", int(ro.extras["env_timeouts"].sum()), flush=True)
"""


def test_a_run_with_a_hung_environment_step_exits_normally() -> None:
    """Item 3: the hung step's thread does not keep the process alive (daemon threads, no join at exit)."""
    here = str(Path(__file__).parent)
    script = textwrap.dedent(_EXIT_SCRIPT.format(paths=[here, str(Path(here).parent)]))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "done 2", out.stderr[-2000:]


def test_stop_reasons_tell_the_limits_apart() -> None:
    """Item 8: a turn cut by max_turn_tokens, the episode's token budget and max_turns are three reasons."""
    never_stop = EnvLimits(max_turns=3, max_turn_tokens=4, max_total_tokens=64, max_obs_tokens=8)
    engine = HFEngine(make_tiny_lm(), None, max_new_tokens=4, seed=0)
    ro = run_episodes(engine, ScriptedEnv, PROBLEMS, 2, renderer=IdsRenderer(), limits=never_stop, seed=3, eos_ids=[])
    assert set(_stop_reasons(ro)) == {"turn_length"}  # no stop id at all: every first turn runs out of tokens
    budget = EnvLimits(max_turns=3, max_turn_tokens=4, max_total_tokens=3, max_obs_tokens=8)
    ro = run_episodes(engine, ScriptedEnv, PROBLEMS, 2, renderer=IdsRenderer(), limits=budget, seed=3, eos_ids=[])
    assert set(_stop_reasons(ro)) == {"length"}
    ro = _run(ScriptedEnv, limits=EnvLimits(max_turns=1, max_turn_tokens=6, max_total_tokens=64))
    assert set(_stop_reasons(ro)) <= {"max_turns", "turn_length"} and "max_turns" in _stop_reasons(ro)


def test_an_episode_is_cut_at_the_model_context_and_the_clamp_is_said_once(capsys) -> None:
    """Item 4: prompt + history + the next turn never pass the model's context (stop_context); EpisodeEngine says
    once that agent.max_total_tokens does not fit."""
    inner = HFEngine(make_tiny_lm(), None, max_new_tokens=6, seed=0)
    inner.model.config.max_position_embeddings = 12  # the model's context: 12 tokens
    renderer = IdsRenderer()
    problems = {tuple(renderer.prompt_ids([{"content": p.prompt}])): p for p in PROBLEMS}
    limits = EnvLimits(max_turns=4, max_turn_tokens=6, max_total_tokens=64, max_obs_tokens=8)
    eng = EpisodeEngine(inner, ScriptedEnv, problems, renderer=renderer, limits=limits, eos_ids=[2], stop_ids=STOPS)
    assert eng.context == 12
    prompts = [list(k) for k in problems]
    for _ in range(2):
        ro = eng.generate(prompts, 2, seed=0, answers=[p.answer for p in PROBLEMS])
    lengths = ro.prompt_mask.sum(-1) + ro.attn.sum(-1)
    assert (lengths <= 12).all(), lengths
    assert "context" in _stop_reasons(ro)
    assert capsys.readouterr().err.count("passes the model's context of 12 tokens") == 1


def test_episode_rows_carry_the_engines_kept_sets() -> None:
    """Item 9: with top-p < 1 every model token of an episode row has the set the engine sampled it from (the same
    sets the engine recorded for that turn); observations have none."""
    model = make_tiny_lm()
    engine = HFEngine(model, None, max_new_tokens=6, seed=0, top_p=0.8)
    turns: list[tuple[list[int], torch.Tensor]] = []  # each turn's (ids, dense kept sets) as the engine recorded
    inner_generate = engine.generate

    def recording(prompt_ids, n, **kw):
        out = inner_generate(prompt_ids, n, **kw)
        dense = out.sampling_mask.dense(64)
        for i in range(len(out)):
            turns.append((out.response_ids[i][out.mask[i]].tolist(), dense[i][out.mask[i]]))
        return out

    engine.generate = recording
    ro = _run(ScriptedEnv, engine=engine)
    assert ro.sampling_mask is not None
    counts = ro.sampling_mask.counts
    assert (counts[ro.mask] > 0).all() and (counts[~ro.mask] == 0).all()
    kept = ro.sampling_mask.dense(64)
    for i in range(len(ro)):
        row, is_model = ro.response_ids[i].tolist(), ro.mask[i].tolist()
        t = 0
        while t < len(row):
            if not is_model[t]:
                t += 1
                continue
            end = t
            while end < len(row) and is_model[end]:
                end += 1
            match = [d for ids, d in turns if ids[: end - t] == row[t:end] and len(d) >= end - t]
            assert any(torch.equal(d[: end - t], kept[i, t:end]) for d in match), (i, t)
            t = end
    assert kept[ro.mask].gather(-1, ro.response_ids[ro.mask][:, None]).all()  # each token is in its own set


class _Tok:
    """Decodes ids as their numbers; 2 is EOS."""

    eos_token_id = 2

    def decode(self, ids, skip_special_tokens=False):
        return " ".join("<eos>" if i == 2 else str(i) for i in ids)


class Reads(ScriptedEnv):
    seen: ClassVar[list[str]] = []

    def step(self, turn: str) -> Step:
        Reads.seen.append(turn)
        return super().step(turn)


def test_an_environment_reads_its_turn_without_the_eos_that_ended_it() -> None:
    """Item 1: a turn that ends at EOS reaches the environment without it (``5``, not ``5 <eos>``); a stop string
    that ended a turn stays (``5 10``); the row keeps every sampled id, the EOS included."""
    for turn, text in (([5, 2], "5"), ([5, 10], "5 10")):
        engine = FixedEngine(turn)
        engine.tokenizer = _Tok()
        Reads.seen = []
        ro = _run(Reads, engine=engine)
        assert Reads.seen and set(Reads.seen) == {text}
        assert ro.response_ids[0][ro.mask[0]].tolist()[:2] == turn


def test_the_overlong_penalty_of_an_episode_measures_its_own_budget() -> None:
    """Item 6: in agent mode the penalty compares the row (turns and observations: 12 tokens here) with
    agent.max_total_tokens, not the model tokens of all turns (6) with rollout.max_new_tokens (bounding nothing)."""
    from types import SimpleNamespace

    from p3o.config import AdvantageConfig, LoopConfig, RolloutConfig
    from p3o.train.sources import Producer, PromptStream

    renderer = IdsRenderer()
    problems = {tuple(renderer.prompt_ids([{"content": p.prompt}])): p for p in PROBLEMS}
    comps = SimpleNamespace(
        prompts=[list(k) for k in problems],
        answers=[p.answer for p in PROBLEMS],
        reward_fn=lambda r: r.rewards.clone(),
        pad_id=0,
    )
    ro = RolloutConfig(prompts_per_step=3, group_size=2, max_new_tokens=4)
    loop = LoopConfig(overlong_penalty=True, overlong_buffer=2)
    for total, reward in ((64, 1.0), (13, 0.5)):  # 12 tokens: far below 64; past 13 − 2 = 11 by 1 of a 2 buffer: −0.5
        limits = EnvLimits(max_turns=3, max_turn_tokens=4, max_total_tokens=total, max_obs_tokens=8)
        engine = EpisodeEngine(
            FixedEngine([5, 10]), ScriptedEnv, problems, renderer=renderer, limits=limits, eos_ids=[2], stop_ids=STOPS
        )
        produce = Producer(ro, loop, AdvantageConfig(), 0, comps, PromptStream(3, 3, seed=0), rank=0)
        batch, _ = produce.generate(0, 0, engine)
        assert batch.attn.sum(-1).tolist() == [12] * 6 and batch.mask.sum(-1).tolist() == [6] * 6
        assert batch.rewards.tolist() == [reward] * 6  # before: 6 model tokens > rollout.max_new_tokens 4, −1
