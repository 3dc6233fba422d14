"""verl plug-in: p3o's objectives as verl policy losses (``register_policy_loss``), so that

    actor_rollout_ref.actor.policy_loss.loss_mode=p3o        (or minpro, m2po, p3o_grpo, p3o_dapo, ...)

works in verl >= 0.9. verl's workers import this module when it is named in ``VERL_USE_EXTERNAL_MODULES``::

    VERL_USE_EXTERNAL_MODULES=p3o.integrations.verl python -m verl.trainer.main_ppo \\
        actor_rollout_ref.actor.policy_loss.loss_mode=p3o ...

(or through the ``verl.plugins`` entry point when p3o's package metadata declares one). Importing this module
without verl is fine: registration happens in :func:`register`, called on import only when verl is installed.

What verl hands a policy loss, and how it maps onto ``p3o.objectives.ObjectiveInputs`` (verl 0.9.1,
``verl/workers/utils/losses.py::ppo_loss`` calls the loss once per micro-batch):

* ``old_log_prob`` (N, T): π_old, the actor's recomputation at the start of the step (``prox_logp``), and the
  ratio's anchor when verl passes no weights. (``algorithm.rollout_correction.bypass_mode=true`` would make it the
  rollout engine's log-probs, but in verl 0.9.1 bypass mode also forces ``loss_mode=bypass_mode``, so it cannot be
  combined with this plug-in.)
* ``rollout_is_weights`` (N, T) or None: verl's w_t = π_old/π_rollout (``algorithm.rollout_correction``, computed
  once per batch on the driver). Token-level weights are **folded into the ratio**:

      rollout_logp = old_log_prob − log w,   ρ_t = exp(logp_t − old_log_prob_t) · w_t = π_θ/π_rollout

  so P3O's ESS, cap and KL term (MinPRO's prefix minimum, M2PO's second moment, every baseline's clip) see the
  train–inference mismatch. Exact with ``rollout_is=token``, ``rollout_is_threshold=inf``,
  ``rollout_is_batch_normalize=false`` (docs/integrations.md). Weights that cannot be folded exactly warn once
  (:class:`RolloutWeightsWarning`): truncated ones (a weight exactly at a cap) are folded as min(w, C); a weight of
  0 (IcePop) multiplies that token's loss by 0; sequence-level weights multiply the per-token loss as in verl's
  built-in losses (:func:`split_rollout_weights`).
* ``loss_agg_mode`` and ``config.global_batch_info`` (dp_size, batch_num_tokens, global_batch_size,
  loss_scale_factor) reproduce verl's ``agg_loss`` exactly: e.g. ``token-mean`` is Σ ℓ / batch_num_tokens · dp_size
  (FSDP averages gradients over the dp ranks). Hence ``agg`` may not be set in the objective's keywords.
* The ESS is the micro-batch's, all-reduced (MAX then SUM of the log-space sums) over verl's data-parallel group:
  Megatron's data(+context)-parallel group when megatron's parallel state is initialised, otherwise the default
  group. With FSDP + Ulysses every sequence-parallel rank holds the same micro-batch; duplicating all tokens k times
  leaves Σρ²/... i.e. the ESS unchanged, so the default group gives the data-parallel value.

Hyper-parameters: ``register_objective("minpro_eps2", "minpro", trunc_eps_high=2.0)`` in a module of your own
(listed in VERL_USE_EXTERNAL_MODULES), or the environment variable ``P3O_OBJECTIVE_KWARGS`` (a JSON object, e.g.
``'{"trunc_eps_high": 2.0}'``) read by every p3o loss at call time. Both are checked by the objective's record
(``p3o.objectives.get_objective``), the only place that knows its keywords. The objective's stats appear in verl's
metrics as ``actor/objective/<stat>`` (``actor/objective/ess``, ``actor/objective/kl_weight``, ...;
``actor/objective/rollout_is_folded_frac`` when verl passes weights), the off-policy monitor's statistics as
``actor/offpolicy/<key>`` (``p3o.metrics.monitor``: ESS, position buckets, ratio tails, k1-3, findings), plus verl's
usual ``actor/pg_clipfrac`` (the objective's ``clipfrac`` where a PPO clip exists, else its ``band_frac``) and
``actor/ppo_kl`` (mean of old_log_prob − logp).
"""

