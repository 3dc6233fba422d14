"""The in-loop held-out evaluation: pass@1 of the current policy with one engine kept for the whole run.

evaluate = Evaluator(side, seed=0)
row.update(evaluate(version, weights=lambda: sync_weights(policy), model=lambda: engine_model(policy)))
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from torch import Tensor

from p3o.eval.runner import heldout_metrics
from p3o.train.sources import stream_seed

if TYPE_CHECKING:
    from p3o.train.wiring import RolloutSide


#: Fewer held-out problems than this and `p3o train` warns once: pass@1 moves in steps of 1/n (issue 47).
MIN_EVAL_PROBLEMS = 50


def eval_count_warning(n: int) -> str | None:
    """The one-line warning for a held-out set of ``n`` < MIN_EVAL_PROBLEMS problems (naming the options that give
    more), else None."""
    if n >= MIN_EVAL_PROBLEMS:
        return None
    return (
        f"p3o train: warning: the held-out evaluation has only {n} problem{'s' if n != 1 else ''} (pass@1 moves in "
        f"steps of {1 / max(n, 1):.2g}); for at least {MIN_EVAL_PROBLEMS}: more data, a larger task.test_fraction "
        "(a single file's held-out share), or a separate evaluation file (task.eval_name); task.n_eval caps the count"
    )


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
        self, version: int, weights: Callable[[], Mapping[str, Tensor]], model: Callable[[], Any]
    ) -> dict[str, float]:
        """{"eval_accuracy": fraction with score > 0.5, "eval_score": mean score, "eval_problems": how many} of the
        policy at `version` ({} without eval prompts), and with a task mixture ``task/<name>/eval_accuracy`` per task
        (over all tasks' held-out problems together: eval_accuracy); the first call warns when there are fewer than
        50 problems.
        The first call builds the engine from `model()`; later ones load `weights()` into it
        (each callable is called only when needed)."""
        side = self.side
        if not side.eval_prompts:
            return {}
        if self.engine is None:
            warning = eval_count_warning(len(side.eval_prompts))
            if warning:
                print(warning, file=sys.stderr)
            self.engine = side.make_engine(model())
            self.engine.version = version
        elif self.engine.version != version:
            self.engine.load_weights(weights(), version)
        engine = self.engine
        mix = getattr(side, "mixture", None)  # a task mixture: pass@1 per task too
        return {"eval_problems": float(len(side.eval_prompts))} | heldout_metrics(
            None,  # unused: the engine below already holds the policy
            side.tokenizer,
            side.eval_prompts,
            side.eval_answers,
            side.reward_fn,
            n_samples=1,
            batch_seed=lambda lo: stream_seed(self.seed, lo, 99991),
            engine=lambda _policy: engine,
            batch_size=self.batch_size,
            tasks=mix.eval_task if mix is not None else None,
            task_names=mix.names if mix is not None else (),
        )

    def close(self) -> None:
        """Close the engine once built, where it has anything to close (a harness run's endpoint and harness
        processes; a vLLM instance)."""
        if callable(getattr(self.engine, "close", None)):
            self.engine.close()


__all__ = ["Evaluator"]
