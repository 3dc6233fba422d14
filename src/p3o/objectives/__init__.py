"""Policy objectives (P3O, MinPRO and baselines), token aggregation and the effective sample size.

Usage::

    from p3o.objectives import ObjectiveInputs, get_objective
    loss, stats = get_objective("p3o")(ObjectiveInputs(logp, rollout_logp, mask, advantages, num_tokens=n_step))

The exact mathematics is in docs/objectives.md.
"""

from p3o.objectives.clipped import cispo, clipped_surrogate, dapo, decoupled_ppo, grpo, gspo
from p3o.objectives.core import (
    AGG_MODES,
    ESS_SCOPES,
    KL_ESTIMATORS,
    ROLLOUT_CORRECTIONS,
    ROW_REJECTIONS,
    Correction,
    ObjectiveError,
    ObjectiveInputs,
    correction_anchor,
    effective_sample_size,
    ess_from_parts,
    ess_parts,
    k3,
    kl_estimate,
    masked_mean,
    reduce_tokens,
)
from p3o.objectives.p3o_family import (
    P3O_CAPS,
    PREFIX_SCOPES,
    PREFIX_STATS,
    m2po,
    m2po_clip,
    m2po_clip_bounds,
    m2po_threshold,
    minpro,
    minpro_diagnostics,
    p3o,
    p3o_token_loss,
    p3o_two_anchor,
    prefix_log_stat,
)
from p3o.objectives.registry import (
    INPUTS,
    OBJECTIVES,
    BoundObjective,
    Hyper,
    Objective,
    get_objective,
    objective_defaults,
)
from p3o.objectives.shared import SHARED, PolicyTerm, SharedSettings, with_shared

__all__ = [
    "AGG_MODES",
    "BoundObjective",
    "Correction",
    "ESS_SCOPES",
    "INPUTS",
    "KL_ESTIMATORS",
    "OBJECTIVES",
    "P3O_CAPS",
    "PREFIX_SCOPES",
    "PREFIX_STATS",
    "ROLLOUT_CORRECTIONS",
    "ROW_REJECTIONS",
    "SHARED",
    "Hyper",
    "Objective",
    "ObjectiveError",
    "ObjectiveInputs",
    "PolicyTerm",
    "SharedSettings",
    "cispo",
    "clipped_surrogate",
    "correction_anchor",
    "dapo",
    "decoupled_ppo",
    "effective_sample_size",
    "ess_from_parts",
    "ess_parts",
    "get_objective",
    "grpo",
    "gspo",
    "k3",
    "kl_estimate",
    "m2po",
    "m2po_clip",
    "m2po_clip_bounds",
    "m2po_threshold",
    "masked_mean",
    "minpro",
    "minpro_diagnostics",
    "objective_defaults",
    "p3o",
    "p3o_token_loss",
    "p3o_two_anchor",
    "prefix_log_stat",
    "reduce_tokens",
    "with_shared",
]