from __future__ import annotations

import functools
import importlib.util
import math
import os
import sys
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from p3o.errors import ConfigError, json_object
from p3o.integrations._common import (
    PluginObjective,
    clip_statistic,
    default_group,
    require_inputs,
    resolve_objective,
    stats_to_floats,
)
from p3o.metrics.monitor import OffPolicyMonitor, prefixed
from p3o.objectives import ObjectiveInputs

__all__ = [
    "ENV_KWARGS",
    "LOSS_MODES",
    "RolloutWeights",
    "RolloutWeightsWarning",
    "data_parallel_group",
    "make_policy_loss",
    "register",
    "register_objective",
    "split_rollout_weights",
]

LOSS_MODES: dict[str, str] = {
    "p3o": "p3o",
    "minpro": "minpro",
    "m2po": "m2po",
    "p3o_grpo": "grpo",
    "p3o_dapo": "dapo",
    "p3o_gspo": "gspo",
    "p3o_cispo": "cispo",
    "p3o_decoupled_ppo": "decoupled_ppo",
    "p3o_two_anchor": "p3o_two_anchor",
    "p3o_gmpo": "gmpo",
    "p3o_sapo": "sapo",
    "p3o_dppo": "dppo",
    "p3o_topr": "topr",
    "p3o_gpg": "gpg",
    "p3o_kl_cov": "kl_cov",
    "p3o_clip_cov": "clip_cov",
}
"""verl ``loss_mode`` -> p3o objective registered by :func:`register`. verl already owns ``gspo`` / ``cispo`` (and
``geo_mean``, ``sapo``, ``dppo_tv``, ``kl_cov``, ``clip_cov``, ``gpg``), so p3o's versions carry a ``p3o_`` prefix;
``dro`` is left out (its β has no default to register). The two objectives with a proximal anchor get π_b =
π_rollout (folded from ``rollout_is_weights``) and π_prox = ``old_log_prob``; without weights both anchors are
π_old (decoupled PPO is then the PPO clip against π_old, two-anchor P3O is P3O)."""

ENV_KWARGS = "P3O_OBJECTIVE_KWARGS"
ENV_MONITOR = "P3O_OFFPOLICY_MONITOR"
"""Set to 0 to turn off the ``actor/offpolicy/*`` metrics (the monitor's reductions cost a few small collectives)."""
VERL_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-sum-norm", "seq-mean-token-mean")

PolicyLossFn = Callable[..., tuple[torch.Tensor, dict[str, Any]]]


def _core_algos() -> Any:
    try:
        from verl.trainer.ppo import core_algos  # optional: verl (extra verl)
    except ImportError as e:
        raise ImportError(f"p3o.integrations.verl needs verl: pip install 'p3o[verl]' ({e})") from e
    return core_algos


def data_parallel_group() -> Any:
    """verl's data-parallel group as seen from inside a policy loss (None without torch.distributed).

    Megatron: ``parallel_state.get_data_parallel_group(with_context_parallel=True)`` (tensor-/pipeline-parallel
    ranks hold copies of, or no part of, the micro-batch). FSDP: the default group (see the module docstring for
    why Ulysses sequence parallelism gives the same ESS).
    """
    if not (dist.is_available() and dist.is_initialized()):
        return None
    parallel_state = sys.modules.get("megatron.core.parallel_state")  # imported by verl's Megatron engine only
    if parallel_state is not None and parallel_state.model_parallel_is_initialized():
        return parallel_state.get_data_parallel_group(with_context_parallel=True)
    return default_group()


@functools.lru_cache(maxsize=8)
def _parse_env_kwargs(raw: str) -> dict[str, Any]:
    """The objective's keywords from ``$P3O_OBJECTIVE_KWARGS``: one JSON object of keyword -> value."""
    return json_object(raw, ENV_KWARGS, ConfigError)


VERL_INPUTS = frozenset({"prox_logp"})
"""Optional ``ObjectiveInputs`` verl can supply a policy loss: π_prox = ``old_log_prob`` (the actor's recomputation at
the start of the step). ``m2po_threshold`` is the micro-batch's (:data:`_common.PER_MICRO_BATCH_INPUTS`)."""

