"""Fakes shared by the episode tests (tests/envs) and the vLLM checks (tests/rollout/vllm_checks.py, run in
.venv-vllm): a scripted environment, a renderer of fixed ids, an engine that records what it sampled, and the
token-in / token-out check of an episode row."""

from __future__ import annotations

from p3o.envs.base import EnvLimits, Step
from p3o.envs.runner import run_episodes
from p3o.tasks.base import Problem

OBS = [7, 8, 9]  # the ids the scripted environment's observation renders to
STOPS = list(range(10, 40))  # a turn ends at any of these (the random model hits one within a few tokens)


class ScriptedEnv:
    """Three model turns, an observation after each of the first two; reward = 1 on the last step."""

    stop_strings = ()

    def __init__(self) -> None:
        self.turns = 0

    def reset(self, problem: Problem, seed: int) -> list[dict[str, str]]:
        return [{"role": "user", "content": problem.prompt}]

    def step(self, turn: str) -> Step:
        self.turns += 1
        done = self.turns >= 3
        obs = [] if done else [{"role": "tool", "content": "ok"}]
        return Step(observation=obs, reward=1.0 if done else 0.0, done=done, info={"tool_calls": 1.0})

    def close(self) -> None:
        pass


class IdsRenderer:
    """Prompts: their text's characters as ids 40..63; every observation: `OBS`."""

    def prompt_ids(self, messages):
        return [40 + (ord(c) % 24) for c in messages[0]["content"]]

    def observation_ids(self, messages, turn_ended_with_eos):
        return list(OBS)


class FixedEngine:
    """A rollout engine without a model: every turn is `turn` (ids), log-prob −1 each, version 0 (no transformers to
    import: for tests that start a process of their own)."""

    def __init__(self, turn: list[int]) -> None:
        self.turn, self.version = list(turn), 0

    def generate(self, prompt_ids, n, *, seed=None, answers=None, max_new_tokens=None):
        import torch

        from p3o.types import Rollouts

        rows = len(prompt_ids) * n
        t = len(self.turn)
        return Rollouts(
            prompt_ids=torch.zeros((rows, 1), dtype=torch.long),
            prompt_mask=torch.ones((rows, 1), dtype=torch.bool),
            response_ids=torch.tensor([self.turn] * rows, dtype=torch.long),
            mask=torch.ones((rows, t), dtype=torch.bool),
            rollout_logp=torch.full((rows, t), -1.0),
            policy_version=torch.zeros((rows, t), dtype=torch.long),
            group_ids=torch.arange(rows),
            rewards=torch.zeros(rows),
            truncated=torch.zeros(rows, dtype=torch.bool),
        )


class Recording:
    """A rollout engine that remembers what each generate call sampled (its prompt and ids, per row)."""

    def __init__(self, engine) -> None:
        self.engine, self.calls = engine, []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def generate(self, prompt_ids, n, *, seed=None, answers=None, max_new_tokens=None):
        ro = self.engine.generate(prompt_ids, n, seed=seed, answers=answers, max_new_tokens=max_new_tokens)
        self.calls.append([(list(p), ro.response_ids[i][ro.mask[i]].tolist()) for i, p in enumerate(prompt_ids)])
        return ro


def check_token_in_token_out(ro, recorded_calls) -> None:
    """Every row is [turn | OBS | turn | …]: each model segment is exactly what one engine call sampled after that
    very history, each observation exactly the environment's ids after a finished turn; mask = model tokens, attn =
    every token, observations with recorded log-prob 0 and version −1."""
    calls = [entry for call in recorded_calls for entry in call]
    for i in range(len(ro)):
        prompt = ro.prompt_ids[i][ro.prompt_mask[i]].tolist()
        row = ro.response_ids[i][ro.attn[i]].tolist()
        is_model = ro.mask[i][ro.attn[i]].tolist()
        assert len(ro.attn[i].nonzero()) == len(row) and ro.attn[i][: len(row)].all()  # no holes: one sequence
        j, turns = 0, 0
        while j < len(row):
            k = j
            while k < len(row) and is_model[k] == is_model[j]:
                k += 1
            seg = row[j:k]
            if is_model[j]:  # a model turn: exactly what one engine call sampled after this very history
                turns += 1
                assert any(p == prompt + row[:j] and out[: len(seg)] == seg for p, out in calls), (i, j)
            else:  # an observation: exactly the environment's ids, appended after a finished turn
                assert seg == OBS, seg
                assert row[j - 1] in STOPS or row[j - 1] == 2
            j = k
        assert turns == int(ro.extras["turns"][i])
        obs = ro.attn[i] & ~ro.mask[i]
        assert (ro.rollout_logp[i][obs] == 0).all() and (ro.policy_version[i][obs] == -1).all()
        assert int(obs.sum()) == int(ro.extras["obs_tokens"][i])


def scripted_episodes(engine, on_tick=None, n=2, max_turn_tokens=6, prompts=("abc", "de")):
    """`n` scripted episodes of each of `prompts` (one id per character) on `engine` (seed 3; `on_tick` e.g. pushes
    weights)."""
    problems = [Problem(prompt=p, answer=str(i + 1)) for i, p in enumerate(prompts)]
    limits = EnvLimits(max_turns=3, max_turn_tokens=max_turn_tokens, max_total_tokens=64, max_obs_tokens=8)
    return run_episodes(
        engine,
        ScriptedEnv,
        problems,
        n,
        renderer=IdsRenderer(),
        limits=limits,
        seed=3,
        eos_ids=[2],
        stop_ids=STOPS,
        on_tick=on_tick,
    )
