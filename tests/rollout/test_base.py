"""p3o.rollout.base.SamplingEngine: the `generate` both token samplers share, around a subclass's `_draw`."""

from __future__ import annotations

import threading

import pytest
import torch

from p3o.errors import ConfigError, P3OError
from p3o.rollout.base import Draws, RolloutEngine, SamplingEngine, right_pad
from p3o.rollout.settings import EngineSettings
from p3o.types import SamplingMask


class _Tok:
    def batch_decode(self, rows, skip_special_tokens=True):
        return [" ".join(map(str, r)) for r in rows]


class _Echo(SamplingEngine):
    """Row r of prompt p: the prompt's last id, then r + 1 copies of 7 (stop id 2 after them), capped at t_max."""

    def __init__(self, tokenizer=None):
        self.settings = EngineSettings(max_new_tokens=5)
        self.device = torch.device("cpu")
        self.pad_token_id = 0
        self.tokenizer = tokenizer
        self.version = 3
        self._lock = threading.RLock()
        self._group_offset = 0
        self.calls = []

    def _draw(self, prompt_ids, ids, pmask, n, seed, t_max):
        self.calls.append((ids.clone(), pmask.clone(), n, seed, t_max))
        rows = [[p[-1], *[7] * (r + 1), 2][:t_max] for p in prompt_ids for r in range(n)]
        width = max(len(r) for r in rows)
        tokens = torch.zeros((len(rows), width), dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.bool)
        for i, r in enumerate(rows):
            tokens[i, : len(r)] = torch.tensor(r)
            mask[i, : len(r)] = True
        truncated = torch.tensor([r[-1] != 2 for r in rows])
        versions = torch.full_like(tokens, self.version)  # the base class writes −1 outside the mask
        return Draws(tokens, -mask.float(), mask, versions, truncated, SamplingMask.empty(len(rows), width))

    def load_weights(self, state_dict, version):
        self.version = version


def test_generate_lays_the_draws_out_as_rollouts():
    engine = _Echo(_Tok())
    assert isinstance(engine, RolloutEngine)
    ro = engine.generate([[5, 6], [9]], 2, seed=11, answers=["a", "b"])
    ids, pmask, n, seed, t_max = engine.calls[0]
    assert ids.tolist() == [[5, 6], [0, 9]] and pmask.tolist() == [[True, True], [False, True]]
    assert (n, seed, t_max) == (2, 11, 5)
    assert ro.prompt_ids.tolist() == [[5, 6], [5, 6], [0, 9], [0, 9]]
    assert ro.response_ids[1].tolist() == [6, 7, 7, 2]
    assert ro.policy_version.tolist()[0] == [3, 3, 3, -1]  # -1 where the mask is False
    assert ro.group_ids.tolist() == [0, 0, 1, 1]
    assert ro.answers == ["a", "a", "b", "b"] and ro.texts[0] == "6 7 2"
    assert ro.rewards.tolist() == [0.0] * 4 and ro.truncated.tolist() == [False] * 4
    assert ro.sampling_mask is not None and ro.sampling_mask.counts.shape == (4, 4)
    again = engine.generate([[1]], 1, max_new_tokens=2)  # groups are numbered on across calls
    assert again.group_ids.tolist() == [2] and engine.calls[1][4] == 2
    assert again.truncated.tolist() == [True] and again.texts == ["1 7"]
    assert _Echo().generate([[1]], 1).texts == []  # no tokenizer, no texts


def test_generate_checks_the_call_before_drawing():
    engine = _Echo()
    with pytest.raises(P3OError, match="non-empty"):
        engine.generate([[1], []], 1)
    with pytest.raises(ConfigError, match=r"rollout\.group_size"):
        engine.generate([[1]], 0)
    with pytest.raises(P3OError, match="2 answers for 1 prompts"):
        engine.generate([[1]], 1, answers=["a", "b"])
    assert engine.calls == [] and engine._group_offset == 0


def test_right_pad_lays_rows_of_different_lengths_out_with_pad_and_no_attention_after_them():
    ids, mask, attn, logp, version = right_pad([([5, 6, 7], [True, False, True], [-0.5, 0.0, -1.5], [3, -1, 4]),
                                                ([], [], [], [])], pad_id=9)  # fmt: skip
    assert ids.tolist() == [[5, 6, 7], [9, 9, 9]] and ids.dtype == torch.long
    assert mask.tolist() == [[True, False, True], [False] * 3] and attn.tolist() == [[True] * 3, [False] * 3]
    assert logp.tolist() == [[-0.5, 0.0, -1.5], [0.0] * 3] and logp.dtype == torch.float32
    assert version.tolist() == [[3, -1, 4], [-1] * 3]
    assert right_pad([([], [], [], [])], pad_id=0)[0].shape == (1, 1)  # T is at least 1