_VERL_HINTS = {
    "old_logp": "the engine mismatch is verl's algorithm.rollout_correction (rollout_is=token, "
    "rollout_is_threshold=inf: its weights are folded into the ratio), not the objective's rollout_correction",
    "ref_logp": "verl's KL to the reference is actor_rollout_ref.actor.use_kl_loss / kl_loss_coef",
    "entropy": "verl's entropy bonus is actor_rollout_ref.actor.entropy_coeff",
    "step_ess": "verl calls the loss once per micro-batch; use scope=micro-batch (all-reduced over dp ranks)",
}


def _verl_objective(objective: str, kwargs: Mapping[str, Any] | None, where: str) -> PluginObjective:
    """The record of ``objective`` with ``kwargs`` checked by it, and by what verl can do (one-line ConfigError)."""
    obj = resolve_objective(objective, kwargs, where=where)
    if "agg" in obj.given:
        raise ConfigError(f"{where}: 'agg' is verl's actor_rollout_ref.actor.loss_agg_mode; set it there")
    require_inputs(obj, supplied=VERL_INPUTS, framework="verl", where=where, hints=_VERL_HINTS)
    return obj


def _cfg_get(config: Any, key: str, default: Any = None) -> Any:
    if config is None:
        return default
    if isinstance(config, Mapping) or hasattr(config, "get"):
        value = config.get(key, default)
    else:
        value = getattr(config, key, default)
    return default if value is None else value


def _aggregation(
    mode: str, mask: torch.Tensor, info: Mapping[str, Any]
) -> tuple[str, float | torch.Tensor | None, float | torch.Tensor | None, float]:
    """verl ``agg_loss(mode, **global_batch_info)`` as (p3o agg, num_tokens, num_seqs, scale) with
    verl_loss = scale · reduce_tokens(ℓ, mask, agg, num_tokens, num_seqs=num_seqs) (norm constant T = mask width)."""
    dp_size = int(info.get("dp_size") or 1)
    batch_num_tokens = info.get("batch_num_tokens")
    global_batch_size = info.get("global_batch_size")
    width = float(mask.shape[-1])
    if mode == "token-mean":
        if batch_num_tokens is None and dp_size > 1:
            raise ValueError("(global) batch_num_tokens is required when dp_size > 1")
        return "token-mean", batch_num_tokens, None, float(dp_size)
    if mode == "token-sum":
        return "token-mean", 1.0, None, float(dp_size)
    if mode not in VERL_AGG_MODES:
        raise ValueError(f"Invalid loss_agg_mode: {mode}")
    if global_batch_size is None:
        if dp_size > 1:
            raise ValueError("global_batch_size is required when dp_size > 1")
        global_batch_size = mask.any(-1).sum()  # verl counts only the rows with a valid token
    if mode == "seq-mean-token-mean":
        return "seq-mean-token-mean", None, global_batch_size, float(dp_size)
    # seq-mean-token-sum(-norm): p3o's seq-mean-token-sum-norm divides the row sums by the width T
    scale = dp_size * width
    if mode == "seq-mean-token-sum-norm":
        scale /= float(info.get("loss_scale_factor") or width)
    return "seq-mean-token-sum-norm", None, global_batch_size, scale


COMMON_CAPS: tuple[float, ...] = (1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 8.0, 10.0, 20.0, 100.0)
"""Weight values that signal a truncation cap when a valid weight sits exactly on one (verl's TIS default 2.0,
IcePop's 5.0, ...): an untruncated weight exp(log π_old − log π_rollout) lands exactly on one with probability ~0."""

VERL_SAFETY_BOUND = 20.0
"""verl clamps the log-weight to ±20 before ``exp`` (``rollout_corr_helper.SAFETY_BOUND``): weights beyond e^±20
are truncated even with an infinite threshold."""


class RolloutWeightsWarning(UserWarning):
    """verl's ``rollout_is_weights`` cannot give P3O the exact ratio against π_rollout (issued once per kind)."""


_WARNED: set[str] = set()

