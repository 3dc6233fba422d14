"""What the episode engines share (`p3o.envs.engine`): the problem each prompt names, its one-line error, and the
rows of a batch of episodes as one `Rollouts`."""

from __future__ import annotations

import pytest
import torch

from p3o.envs.engine import ProblemEngine, episode_rollouts
from p3o.errors import P3OError
from p3o.rollout.base import RolloutEngine
from p3o.tasks.base import Problem
from p3o.types import Rollouts


class Echo(ProblemEngine):
    """Records what `_episodes` is handed; one empty row per episode."""

    version = 0

    def __init__(self, problems: dict) -> None:
        self.problems = problems
        self.calls: list[tuple] = []

    def _episodes(self, prompt_ids, problems, n, seed) -> Rollouts:
        self.calls.append((prompt_ids, problems, n, seed))
        rows = [([], [], [], []) for _ in problems for _ in range(n)]
        return episode_rollouts(
            [p for p in prompt_ids for _ in range(n)],
            rows,
            0,
            groups=[b for b in range(len(problems)) for _ in range(n)],
            rewards=[0.0] * len(rows),
            truncated=[False] * len(rows),
            answers=[p.answer for p in problems for _ in range(n)],
            extras={},
        )

    def load_weights(self, state_dict, version) -> None:
        self.version = version


def test_generate_looks_up_each_prompts_problem_by_answer_first() -> None:
    """(ids, answer) names a problem where the table has it, the ids alone otherwise; the subclass gets the problems,
    n and seed; max_new_tokens is dropped; a ProblemEngine is a RolloutEngine."""
    a, b, c = Problem("a", "1"), Problem("b", "2"), Problem("c", "3")
    engine = Echo({(1, 2): a, ((1, 2), "2"): b, (5,): c})
    ro = engine.generate([[1, 2], [1, 2], [5]], 2, seed=7, answers=["1", "2", "9"], max_new_tokens=3)
    assert isinstance(engine, RolloutEngine)
    assert engine.calls[0][1:] == ([a, b, c], 2, 7)
    assert len(ro) == 6 and ro.answers == ["1", "1", "2", "2", "3", "3"]
    assert engine.problems_of([[5]], None) == [c]


def test_a_prompt_that_names_no_problem_is_one_line_naming_the_engine() -> None:
    engine = Echo({(1,): Problem("a", "1")})
    with pytest.raises(P3OError, match=r"^Echo\.generate: a prompt that names no problem of this run's task$"):
        engine.generate([[1], [2]], 1)
    assert engine.calls == []


def test_episode_rollouts_pads_prompts_left_and_responses_right() -> None:
    """Prompts left-padded, responses right-padded with the pad id; attn on real tokens, the loss mask as given;
    per-row groups, rewards, truncation, answers, texts and float32 extras."""
    ro = episode_rollouts(
        [[3], [4, 5]],
        [([7, 8, 9], [True, False, True], [-0.5, 0.0, -1.0], [2, -1, 3]), ([6], [True], [-0.25], [1])],
        0,
        groups=[1, 1],
        rewards=[1.0, 0.0],
        truncated=[False, True],
        answers=["x", "y"],
        extras={"turns": [2.0, 1.0]},
        texts=["a", "b"],
    )
    assert ro.prompt_ids.tolist() == [[0, 3], [4, 5]] and ro.prompt_mask.tolist() == [[False, True], [True, True]]
    assert ro.response_ids.tolist() == [[7, 8, 9], [6, 0, 0]]
    assert ro.mask.tolist() == [[True, False, True], [True, False, False]]
    assert ro.attn.tolist() == [[True, True, True], [True, False, False]]
    assert ro.rollout_logp.tolist() == [[-0.5, 0.0, -1.0], [-0.25, 0.0, 0.0]]
    assert ro.policy_version.tolist() == [[2, -1, 3], [1, -1, -1]]
    assert ro.group_ids.tolist() == [1, 1] and ro.rewards.dtype == torch.float32
    assert ro.truncated.tolist() == [False, True] and ro.answers == ["x", "y"] and ro.texts == ["a", "b"]
    assert ro.extras["turns"].dtype == torch.float32 and ro.extras["turns"].tolist() == [2.0, 1.0]
