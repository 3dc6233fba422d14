"""Evaluation: the unbiased pass@k estimator, a benchmark runner over a task's test split (``p3o eval``), and
``p3o mismatch`` (`mismatch`: how far a rollout engine's log-probs are from the fp32 trainer's, before training).

Usage:

    pass_at_k(n=[8, 8], c=[0, 3], k=2)                      # per-problem estimates
    evaluate_checkpoint("runs/default/final", "arithmetic", "test", n_samples=8).pass_at_k
    evaluate_harness(model, tok, problems, agent=run_cfg.agent, model_name="tiny-chat")  # a harness run's episodes
"""

from __future__ import annotations

from p3o.lazy import lazy_exports

# imported on first use (PEP 562): `p3o eval --help` loads p3o.eval.cli without torch (issue 47)
__getattr__ = lazy_exports(
    __name__,
    {
        "p3o.eval.passk": ("mean_pass_at_k", "pass_at_k"),
        "p3o.eval.runner": ("Counting", "EvalResult", "encode_prompts", "evaluate", "evaluate_checkpoint"),
        "p3o.eval.harness": ("evaluate_harness", "load_harness"),
    },
)


__all__ = [
    "Counting",
    "EvalResult",
    "encode_prompts",
    "evaluate",
    "evaluate_checkpoint",
    "evaluate_harness",
    "load_harness",
    "mean_pass_at_k",
    "pass_at_k",
]