_WARNINGS = {
    "sequence": (
        "verl's rollout_is_weights are constant along each sequence (algorithm.rollout_correction.rollout_is="
        "sequence): a sequence weight cannot be folded into a token ratio, so it multiplies the loss and P3O's ESS, "
        "cap and KL term see only pi_theta/pi_old, not the train-inference mismatch. For the exact ratio against "
        "the rollout engine set rollout_is=token, rollout_is_threshold=inf, rollout_is_batch_normalize=false"
    ),
    "truncated": (
        "verl's rollout_is_weights look truncated (a weight sits exactly at {cap:g}): they are folded into the ratio "
        "as rho = pi_theta/pi_old * min(w, C), so at capped tokens rho understates pi_theta/pi_rollout: P3O's ESS "
        "reads high, its KL weight 1 - ESS low and its cap loose (MinPRO's prefix minimum and every other "
        "objective's ratio likewise). For the exact ratio set algorithm.rollout_correction.rollout_is_threshold=inf "
        "(rollout_is=token, rollout_is_batch_normalize=false)"
    ),
    "masked": (
        "verl's rollout_is_weights are 0 at {count} valid token(s) (IcePop 'lower_upper' threshold): a zero weight "
        "cannot be folded into the ratio (log 0), so those tokens' policy term is multiplied by 0 and their ratio "
        "in P3O's ESS is pi_theta/pi_old, without the mismatch. For the exact ratio use a single threshold "
        "rollout_is_threshold=inf; to drop mismatched tokens use rollout_rs, which removes them from response_mask"
    ),
}


def _warn_once(kind: str, **fmt: Any) -> None:
    if kind not in _WARNED:
        _WARNED.add(kind)
        warnings.warn(_WARNINGS[kind].format(**fmt), RolloutWeightsWarning, stacklevel=3)


@dataclass(frozen=True)
class RolloutWeights:
    """verl's π_old/π_rollout weights split into the part folded into the ratio and the part that multiplies ℓ.

    w_t = f_t · m_t per valid token, with

        rollout_logp_t = old_log_prob_t − log f_t        (the behaviour anchor of the objective's ratio)
        ℓ_t ← m_t · ℓ_t                                  (only where m ≠ 1: zero or sequence-level weights)

    so with untruncated token-level weights f = w, m = 1 and ρ_t = exp(logp_t − old_log_prob_t) · w_t =
    π_θ/π_rollout exactly.
    """

    fold_log: torch.Tensor
    """(N, T) float32: log f_t (0 at masked positions and where nothing is folded)."""
    mult_log: torch.Tensor | None
    """(N, T) float32: log m_t (−inf for a zero weight), or None when m ≡ 1."""
    folded_frac: torch.Tensor
    """0-d: share of valid tokens whose weight was folded into the ratio."""
    issues: dict[str, dict[str, Any]]
    """Why the ratio is not exactly π_θ/π_rollout: ``sequence`` / ``truncated`` / ``masked`` -> message fields."""


def split_rollout_weights(weights: torch.Tensor, mask: torch.Tensor) -> RolloutWeights:
    """Decide how verl's ``rollout_is_weights`` (N, T) enter the objective, for the valid tokens of ``mask`` (N, T).

    * token-level, positive, finite weights are folded: f = w (exact when verl did not truncate them);
    * a weight of exactly 0 (IcePop rejects the token) cannot be folded (log 0): m = 0 there;
    * sequence-level weights (every row with ≥ 2 valid tokens constant, some row ≠ 1: ``rollout_is=sequence``)
      are not token ratios: m = w, nothing folded (verl's own semantics);
    * truncation is detected, not undone: a valid weight > 1 exactly at a value of :data:`COMMON_CAPS`, at
      e^20 (verl's safety clamp), or a maximum > 1 reached by ≥ 2 tokens exactly (a clamp at any cap).
    """
    with torch.no_grad():
        w = weights.detach().float().expand(mask.shape)
        zeros = torch.zeros((), device=w.device)
        issues: dict[str, dict[str, Any]] = {}
        valid_w = w[mask]
        if valid_w.numel() == 0:
            return RolloutWeights(torch.zeros_like(w), None, zeros, issues)
        rows = mask.sum(-1) >= 2
        if bool(rows.any()):
            inf = torch.full((), math.inf, device=w.device)
            row_max = torch.where(mask, w, -inf).amax(-1)[rows]
            row_min = torch.where(mask, w, inf).amin(-1)[rows]
            if bool((row_max == row_min).all()) and bool((row_max != 1.0).any()):
                issues["sequence"] = {}
                return RolloutWeights(torch.zeros_like(w), torch.where(mask, torch.log(w), zeros), zeros, issues)
        foldable = mask & torch.isfinite(w) & (w > 0)
        fold_log = torch.where(foldable, torch.log(torch.where(foldable, w, 1.0)), zeros)
        rest = mask & ~foldable
        mult_log = torch.where(rest, torch.log(w), zeros) if bool(rest.any()) else None
        n_zero = int((mask & (w == 0)).sum())
        if n_zero:
            issues["masked"] = {"count": n_zero}
        top = float(valid_w.max())
        caps = torch.tensor(COMMON_CAPS, device=w.device)
        if top > 1.0 and (
            bool((valid_w[:, None] == caps).any())
            or top >= math.exp(VERL_SAFETY_BOUND) * (1 - 1e-6)
            or int((valid_w == top).sum()) >= 2
        ):
            hit = valid_w[(valid_w[:, None] == caps).any(-1)]
            issues["truncated"] = {"cap": float(hit.max()) if hit.numel() else top}
        folded_frac = foldable.sum().float() / mask.sum().float()
        return RolloutWeights(fold_log, mult_log, folded_frac, issues)


