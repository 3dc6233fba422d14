"""The rollout-engine seam: anything that samples completions and records their per-token log-probs and versions.

engine: RolloutEngine = make_engine("hf", model, tokenizer, precision="fp8")   # p3o.rollout.factory
rollouts = engine.generate([[1, 5, 7], [1, 9]], n=4, seed=0)                   # 8 rows: prompt 0 → rows 0–3
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

from p3o.errors import ConfigError, P3OError
from p3o.types import Rollouts, SamplingMask

__all__ = [
    "LOGPROB_MODES",
    "Draws",
    "GenerateCall",
    "RolloutEngine",
    "SamplingEngine",
    "as_id_list",
    "check_generate",
    "check_sampling",
    "left_pad",
    "right_pad",
    "stop_and_pad_ids",
]

LOGPROB_MODES = ("processed", "raw")


def check_sampling(*, temperature: float, top_p: float, top_k: int, max_new_tokens: int, logprob_mode: str) -> None:
    """The sampling settings every engine takes, checked alike: a one-line ConfigError naming `rollout.<key>`.

    The sampling contract: a ratio π_θ/π_b is an importance weight only when the recorded log π_b(y_t) is the
    log-probability under the distribution y_t was actually drawn from. ``processed`` log-probs are (after τ, top-k,
    top-p); ``raw`` ones are log_softmax of the unscaled logits, which is not the sampling distribution once top-p or
    top-k truncate it, so raw mode with a truncation is refused. Raw mode at another temperature than the trainer's
    stays allowed: it is the deliberate temperature-mismatch regime of the P3O paper (the run records both
    temperatures and the log-prob mode in its config).
    """
    if logprob_mode not in LOGPROB_MODES:
        raise ConfigError(f"rollout.logprob_mode: unknown {logprob_mode!r}; choose from {', '.join(LOGPROB_MODES)}")
    if temperature < 0:
        raise ConfigError(f"rollout.temperature: must be >= 0, got {temperature}")
    if not 0.0 < top_p <= 1.0:
        raise ConfigError(f"rollout.top_p: must be in (0, 1], got {top_p}")
    if top_k < 0:
        raise ConfigError(f"rollout.top_k: must be >= 0 (0 = off), got {top_k}")
    if max_new_tokens < 1:
        raise ConfigError(f"rollout.max_new_tokens: must be >= 1, got {max_new_tokens}")
    if logprob_mode == "raw" and (top_p < 1.0 or top_k > 0):
        setting = f"rollout.top_p {top_p}" if top_p < 1.0 else f"rollout.top_k {top_k}"
        raise ConfigError(
            f"rollout.logprob_mode: raw log-probs are not those of the distribution sampled from once {setting} "
            f"truncates it, so the ratio would not be an importance weight; use rollout.logprob_mode processed, or "
            f"turn {setting.split()[0]} off"
        )


def check_generate(prompt_ids: Sequence[Sequence[int]], n: int, answers: Sequence[str] | None) -> int:
    """Every engine's checks of a `generate` call, alike; returns the number of prompts B.

    Raises P3OError for an empty prompt list or prompt, or answers that are not one per prompt, and ConfigError
    (``rollout.group_size``) for n < 1.
    """
    if not prompt_ids or any(len(p) == 0 for p in prompt_ids):
        raise P3OError("generate: prompt_ids must be a non-empty list of non-empty token-id lists")
    if n < 1:
        raise ConfigError(f"rollout.group_size: n must be >= 1, got {n}")
    if answers is not None and len(answers) != len(prompt_ids):
        raise P3OError(f"generate: got {len(answers)} answers for {len(prompt_ids)} prompts")
    return len(prompt_ids)


def as_id_list(x: int | Iterable[int] | None) -> list[int]:
    """An id, a list of ids or None (as HF configs store ``eos_token_id``) as a list of ints."""
    if x is None:
        return []
    if isinstance(x, int):
        return [x]
    return [int(i) for i in x]


def stop_and_pad_ids(
    sources: Sequence[Any], stop_token_ids: Iterable[int] | None, pad_token_id: int | None
) -> tuple[list[int], int]:
    """Every engine's stop set and pad id, alike.

    Args:
        sources: (tokenizer, config, generation config) of the model, any of them None.
        stop_token_ids: extra stop ids, on top of every source's ``eos_token_id``.
        pad_token_id: explicit pad id; else the first of tokenizer / config / generation config that has one, else the
            smallest stop id, else 0.
    Returns:
        (sorted stop ids, pad id).
    """
    stops = set(as_id_list(stop_token_ids))
    for src in sources:
        stops.update(as_id_list(getattr(src, "eos_token_id", None)))
    stop_ids = sorted(stops)
    if pad_token_id is None:
        pads = [getattr(src, "pad_token_id", None) for src in sources]
        pad_token_id = next((p for p in pads if p is not None), stop_ids[0] if stop_ids else 0)
    return stop_ids, int(pad_token_id)


def left_pad(prompt_ids: Sequence[Sequence[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """Prompts as one left-padded batch: ids (B, P) long (``pad_id`` before each prompt) and mask (B, P) bool."""
    b, p_len = len(prompt_ids), max(len(p) for p in prompt_ids)
    ids = torch.full((b, p_len), pad_id, dtype=torch.long)
    mask = torch.zeros((b, p_len), dtype=torch.bool)
    for i, p in enumerate(prompt_ids):
        ids[i, p_len - len(p) :] = torch.tensor(list(p), dtype=torch.long)
        mask[i, p_len - len(p) :] = True
    return ids, mask


def right_pad(
    rows: Sequence[tuple[Sequence[int], Sequence[bool], Sequence[float], Sequence[int]]], pad_id: int
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Responses as one right-padded batch. ``rows[i]`` = (ids, mask, log-probs, versions) of row i, each of length
    T_i; T = max(1, max_i T_i). Returns ids (N, T) long (``pad_id`` after each row), mask (N, T) bool (the row's own
    mask, False on padding), attn (N, T) bool (True on the row's T_i positions), log-probs (N, T) float32 (0.0 on
    padding) and versions (N, T) long (−1 on padding)."""
    num, t = len(rows), max([1] + [len(r[0]) for r in rows])
    ids = torch.full((num, t), pad_id, dtype=torch.long)
    mask = torch.zeros((num, t), dtype=torch.bool)
    attn = torch.zeros((num, t), dtype=torch.bool)
    logp = torch.zeros((num, t), dtype=torch.float32)
    version = torch.full((num, t), -1, dtype=torch.long)
    for i, (row_ids, row_mask, row_logp, row_versions) in enumerate(rows):
        k = len(row_ids)
        if k:
            ids[i, :k] = torch.tensor(list(row_ids), dtype=torch.long)
            mask[i, :k] = torch.tensor(list(row_mask), dtype=torch.bool)
            attn[i, :k] = True
            logp[i, :k] = torch.tensor(list(row_logp), dtype=torch.float32)
            version[i, :k] = torch.tensor(list(row_versions), dtype=torch.long)
    return ids, mask, attn, logp, version


