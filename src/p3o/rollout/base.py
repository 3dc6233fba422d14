"""The rollout-engine seam: anything that samples completions and records their per-token log-probs and versions.

engine: RolloutEngine = make_engine("hf", model, tokenizer, precision="fp8")   # p3o.rollout.factory
rollouts = engine.generate([[1, 5, 7], [1, 9]], n=4, seed=0)                   # 8 rows: prompt 0 → rows 0–3
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

from p3o.errors import ConfigError, P3OError
from p3o.types import Rollouts

__all__ = [
    "LOGPROB_MODES",
    "RolloutEngine",
    "as_id_list",
    "check_generate",
    "check_sampling",
    "left_pad",
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


@runtime_checkable
class RolloutEngine(Protocol):
    """Samples `n` completions per prompt, recording log π_b(y_t) and the weight version of every token."""

    version: int
    """Version of the weights currently loaded; stamped on every token generated until the next `load_weights`."""

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
        are copied onto their rows.
        """
        ...

    def load_weights(self, state_dict: dict[str, Tensor], version: int) -> None:
        """Copy new weights in (re-applying the engine's precision) and stamp later tokens with `version`."""
        ...