def _fold_weights(
    old: torch.Tensor, mask: torch.Tensor, rollout_is_weights: torch.Tensor | None
) -> tuple[torch.Tensor, Any, torch.Tensor | None]:
    """(rollout_logp, folded share, loss weight) from verl's rollout IS weights w (N, T): token-level weights fold
    into the ratio's denominator (log π_rollout = log π_old − log w, so ρ = π_θ/π_old · w); zero or sequence-level
    weights multiply ℓ_t instead. Without weights: (old, None, None)."""
    if rollout_is_weights is None:
        return old, None, None
    split = split_rollout_weights(rollout_is_weights, mask)
    for kind, fields in split.issues.items():
        _warn_once(kind, **fields)
    loss_weight = torch.exp(split.mult_log) if split.mult_log is not None else None
    return old.float() - split.fold_log, split.folded_frac, loss_weight


def _loss_metrics(stats: dict[str, Any], ppo_kl: torch.Tensor, folded_frac: Any) -> dict[str, Any]:
    """verl's ``actor/pg_clipfrac`` and ``actor/ppo_kl`` plus ``actor/objective/<stat>`` for every stat."""
    extra = {"__ppo_kl": ppo_kl}
    if folded_frac is not None:
        extra["rollout_is_folded_frac"] = folded_frac
    values = stats_to_floats({**stats, **extra})
    metrics: dict[str, Any] = {"actor/pg_clipfrac": clip_statistic(values), "actor/ppo_kl": values.pop("__ppo_kl")}
    metrics.update({f"actor/objective/{k}": v for k, v in values.items()})
    return metrics


