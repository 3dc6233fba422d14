"""What the two episode engines do alike: `p3o.envs.runner.EpisodeEngine` (agent episodes on an inner engine) and
`p3o.envs.harness.HarnessEngine` (harness episodes through the endpoint) are `RolloutEngine`s whose prompts name
problems and whose rows are episodes.

`ProblemEngine.generate` takes the `RolloutEngine.generate` call and looks up the problem each prompt names; the
subclass runs the episodes (`ProblemEngine._episodes`). `episode_rollouts` lays the rows of a batch of episodes out
as one `Rollouts`.

    class MyEngine(ProblemEngine):
        def _episodes(self, prompt_ids, problems, n, seed):      # problems[i]: the problem prompt i names
            ...                                                  # n episodes of each, as episode_rollouts(...)
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import Any

import torch

from p3o.errors import P3OError
from p3o.rollout.base import GenerateCall, left_pad, right_pad
from p3o.tasks.base import Problem
from p3o.types import Rollouts

__all__ = ["ProblemEngine", "episode_rollouts"]


class ProblemEngine(GenerateCall):
    """A `RolloutEngine` whose ``generate`` runs `n` episodes of the problem each prompt names (its id list, as the
    rollout side encoded it) and returns their rows, rows of prompt i's problem together.

    A subclass sets ``problems``: (prompt ids, answer) and prompt ids alone, each a tuple of ints, to problems (two
    problems may share a prompt: guess-a-number), and implements `_episodes`.
    """

    problems: dict[Any, Problem]

    def _generate(
        self, prompt_ids: list[list[int]], n: int, seed: int | None, answers: list[str] | None, limit: int | None
    ) -> Rollouts:
        """`n` episodes of the problem each prompt names (`_episodes`); ``limit`` (the call's `max_new_tokens`) is
        ignored (an episode's own limits bound its turns). A prompt (and answer) that names no problem: one-line
        P3OError."""
        del limit
        return self._episodes(prompt_ids, self.problems_of(prompt_ids, answers), n, seed)

    def problems_of(self, prompt_ids: Sequence[Sequence[int]], answers: Sequence[str] | None) -> list[Problem]:
        """The problem each prompt names: ``problems[(ids, answer)]`` where there is one, else ``problems[ids]``."""
        keys = [tuple(int(t) for t in p) for p in prompt_ids]
        try:
            return [
                self.problems[(k, a)] if (k, a) in self.problems else self.problems[k]
                for k, a in zip(keys, answers if answers is not None else [None] * len(keys))
            ]
        except KeyError:
            name = type(self).__name__
            raise P3OError(f"{name}.generate: a prompt that names no problem of this run's task") from None

    @abstractmethod
    def _episodes(self, prompt_ids: list[list[int]], problems: list[Problem], n: int, seed: int | None) -> Rollouts:
        """`n` episodes of every ``problems[i]`` (prompt i's), problem-major: the batch's `Rollouts`."""


def episode_rollouts(
    prompts: Sequence[Sequence[int]],
    rows: Sequence[tuple[Sequence[int], Sequence[bool], Sequence[float], Sequence[int]]],
    pad: int,
    *,
    groups: Sequence[int],
    rewards: Sequence[float],
    truncated: Sequence[bool],
    answers: Sequence[str],
    extras: dict[str, list[float]],
    texts: Sequence[str] = (),
) -> Rollouts:
    """The rows of a batch of episodes as one `Rollouts` (N rows, on the CPU).

    ``prompts[i]``: row i's prompt ids (left-padded to (N, P)); ``rows[i]``: its response (ids, loss mask, log-probs,
    versions), right-padded to (N, T) by `p3o.rollout.base.right_pad` (``attn`` True on its real tokens); per row:
    ``groups`` (group ids), ``rewards``, ``truncated``, ``answers``, ``texts`` (empty: none) and ``extras`` (name ->
    N floats, float32 tensors).
    """
    p_ids, p_mask = left_pad(prompts, pad)
    ids, mask, attn, logp, version = right_pad(rows, pad)
    return Rollouts(
        prompt_ids=p_ids,
        prompt_mask=p_mask,
        response_ids=ids,
        mask=mask,
        rollout_logp=logp,
        policy_version=version,
        group_ids=torch.tensor(list(groups), dtype=torch.long),
        rewards=torch.tensor(list(rewards), dtype=torch.float32),
        truncated=torch.tensor(list(truncated), dtype=torch.bool),
        texts=list(texts),
        answers=list(answers),
        attn=attn,
        extras={k: torch.tensor(v, dtype=torch.float32) for k, v in extras.items()},
    )
