"""The probe room: each objective's gradient on a stale or mismatched batch against the on-policy gradient.

- :mod:`~p3o.experiments.probe.compute`: the synthetic probe (exact J, reference gradients, one-step gains);
- :mod:`~p3o.experiments.probe.lm`: the same probe on a language-model run's checkpoints;
- :mod:`~p3o.experiments.probe.tables`: summaries, markdown tables, the figure and the doc block;
- :mod:`~p3o.experiments.probe.cli`: ``p3o probe``.

Gradient probe: how well does each off-policy estimator point where the on-policy gradient points?

For a saved trajectory θ_0, θ_1, …, θ_U (one entry per optimizer update) take a probe point k and a lag L, draw
batches from the rollout engine at θ_{k−L}, and compute every objective's gradient at θ_k — the gradient of the
FIRST optimizer update on that batch (π_prox = π_θold = π_θk) — as an ascent direction d = −∇_θ loss. Compare it
with a high-sample ON-POLICY gradient at θ_k,

    g_ref = E_{groups ∼ π_θk}[ (1/(N·T)) Σ_i A_i Σ_t ∇_θ log π_θk(y_it) ]    (group-relative A, many fresh groups)

which every objective reduces to on-policy (ratios ≡ 1; equal response lengths make all aggregations agree):

    cos(d, g_ref),   ‖d‖ / ‖g_ref‖,   ΔJ = J(θ_k + η·d/‖d‖) − J(θ_k)   (one step of fixed length η)

plotted against the batch's ESS (Kong's ESS of π_θk/π_b over its tokens) and L. The "cosine of the mean"
(the mean of a cell's batch gradients against g_ref) isolates the estimator's bias from its per-batch noise.

Instrument: the synthetic tabular autoregressive toy of :mod:`p3o.experiments.synthetic.train` (exact J and exact ∇J by
dynamic programming; g_ref from thousands of fresh groups). The cosine with the exact ∇J is reported too (the
group-normalised policy gradient is not exactly ∇J: the per-group std scales each prompt).

Usage::

    p3o probe --out runs/probe/probe.json --plot docs/figures/probe-synthetic.png --update-doc docs/probe.md
    python -c "from p3o.experiments.probe import ProbeConfig, probe_synthetic; r = probe_synthetic(ProbeConfig())"
"""

from p3o.experiments.probe.cli import main
from p3o.experiments.probe.compute import (
    DEFAULT_LAGS,
    DEFAULT_OBJECTIVES,
    ProbeConfig,
    probe_synthetic,
    reference_gradient,
)
from p3o.experiments.probe.lm import probe_lm
from p3o.experiments.probe.tables import kl_table, markdown_table, plot_probe, reversal_table, summarise, update_doc

__all__ = [
    "DEFAULT_LAGS",
    "DEFAULT_OBJECTIVES",
    "ProbeConfig",
    "kl_table",
    "main",
    "markdown_table",
    "plot_probe",
    "probe_lm",
    "probe_synthetic",
    "reference_gradient",
    "reversal_table",
    "summarise",
    "update_doc",
]
