"""Core data types that travel between the rollout engine, the verifiers and the trainer.

Shape legend: N sequences (prompts × group size G), P prompt tokens (left-padded),
T response tokens (right-padded).

    rollouts = engine.generate(prompt_ids, n=4)   # -> Rollouts
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch
from torch import Tensor


def _pad_to(x: Tensor, length: int, value: float | int, left: bool = False) -> Tensor:
    """Pad the last dim of a (N, L) tensor to `length` on the right (or left)."""
    extra = length - x.shape[1]
    if extra <= 0:
        return x
    pad = torch.full((x.shape[0], extra), value, dtype=x.dtype, device=x.device)
    return torch.cat([pad, x] if left else [x, pad], dim=1)


@dataclass
class Rollouts:
    """A batch of sampled completions with everything the engine recorded while sampling them.

    Attributes:
        prompt_ids: (N, P) long, left-padded prompt tokens.
        prompt_mask: (N, P) bool, True = a real prompt token.
        response_ids: (N, T) long, right-padded sampled tokens (pad id at masked positions).
        mask: (N, T) bool, the LOSS mask: True = a token the policy sampled and the objective counts (up to and
            including each turn's stop token). Observation and template tokens of an episode are False here.
        rollout_logp: (N, T) float32, log π_b(y_t | ·) recorded by the engine at sampling time; 0 where masked.
        policy_version: (N, T) long, the weight version that sampled each token; -1 where masked.
        group_ids: (N,) long, sequences with the same id share a prompt (GRPO groups).
        rewards: (N,) float32, filled in by the verifier (zeros until then).
        truncated: (N,) bool, True = hit max_new_tokens without a stop token.
        texts: decoded completions, len N.
        answers: reference answers per sequence (for the verifier), len N; may be empty.
        advantages: (N,) float32 or None until computed.
        attn: (N, T) bool, the ATTENTION mask of the response: True = a real token the model reads (model tokens and,
            in an episode, the observation / template tokens an environment appended). Defaults to `mask` (a
            single-turn completion has no other tokens); always ``attn ⊇ mask``.
        extras: per-row episode statistics, name -> (N,) float32 (``turns``, ``tool_calls``, ``tool_errors``, ...;
            see `p3o.envs.runner`); empty for single-turn rollouts.

    Agent episodes are one row each: ``response_ids`` = [turn 1 | observation 1 | turn 2 | ...], exactly the ids the
    engine sampled plus the ids the environment appended (never re-tokenised); ``mask`` is 1 on model tokens only,
    ``rollout_logp`` and ``policy_version`` are recorded per model token (0 and −1 on observations), so one row may
    carry several versions and every token's ratio uses its own recorded log-prob.
    """

    prompt_ids: Tensor
    prompt_mask: Tensor
    response_ids: Tensor
    mask: Tensor
    rollout_logp: Tensor
    policy_version: Tensor
    group_ids: Tensor
    rewards: Tensor
    truncated: Tensor
    texts: list[str] = field(default_factory=list)
    answers: list[str] = field(default_factory=list)
    advantages: Tensor | None = None
    attn: Tensor | None = None
    extras: dict[str, Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n, t = self.response_ids.shape
        assert self.mask.shape == (n, t), (self.mask.shape, (n, t))
        if self.attn is None:
            self.attn = self.mask
        assert self.attn.shape == (n, t), (self.attn.shape, (n, t))
        for k, v in self.extras.items():
            assert v.shape == (n,), (k, v.shape, n)
        assert self.rollout_logp.shape == (n, t), (self.rollout_logp.shape, (n, t))
        assert self.policy_version.shape == (n, t), (self.policy_version.shape, (n, t))
        assert self.prompt_ids.shape[0] == n and self.prompt_mask.shape == self.prompt_ids.shape
        assert self.group_ids.shape == (n,) and self.rewards.shape == (n,) and self.truncated.shape == (n,)

    def __len__(self) -> int:
        return self.response_ids.shape[0]

    @property
    def num_tokens(self) -> int:
        """Number of model (loss-mask) tokens."""
        return int(self.mask.sum())

    @property
    def multi_turn(self) -> bool:
        """Whether any row holds tokens the policy did not sample (observations): ``attn`` differs from ``mask``."""
        return self.attn is not self.mask and bool((self.attn != self.mask).any())

    def select(self, idx: Tensor | list[int] | slice) -> Rollouts:
        """Rows `idx` as a new Rollouts (tensors indexed, lists picked)."""
        if isinstance(idx, slice):
            idx = list(range(len(self)))[idx]
        index = torch.as_tensor(idx, dtype=torch.long)
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, Tensor):
                out[f.name] = v[index]
            elif isinstance(v, list):
                out[f.name] = [v[i] for i in index.tolist()] if v else []
            elif isinstance(v, dict):
                out[f.name] = {k: x[index] for k, x in v.items()}
            else:
                out[f.name] = v
        if self.attn is self.mask:
            out["attn"] = None
        return Rollouts(**out)

    def to(self, device: torch.device | str) -> Rollouts:
        """A copy with every tensor on `device`."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        for k, v in out.items():
            if isinstance(v, Tensor):
                out[k] = v.to(device)
            elif isinstance(v, dict):
                out[k] = {name: x.to(device) for name, x in v.items()}
        if self.attn is self.mask:
            out["attn"] = None
        return Rollouts(**out)

    @staticmethod
    def cat(parts: list[Rollouts], pad_id: int = 0) -> Rollouts:
        """Concatenate along N, padding prompts on the left and responses on the right."""
        assert parts, "Rollouts.cat needs at least one part"
        p = max(r.prompt_ids.shape[1] for r in parts)
        t = max(r.response_ids.shape[1] for r in parts)

        def col(name: str, length: int, value: float | int, left: bool = False) -> Tensor:
            return torch.cat([_pad_to(getattr(r, name), length, value, left) for r in parts])

        adv = None
        if all(r.advantages is not None for r in parts):
            adv = torch.cat([r.advantages for r in parts])  # type: ignore[misc]
        attn = None
        if any(r.attn is not r.mask for r in parts):
            attn = col("attn", t, False)
        names = sorted({k for r in parts for k in r.extras})
        extras = {
            k: torch.cat([r.extras.get(k, torch.zeros(len(r), device=r.rewards.device)) for r in parts]) for k in names
        }
        return Rollouts(
            prompt_ids=col("prompt_ids", p, pad_id, left=True),
            prompt_mask=col("prompt_mask", p, False, left=True),
            response_ids=col("response_ids", t, pad_id),
            mask=col("mask", t, False),
            rollout_logp=col("rollout_logp", t, 0.0),
            policy_version=col("policy_version", t, -1),
            group_ids=torch.cat([r.group_ids for r in parts]),
            rewards=torch.cat([r.rewards for r in parts]),
            truncated=torch.cat([r.truncated for r in parts]),
            texts=[s for r in parts for s in r.texts],
            answers=[s for r in parts for s in r.answers],
            advantages=adv,
            attn=attn,
            extras=extras,
        )