def make_policy_loss(objective: str, **objective_kwargs: Any) -> PolicyLossFn:
    """A verl policy-loss function (verl 0.9 ``PolicyLossFn`` signature) computing the p3o objective ``objective``.

    The returned ``fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
    rollout_is_weights=None) -> (loss, metrics)`` takes (N, T) tensors (advantages may be (N,)); ``loss`` is the 0-d
    loss verl back-propagates for this micro-batch, ``metrics`` a dict of floats. Keywords in ``objective_kwargs``
    (and, at call time, ``$P3O_OBJECTIVE_KWARGS``, which overrides them) are the objective's hyper-parameters,
    checked by its record (``p3o.objectives.get_objective(objective).resolve``): an unknown keyword, ``agg``
    (verl's ``loss_agg_mode``) or a keyword that needs an input verl cannot supply (``ref_kl_coef``,
    ``entropy_coef``, ``rollout_correction``, ``scope="step"``) is a one-line ConfigError.

    Metrics: ``actor/objective/<stat>`` for every stat of the objective, ``actor/objective/rollout_is_folded_frac``
    when weights are passed, ``actor/offpolicy/<key>`` (:class:`~p3o.metrics.monitor.OffPolicyMonitor` of a micro-batch
    against the ratio's denominator, reduced over the data-parallel group; findings over its last 20 calls; NaN
    entries such as empty position deciles left out; off with ``P3O_OFFPOLICY_MONITOR=0``), ``actor/ppo_kl`` =
    mean(old_log_prob − logp) and ``actor/pg_clipfrac`` = the objective's ``clipfrac`` (share of tokens where a PPO
    clip zeroes the gradient: grpo, dapo, gspo, decoupled_ppo), else its ``band_frac`` (share with |ρ − 1| > 0.2:
    p3o, minpro, m2po, cispo, ...).
    """
    base = _verl_objective(objective, objective_kwargs, "objective_kwargs")
    with_env: dict[str, PluginObjective] = {}
    monitors: list[OffPolicyMonitor] = []  # one per loss function, created at the first call (its width)

    def current() -> PluginObjective:
        # $P3O_OBJECTIVE_KWARGS is read at call time: it holds the keywords of the one loss a run selects, which
        # the other registered losses need not accept; parsed and checked once per value.
        raw = os.environ.get(ENV_KWARGS, "").strip()
        if not raw:
            return base
        if raw not in with_env:
            with_env[raw] = _verl_objective(objective, {**base.given, **_parse_env_kwargs(raw)}, ENV_KWARGS)
        return with_env[raw]

    def policy_loss(
        old_log_prob: torch.Tensor,
        log_prob: torch.Tensor,
        advantages: torch.Tensor,
        response_mask: torch.Tensor,
        loss_agg_mode: str = "token-mean",
        config: Any = None,
        rollout_is_weights: torch.Tensor | None = None,
        **_unused: Any,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        assert log_prob.shape == response_mask.shape == old_log_prob.shape, (log_prob.shape, response_mask.shape)
        mask = response_mask.bool()
        obj = current()
        hyper = dict(obj.hyper)
        info = dict(_cfg_get(config, "global_batch_info", {}) or {})
        agg, num_tokens, num_seqs, scale = _aggregation(loss_agg_mode, mask, info)
        old = old_log_prob.detach()  # π_θold: the rollout correction's anchor, and the proximal snapshot
        rollout_logp, folded_frac, loss_weight = _fold_weights(old, mask, rollout_is_weights)
        inputs = ObjectiveInputs(
            log_prob,
            rollout_logp,
            mask,
            advantages,
            old_logp=old,
            prox_logp=old,
            num_tokens=num_tokens,
            num_seqs=num_seqs,
            group=data_parallel_group(),
            loss_weight=loss_weight,
        )
        hyper["agg"] = agg
        loss, stats = obj.rec.fn(inputs, **hyper)  # hyper: every keyword, resolved by the record
        loss = loss * scale
        with torch.no_grad():
            ppo_kl = torch.where(mask, old_log_prob.detach() - log_prob.detach(), 0.0).sum() / mask.sum().clamp(min=1)
        metrics = _loss_metrics(stats, ppo_kl, folded_frac)
        if os.environ.get(ENV_MONITOR, "1") != "0":
            if not monitors:
                monitors.append(OffPolicyMonitor(max_len=mask.shape[1], group=inputs.group or False, source="verl"))
            row = monitors[0].update(log_prob.detach(), rollout_logp, mask)
            metrics.update({k: v for k, v in prefixed(row, "actor/offpolicy/").items() if math.isfinite(v)})
        return loss, metrics

    policy_loss.__name__ = f"p3o_policy_loss_{objective}"
    policy_loss.__doc__ = f"p3o objective {objective!r} as a verl policy loss (see p3o.integrations.verl)."
    return policy_loss


def register_objective(loss_mode: str, objective: str, **objective_kwargs: Any) -> PolicyLossFn:
    """Register p3o's ``objective`` (with fixed hyper-parameters) with verl as ``loss_mode``; returns the loss."""
    core_algos = _core_algos()
    loss_fn = make_policy_loss(objective, **objective_kwargs)
    core_algos.register_policy_loss(loss_mode)(loss_fn)
    return loss_fn


def register(names: Iterable[str] | None = None) -> list[str]:
    """Register the loss modes of :data:`LOSS_MODES` (all, or ``names``) with verl; returns the names registered.

    Needs verl (``pip install 'p3o[verl]'``); an unknown name raises ConfigError listing the known ones.
    """
    names = list(LOSS_MODES if names is None else names)
    unknown = [n for n in names if n not in LOSS_MODES]
    if unknown:
        raise ConfigError(f"loss_mode: unknown p3o loss {unknown[0]!r}; known: {', '.join(LOSS_MODES)}")
    for name in names:
        register_objective(name, LOSS_MODES[name])
    return names


if importlib.util.find_spec("verl") is not None:
    register()
