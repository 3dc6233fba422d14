"""An unbiased "peak": choose the best checkpoint on one split, score it on another (issue 46, item 4).

The in-loop evaluations of a run (``log.eval_every``: held-out pass@1 of ``task.n_eval`` problems, one sample each)
are noisy: with no learning at all, the best of k of them sits above the starting policy by the expected maximum of
k draws of that noise (:func:`expected_best_of_k`; 512 problems at pass@1 0.535, k = 5: +0.026). A study whose
primary metric is the best of them (``eval_peak``) therefore reports a peak biased upward. The unbiased metric,
``eval_peak_test``, separates the two roles:

- **validation**: the in-loop evaluations choose the step (:func:`choose_step`: the best after step 0, the earliest
  of equal ones);
- **test**: that step's saved checkpoint (``checkpoints/step_NNNNNN/policy``) is scored by the grid's evaluation on
  held-out problems disjoint from the validation problems (:func:`test_problems`: the task's test split drawn with
  another seed, every validation question removed), written to ``run_dir/peak_test.json`` (:func:`score_peak`).

A study that declares ``eval_peak_test`` must keep a checkpoint at every evaluation step (``ckpt.every`` equal to
``log.eval_every`` and ``ckpt.keep_last`` at least steps / eval_every; :func:`check_peak_study`), else
``p3o compare`` refuses it before any run.

    bias = expected_best_of_k(0.535, 512, 5)            # 0.0256: the best of 5 under no learning, above step 0
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from p3o.errors import ConfigError

#: The unbiased peak metric (validation chooses, test scores) and the biased one (both on the in-loop evaluations).
PEAK_TEST, PEAK_BIASED = "eval_peak_test", "eval_peak"
#: The file a run's test score of its validation-chosen checkpoint is written to.
PEAK_FILE = "peak_test.json"
#: Offset of the test problems' seed from the run's (the validation problems are drawn with the run's seed).
TEST_SEED_OFFSET = 1_000_003


def expected_max_normal(k: int) -> float:
    """E[max of k independent standard normals] (1.163 for k = 5; 0 for k = 1)."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if k == 1:
        return 0.0
    # heavy: scipy start-up, only when computed (p3o.experiments.grid.spec imports this module)
    from scipy import integrate
    from scipy.stats import norm

    value, _ = integrate.quad(lambda x: x * k * norm.pdf(x) * norm.cdf(x) ** (k - 1), -12.0, 12.0)
    return float(value)


def expected_best_of_k(p0: float, n: int, k: int) -> float:
    """How far above the starting policy's pass@1 ``p0`` the best of ``k`` evaluations on ``n`` problems (one sample
    each) lies in expectation when nothing is learned: SE · E[max of k standard normals], SE = √(p0(1 − p0)/n)."""
    if not (0.0 <= p0 <= 1.0) or n < 1:
        raise ValueError(f"expected_best_of_k: p0 in [0, 1] and n >= 1, got {p0}, {n}")
    return math.sqrt(p0 * (1.0 - p0) / n) * expected_max_normal(k)


def choose_step(evals: Sequence[tuple[int, float]]) -> tuple[int, float] | None:
    """The validation choice: the (step, value) of the best in-loop evaluation after step 0 (the earliest of equal
    ones); None when there is none."""
    trained = [(int(st), float(v)) for st, v in evals if st > 0 and math.isfinite(float(v))]
    if not trained:
        return None
    return max(trained, key=lambda x: (x[1], -x[0]))


def checkpoint_of(run_dir: Path, step: int) -> Path:
    """The saved policy of ``step`` (``checkpoints/step_NNNNNN/policy``)."""
    return Path(run_dir) / "checkpoints" / f"step_{step:06d}" / "policy"


def check_peak_study(base: dict[str, Any], metrics: Sequence[str]) -> None:
    """ConfigError (one line, the fix) when a study scores ``eval_peak_test`` without a checkpoint at every
    evaluation step; nothing otherwise."""
    if PEAK_TEST not in metrics:
        return
    every = int(base.get("log.eval_every", 50))
    steps = int(base.get("steps", 0) or 0)
    ckpt, keep = int(base.get("ckpt.every", 20)), int(base.get("ckpt.keep_last", 2))
    need = max(1, math.ceil(steps / every)) if every and steps else None
    if not every or ckpt != every or (need is not None and keep < need):
        want = f"keep_last >= {need}" if need else "keep_last >= steps / eval_every"
        raise ConfigError(
            f"metric {PEAK_TEST} scores the validation-chosen checkpoint on a test split: set base ckpt.every to "
            f"log.eval_every ({every}) and ckpt.{want}, so every evaluated step keeps its checkpoint"
        )


def test_problems(cfg: Any, n: int) -> list[Any]:
    """``n`` held-out problems of the run's task disjoint from its validation (in-loop evaluation) problems: the
    task's test split drawn with seed ``cfg.seed + TEST_SEED_OFFSET``, every validation question removed."""
    # heavy: the training stack (torch), only when a peak is scored; wiring gives the run's own problems
    from p3o.tasks import load_eval_problems
    from p3o.train.wiring import _task_problems

    _, validation = _task_problems(cfg)
    seen = {str(p.question) for p in validation}
    pool = load_eval_problems(cfg.task, seed=int(cfg.seed) + TEST_SEED_OFFSET, n=n + len(seen) + n)
    out = [p for p in pool if str(p.question) not in seen][:n]
    if len(out) < n:
        raise ConfigError(f"{PEAK_TEST}: only {len(out)} test problems outside the validation set (wanted {n})")
    return out


def score_peak(run_dir: Path, cfg: Any, evals: Sequence[tuple[int, float]], evaluate_on: Any, n: int) -> dict:
    """Choose the step on the in-loop evaluations, score its checkpoint on :func:`test_problems` with
    ``evaluate_on(model_path, problems) -> pass@1`` and write ``run_dir/peak_test.json``
    ({step, validation, test, n_test, test_seed}); the record (``{}`` when nothing was evaluated after step 0)."""
    chosen = choose_step(evals)
    if chosen is None:
        return {}
    step, value = chosen
    model = checkpoint_of(run_dir, step)
    if not model.is_dir():
        raise ConfigError(f"{run_dir}: no checkpoint of step {step} to score ({model}): {PEAK_TEST} needs them all")
    problems = test_problems(cfg, n)
    record = {
        "step": step,
        "validation": value,
        "test": float(evaluate_on(str(model), problems)),
        "n_test": len(problems),
        "test_seed": int(cfg.seed) + TEST_SEED_OFFSET,
    }
    (Path(run_dir) / PEAK_FILE).write_text(json.dumps(record, indent=2) + "\n")
    return record


def read_peak(run_dir: Path) -> dict[str, float]:
    """The metrics of ``run_dir/peak_test.json``: ``eval_peak_test``, ``eval_peak_val``, ``eval_peak_test_step``
    ({} when absent or unreadable)."""
    try:
        raw = json.loads((Path(run_dir) / PEAK_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    if not isinstance(raw, dict) or not isinstance(raw.get("test"), (int, float)):
        return {}
    return {
        PEAK_TEST: float(raw["test"]),
        "eval_peak_val": float(raw.get("validation", math.nan)),
        "eval_peak_test_step": float(raw.get("step", math.nan)),
    }
