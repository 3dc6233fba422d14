"""The rollout-engine seam: anything that samples completions and records their per-token log-probs and versions.

engine: RolloutEngine = HFEngine(model, tokenizer, precision="fp8")
rollouts = engine.generate([[1, 5, 7], [1, 9]], n=4, seed=0)
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from torch import Tensor

from p3o.types import Rollouts

__all__ = ["RolloutEngine"]


@runtime_checkable
class RolloutEngine(Protocol):
    """Samples `n` completions per prompt, recording log π_b(y_t) and the weight version of every token."""

    version: int
    """Version of the weights currently loaded; stamped on every token generated until the next `load_weights`."""

    def generate(
        self, prompt_ids: list[list[int]], n: int, *, seed: int | None = None, answers: list[str] | None = None
    ) -> Rollouts:
        """Rows are grouped: prompt i gives rows i·n … i·n+n−1 with group id i + group_offset."""
        ...

    def load_weights(self, state_dict: dict[str, Tensor], version: int) -> None:
        """Copy new weights in (re-applying the engine's precision) and stamp later tokens with `version`."""
        ...
