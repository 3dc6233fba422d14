"""Core data types that travel between the rollout engine, the verifiers and the trainer.

Shape legend: N sequences (prompts × group size G), P prompt tokens (left-padded),
T response tokens (right-padded).

    rollouts = engine.generate(prompt_ids, n=4)   # -> Rollouts
    rollouts.sampling_mask                        # -> SamplingMask | None: the sets the tokens were sampled from
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
class SamplingMask:
    """The set each token was sampled from (its top-k / top-p support after temperature), compactly: CSR by token.

    With top-p < 1 or top-k > 0 the engine samples from a truncated, renormalised distribution; replaying that set in
    the trainer (log π_θ(y) = z_y/τ − logsumexp_{v ∈ kept} z_v/τ) makes π_θ / μ an importance weight again
    (`p3o.logprobs.token_logprobs`' ``kept``; DeepSeek-V3.2's "keep sampling mask").

    Attributes:
        counts: (N, T) int32, the size of token (i, t)'s kept set; 0 = none recorded (the whole vocabulary: masked
            and observation tokens, or rows of an engine that recorded nothing).
        ids: (K,) int32, K = counts.sum(): every recorded set's token ids, sets in row-major (i, t) order.
    """

    counts: Tensor
    ids: Tensor

    def __post_init__(self) -> None:
        assert self.counts.dim() == 2 and self.ids.dim() == 1, (self.counts.shape, self.ids.shape)

    @staticmethod
    def empty(n: int, t: int, device: torch.device | str | None = None) -> SamplingMask:
        """N × T tokens with no recorded set."""
        return SamplingMask(
            torch.zeros((n, t), dtype=torch.int32, device=device), torch.zeros(0, dtype=torch.int32, device=device)
        )

    @staticmethod
    def from_dense(keep: Tensor) -> SamplingMask:
        """The mask of a dense (N, T, V) bool `keep` (True = kept; an all-False (i, t) records no set)."""
        nz = keep.nonzero()  # (K, 3), row-major
        return SamplingMask(keep.sum(-1).to(torch.int32), nz[:, 2].to(torch.int32))

    def dense(self, vocab: int) -> Tensor:
        """(N, T, V) bool, True = kept (tokens without a set: all False). Tests and references only."""
        n, t = self.counts.shape
        tok = torch.arange(n * t, device=self.ids.device).repeat_interleave(self.counts.reshape(-1).long())
        out = torch.zeros(n * t, vocab, dtype=torch.bool, device=self.ids.device)
        out[tok, self.ids.long()] = True
        return out.view(n, t, vocab)

    def select(self, index: Tensor) -> SamplingMask:
        """Rows `index` ((n,) long), in that order."""
        index = index.to(self.counts.device)
        totals = self.counts.sum(-1, dtype=torch.long)  # (N,)
        starts = totals.cumsum(0) - totals
        lens = totals[index]
        first = (lens.cumsum(0) - lens).repeat_interleave(lens)
        take = starts[index].repeat_interleave(lens) + torch.arange(int(lens.sum()), device=lens.device) - first
        return SamplingMask(self.counts[index], self.ids[take.to(self.ids.device)])

    def columns(self, t: int) -> SamplingMask:
        """Response columns [0, t) of every row."""
        if t >= self.counts.shape[1]:
            return self
        col = torch.arange(self.counts.shape[1], device=self.counts.device).expand_as(self.counts)
        keep = (col < t).reshape(-1).repeat_interleave(self.counts.reshape(-1).long())
        return SamplingMask(self.counts[:, :t].contiguous(), self.ids[keep.to(self.ids.device)])

    def to(self, device: torch.device | str) -> SamplingMask:
        return SamplingMask(self.counts.to(device), self.ids.to(device))

    @staticmethod
    def cat(parts: list[SamplingMask], t: int) -> SamplingMask:
        """Concatenate along N, each part's columns padded on the right to `t` (with no set)."""
        return SamplingMask(
            torch.cat([_pad_to(m.counts, t, 0) for m in parts]),
            torch.cat([m.ids.to(parts[0].ids.device) for m in parts]),
        )


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
        sampling_mask: the set each model token was sampled from when the engine truncated its distribution (top-p <
            1 or top-k > 0; `SamplingMask`, (N, T) counts), else None.

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
    sampling_mask: SamplingMask | None = None

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
        if self.sampling_mask is not None:
            assert self.sampling_mask.counts.shape == (n, t), (self.sampling_mask.counts.shape, (n, t))

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
            elif isinstance(v, SamplingMask):
                out[f.name] = v.select(index)
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
            elif isinstance(v, SamplingMask):
                out[k] = v.to(device)
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
        kept = None
        if any(r.sampling_mask is not None for r in parts):  # rows without one: no set recorded
            kept = SamplingMask.cat(
                [r.sampling_mask or SamplingMask.empty(*r.mask.shape, device=r.mask.device) for r in parts], t
            )
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
            sampling_mask=kept,
        )
