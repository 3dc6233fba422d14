"""The in-loop held-out evaluation: pass@1 of the current policy with one engine kept for the whole run.

    evaluate = Evaluator(side, seed=0)
    row.update(evaluate(version, weights=lambda: sync_weights(policy), model=lambda: engine_model(policy)))
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torch import Tensor

from p3o.eval.runner import heldout_metrics
from p3o.train.sources import stream_seed

if TYPE_CHECKING:
    from p3o.train.wiring import RolloutSide


class Evaluator:
    """pass@1 on the held-out prompts with ONE engine for the whole run, re-loaded with the current weights at each
    call (a fresh engine per evaluation gave the same numbers at the cost of a model copy each time).

    One sample per prompt, batch seeds stream_seed(seed, lo, 99991), by the one evaluation sampler
    (`p3o.eval.runner.heldout_metrics`) with the rollout engine's own settings (`side.make_engine`).

        evaluate = Evaluator(side, seed=0)
        row.update(evaluate(version, weights=lambda: sync_weights(policy), model=lambda: engine_model(policy)))
    """

    def __init__(self, side: RolloutSide, seed: int, batch_size: int = 64) -> None:
        self.side, self.seed, self.batch_size = side, seed, batch_size
        self.engine: Any = None

    def __call__(
        self, version: int, weights: Callable[[], dict[str, Tensor]], model: Callable[[], Any]
    ) -> dict[str, float]:
        """{"eval_accuracy": fraction with score > 0.5, "eval_score": mean score} of the policy at `version` ({}
        without eval prompts). The first call builds the engine from `model()`; later ones load `weights()` into it
        (each callable is called only when needed)."""
        side = self.side
        if not side.eval_prompts:
            return {}
        if self.engine is None:
            self.engine = side.make_engine(model())
            self.engine.version = version
        elif self.engine.version != version:
            self.engine.load_weights(weights(), version)
        engine = self.engine
        return heldout_metrics(
            None,  # unused: the engine below already holds the policy
            side.tokenizer,
            side.eval_prompts,
            side.eval_answers,
            side.reward_fn,
            n_samples=1,
            batch_seed=lambda lo: stream_seed(self.seed, lo, 99991),
            engine=lambda _policy: engine,
            batch_size=self.batch_size,
        )


__all__ = ["Evaluator"]