class GenerateCall(ABC):
    """The `RolloutEngine.generate` call, declared once for the engines that implement it: `SamplingEngine` (HF,
    vLLM), `p3o.envs.engine.ProblemEngine` (agent and harness episodes) and `p3o.serve.remote.RemoteEngine` (a Ray
    worker behind the endpoint). ``generate`` takes the call as the protocol states it and hands it to the
    subclass's `_generate` with every argument in place: ``_generate(prompt_ids, n, seed, answers,
    max_new_tokens)``."""

    def generate(
        self,
        prompt_ids: list[list[int]],
        n: int,
        *,
        seed: int | None = None,
        answers: list[str] | None = None,
        max_new_tokens: int | None = None,
    ) -> Rollouts:
        """Sample `n` completions of every prompt; rows are grouped: prompt i gives rows i·n … i·n+n−1.
        `max_new_tokens`, where given, replaces the engine's limit for this call (an agent turn's budget).

        `group_ids` (N,) gives the rows of one prompt the same id and different prompts different ids; the values
        themselves are the engine's (an engine may number them on across calls): callers that need batch-wide ids
        assign their own, as the training loop does. `seed` makes the call reproducible; `answers` (one per prompt)
        are copied onto their rows. A subclass's `_generate` says what its rows are."""
        return self._generate(prompt_ids, n, seed, answers, max_new_tokens)

    @abstractmethod
    def _generate(
        self, prompt_ids: list[list[int]], n: int, seed: int | None, answers: list[str] | None, limit: int | None
    ) -> Rollouts:
        """The engine's `generate`; ``limit`` is the call's ``max_new_tokens``."""


@runtime_checkable
class RolloutEngine(Protocol):
    """Samples `n` completions per prompt, recording log π_b(y_t) and the weight version of every token."""

    version: int
    """Version of the weights currently loaded; stamped on every token generated until the next `load_weights`."""

    generate = GenerateCall.generate  # the call as `GenerateCall` declares it (signature and contract)

    def load_weights(self, state_dict: dict[str, Tensor], version: int) -> None:
        """Copy new weights in (re-applying the engine's precision) and stamp later tokens with `version`."""
        ...


