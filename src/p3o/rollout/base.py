"""The rollout-engine seam: anything that samples completions and records their per-token log-probs and versions.

engine: RolloutEngine = make_engine("hf", model, tokenizer, precision="fp8")   # p3o.rollout.factory
rollouts = engine.generate([[1, 5, 7], [1, 9]], n=4, seed=0)                   # 8 rows: prompt 0 → rows 0–3
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from torch import Tensor

from p3o.errors import ConfigError
from p3o.types import Rollouts

__all__ = ["LOGPROB_MODES", "RolloutEngine", "check_sampling"]

LOGPROB_MODES = ("processed", "raw")


def check_sampling(*, temperature: float, top_p: float, top_k: int, max_new_tokens: int, logprob_mode: str) -> None:
    """The sampling settings every engine takes, checked alike: a one-line ConfigError naming `rollout.<key>`."""
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


@runtime_checkable
class RolloutEngine(Protocol):
    """Samples `n` completions per prompt, recording log π_b(y_t) and the weight version of every token."""

    version: int
    """Version of the weights currently loaded; stamped on every token generated until the next `load_weights`."""

    def generate(
        self, prompt_ids: list[list[int]], n: int, *, seed: int | None = None, answers: list[str] | None = None
    ) -> Rollouts:
        """Sample `n` completions of every prompt; rows are grouped: prompt i gives rows i·n … i·n+n−1.

        `group_ids` (N,) gives the rows of one prompt the same id and different prompts different ids; the values
        themselves are the engine's (an engine may number them on across calls): callers that need batch-wide ids
        assign their own, as the training loop does. `seed` makes the call reproducible; `answers` (one per prompt)
        are copied onto their rows.
        """
        ...

    def load_weights(self, state_dict: dict[str, Tensor], version: int) -> None:
        """Copy new weights in (re-applying the engine's precision) and stamp later tokens with `version`."""
        ...
