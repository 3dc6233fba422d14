"""Evaluation: the unbiased pass@k estimator, a benchmark runner over a task's test split (``p3o eval``), and
``p3o mismatch`` (`mismatch`: how far a rollout engine's log-probs are from the fp32 trainer's, before training).

Usage:

    pass_at_k(n=[8, 8], c=[0, 3], k=2)                      # per-problem estimates
    evaluate_checkpoint("runs/default/final", "arithmetic", "test", n_samples=8).pass_at_k
"""

from __future__ import annotations

import importlib
from typing import Any

# imported on first use (PEP 562): `p3o eval --help` loads p3o.eval.cli without torch (issue 47)
_WHERE = {
    "mean_pass_at_k": "p3o.eval.passk",
    "pass_at_k": "p3o.eval.passk",
    "EvalResult": "p3o.eval.runner",
    "encode_prompts": "p3o.eval.runner",
    "evaluate": "p3o.eval.runner",
    "evaluate_checkpoint": "p3o.eval.runner",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'p3o.eval' has no attribute {name!r}")


__all__ = ["EvalResult", "encode_prompts", "evaluate", "evaluate_checkpoint", "mean_pass_at_k", "pass_at_k"]