@dataclass
class Draws:
    """What one call of a token-sampling engine drew, rows grouped as in `RolloutEngine.generate` (N = B·n rows,
    T = the longest response): response_ids (N, T) long (the pad id after a row stops), rollout_logp (N, T)
    float32 (0 after it), mask (N, T) bool, policy_version (N, T) long, truncated (N,) bool (no stop token), and
    sampling_mask, the support each token was drawn from, where the engine records it."""

    response_ids: Tensor
    rollout_logp: Tensor
    mask: Tensor
    policy_version: Tensor
    truncated: Tensor
    sampling_mask: SamplingMask | None = None


class SamplingEngine(GenerateCall):
    """What every engine that samples token by token (`HFEngine`, `VLLMEngine`) does alike around its sampler:
    `generate` checks the call, left-pads the prompts, numbers the groups on across calls, and lays the `Draws` of
    the subclass's `_draw` out as `Rollouts` on the engine's device, with the decoded texts and the answers.

    A subclass sets `settings`, `device`, `pad_token_id`, `tokenizer` (or None), `version`, `_lock` and
    `_group_offset` (0), and implements `_draw` and `load_weights`.
    """

    settings: Any  # p3o.rollout.settings.EngineSettings (which imports this module)
    device: torch.device
    pad_token_id: int
    tokenizer: Any
    version: int
    _lock: Any  # held while drawing; `load_weights` takes it too, so one call's tokens share a version
    _group_offset: int

    def _generate(
        self, prompt_ids: list[list[int]], n: int, seed: int | None, answers: list[str] | None, limit: int | None
    ) -> Rollouts:
        """`RolloutEngine.generate`: `n` completions of every prompt, prompt i in rows i·n … i·n+n−1;
        ``limit`` (the call's `max_new_tokens`), where given, replaces ``settings.max_new_tokens`` for this call (an
        agent turn's budget).

        Returns:
            `Rollouts` on the engine's device: prompt_ids / prompt_mask (N, P) left-padded, response_ids / mask /
            rollout_logp / policy_version (N, T) (version −1 outside the mask), T ≤ the token limit.
        """
        b = check_generate(prompt_ids, n, answers)
        t_max = int(limit) if limit else self.settings.max_new_tokens
        ids, pmask = left_pad(prompt_ids, self.pad_token_id)
        with self._lock:
            drawn = self._draw(prompt_ids, ids, pmask, n, seed, t_max)
            group_ids = torch.arange(b).repeat_interleave(n) + self._group_offset
            self._group_offset += b
        dev, valid = self.device, drawn.mask
        return Rollouts(
            prompt_ids=ids.repeat_interleave(n, dim=0).to(dev),
            prompt_mask=pmask.repeat_interleave(n, dim=0).to(dev),
            response_ids=drawn.response_ids.to(dev),
            mask=valid.to(dev),
            rollout_logp=drawn.rollout_logp.to(dev),
            policy_version=torch.where(valid, drawn.policy_version, -1).to(dev),
            group_ids=group_ids.to(dev),
            rewards=torch.zeros(b * n, dtype=torch.float32, device=dev),
            truncated=drawn.truncated.to(dev),
            texts=self._decode(drawn.response_ids, valid),
            answers=[a for a in answers for _ in range(n)] if answers is not None else [],
            sampling_mask=drawn.sampling_mask.to(dev) if drawn.sampling_mask is not None else None,
        )

    @abstractmethod
    def _draw(
        self, prompt_ids: list[list[int]], ids: Tensor, pmask: Tensor, n: int, seed: int | None, t_max: int
    ) -> Draws:
        """Draw `n` completions of every prompt, at most `t_max` tokens each, under the engine's lock.

        Args:
            prompt_ids: the B prompts as given; ids / pmask: the same left-padded, (B, P) long / bool (CPU).
            seed: makes the call reproducible; None: the engine's own generator runs on.
        """

    def _decode(self, tokens: Tensor, valid: Tensor) -> list[str]:
        """The completions' texts: each row's valid tokens (N, T) decoded without special tokens ([] without a
        tokenizer)."""
        if self.tokenizer is None:
            return []
        rows = [tokens[i][valid[i]].tolist() for i in range(tokens.shape[0])]
        return list(self.tokenizer.batch_decode(rows, skip_special_tokens=True))
