"""Selection bias of a best-checkpoint ("peak") primary metric decided on the same evaluations it is scored on.

A study whose verdicts use ``eval_peak`` (the best of a run's k in-loop evaluations after step 0, each on n held-out
problems with one sample) and whose runs kept no checkpoints to re-decide them on a test split
(:mod:`p3o.experiments.grid.peak`) is marked in the ledger (configs/experiments/records/ledger.yaml, the study's
``studies`` entry: ``selection_bias: {metric, n_problems, why}``). The bias is computed from the verdict file's own
run records: k evaluations after step 0, step 0's mean pass@1 p0, and

    bias = √(p0 (1 − p0) / n) · E[max of k standard normals]

the expected height of the best of k evaluations above step 0 when nothing is learned
(:func:`p3o.experiments.grid.peak.expected_best_of_k`). The summary, the claims page and ``p3o compare --check`` state
it beside the study's peak verdicts.
"""

from __future__ import annotations

from typing import Any

from p3o.experiments.grid.peak import expected_best_of_k


def peak_bias(doc: dict[str, Any], entry: dict[str, Any] | None) -> dict[str, Any] | None:
    """The selection bias of a verdict file's peak metric ({metric, k, n, p0, bias, text}); None when the ledger
    entry marks none or the file's runs recorded no in-loop evaluations."""
    mark = (entry or {}).get("selection_bias")
    if not isinstance(mark, dict):
        return None
    evals = [e for run in doc.get("runs") or [] for e in run.get("evals") or []]
    start = [float(v) for st, v in evals if st == 0]
    k_per_run = {len([1 for st, _ in run.get("evals") or [] if st > 0]) for run in doc.get("runs") or []}
    if not start or not k_per_run:
        return None
    k, n = max(k_per_run), int(mark.get("n_problems", 0))
    p0 = sum(start) / len(start)
    bias = expected_best_of_k(p0, n, k) if n > 0 and k > 0 else float("nan")
    metric = str(mark.get("metric", "eval_peak"))
    text = (
        f"{metric} verdicts selection-biased: the best of {k} in-loop evaluations on {n} problems (one sample each) "
        f"is chosen and scored on the same evaluations; with no learning it sits {bias:+.3f} above step 0 "
        f"({p0:.3f}) in expectation" + (f" ({' '.join(str(mark['why']).split())})" if mark.get("why") else "")
    )
    return {"metric": metric, "k": k, "n": n, "p0": p0, "bias": bias, "text": text}
