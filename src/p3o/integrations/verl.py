"""verl plug-in: p3o's objectives as verl policy losses (``register_policy_loss``), so that

    actor_rollout_ref.actor.policy_loss.loss_mode=p3o        (or minpro, m2po, p3o_grpo, p3o_dapo, ...)

works in verl >= 0.9. verl's workers import this module when it is named in ``VERL_USE_EXTERNAL_MODULES``::

    VERL_USE_EXTERNAL_MODULES=p3o.integrations.verl python -m verl.trainer.main_ppo \\
        actor_rollout_ref.actor.policy_loss.loss_mode=p3o ...

(or through the ``verl.plugins`` entry point when p3o's package metadata declares one). Importing this module
without verl is fine: registration happens in :func:`register`, called on import only when verl is installed.

What verl hands a policy loss, and how it maps onto ``p3o.objectives.ObjectiveInputs`` (verl 0.9.1,
``verl/workers/utils/losses.py::ppo_loss`` calls the loss once per micro-batch):

* ``old_log_prob`` (N, T) → ``rollout_logp``, the ratio's denominator: the actor's recomputed π_old, or — with
  ``algorithm.rollout_correction.bypass_mode=true`` — the rollout engine's own log-probs. (In verl 0.9.1 bypass
  mode also forces ``loss_mode=bypass_mode``, so with this plug-in the anchor is π_old; verl's rollout
  correction below then handles the engine mismatch.)
* ``rollout_is_weights`` (N, T) or None (verl's truncated/masked π_old/π_rollout weights, detached) multiply the
  per-token loss, as in verl's built-in losses. It is passed to the objective's own ``token-tis`` modifier with an
  infinite cap through ``old_logp`` = old_log_prob + log w, which reproduces w exactly.
* ``loss_agg_mode`` and ``config.global_batch_info`` (dp_size, batch_num_tokens, global_batch_size,
  loss_scale_factor) reproduce verl's ``agg_loss`` exactly: e.g. ``token-mean`` is Σ ℓ / batch_num_tokens · dp_size
  (FSDP averages gradients over the dp ranks). Hence ``agg`` may not be set in the objective's keywords.
* The ESS is the micro-batch's, all-reduced (MAX then SUM of the log-space sums) over verl's data-parallel group:
  Megatron's data(+context)-parallel group when megatron's parallel state is initialised, otherwise the default
  group. With FSDP + Ulysses every sequence-parallel rank holds the same micro-batch; duplicating all tokens k times
  leaves Σρ²/... i.e. the ESS unchanged, so the default group gives the data-parallel value.

Hyper-parameters: ``register_objective("minpro_eps2", "minpro", clip_eps_high=2.0)`` in a module of your own
(listed in VERL_USE_EXTERNAL_MODULES), or the environment variable ``P3O_OBJECTIVE_KWARGS`` (a JSON object, e.g.
``'{"clip_eps_high": 2.0}'``) read by every p3o loss at call time. The objective's stats appear in verl's metrics
as ``actor/objective/<stat>`` (``actor/objective/ess``, ``actor/objective/kl_weight``, ...), plus verl's usual
``actor/pg_clipfrac`` and ``actor/ppo_kl``.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import math
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
import torch.distributed as dist

from p3o.errors import ConfigError
from p3o.integrations._common import default_group, resolve_objective, stats_to_floats
from p3o.objectives import ObjectiveInputs

__all__ = ["ENV_KWARGS", "LOSS_MODES", "data_parallel_group", "make_policy_loss", "register", "register_objective"]

LOSS_MODES: dict[str, str] = {
    "p3o": "p3o",
    "minpro": "minpro",
    "m2po": "m2po",
    "p3o_grpo": "grpo",
    "p3o_dapo": "dapo",
    "p3o_gspo": "gspo",
    "p3o_cispo": "cispo",
}
"""verl ``loss_mode`` -> p3o objective registered by :func:`register`. verl already owns ``gspo`` / ``cispo``, so
p3o's versions of the baselines carry a ``p3o_`` prefix. ``p3o_two_anchor`` and ``decoupled_ppo`` need a third
log-prob (π_prox distinct from π_b) that verl does not pass to a policy loss, so they are not registered."""

ENV_KWARGS = "P3O_OBJECTIVE_KWARGS"
VERL_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-sum-norm", "seq-mean-token-mean")

PolicyLossFn = Callable[..., tuple[torch.Tensor, dict[str, Any]]]


def _core_algos() -> Any:
    try:
        from verl.trainer.ppo import core_algos
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
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{ENV_KWARGS}: not valid JSON ({e.msg} at char {e.pos})") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{ENV_KWARGS}: must be a JSON object of keyword -> value, got {type(value).__name__}")
    return value


@functools.lru_cache(maxsize=32)
def _checked_env_kwargs(objective: str, raw: str) -> tuple[tuple[str, Any], ...]:
    return tuple(_check_hyper(objective, _parse_env_kwargs(raw), ENV_KWARGS).items())


def _env_kwargs(objective: str) -> dict[str, Any]:
    """``$P3O_OBJECTIVE_KWARGS`` checked against ``objective`` (at call time: the variable holds the keywords of
    the one loss a run selects, which other registered losses may not accept)."""
    raw = os.environ.get(ENV_KWARGS, "").strip()
    return dict(_checked_env_kwargs(objective, raw)) if raw else {}


def _check_hyper(objective: str, hyper: Mapping[str, Any], where: str) -> dict[str, Any]:
    _, hyper = resolve_objective(objective, hyper, where=where)
    if "agg" in hyper:
        raise ConfigError(f"{where}: 'agg' is verl's actor_rollout_ref.actor.loss_agg_mode; set it there")
    if hyper.get("rollout_correction", "none") != "none":
        raise ConfigError(
            f"{where}: rollout_correction is verl's algorithm.rollout_correction (rollout_is=token|sequence); "
            "verl passes its weights to the loss"
        )
    return hyper


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


def make_policy_loss(objective: str, **objective_kwargs: Any) -> PolicyLossFn:
    """A verl policy-loss function (verl 0.9 ``PolicyLossFn`` signature) computing the p3o objective ``objective``.

    The returned ``fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
    rollout_is_weights=None) -> (loss, metrics)`` takes (N, T) tensors (advantages may be (N,)); ``loss`` is the 0-d
    loss verl back-propagates for this micro-batch, ``metrics`` a dict of floats. Keywords in ``objective_kwargs``
    (and, at call time, ``$P3O_OBJECTIVE_KWARGS``) are the objective's hyper-parameters.
    """
    fn, _ = resolve_objective(objective, None)
    base = _check_hyper(objective, objective_kwargs, "objective_kwargs")

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
        hyper = {**base, **_env_kwargs(objective)}
        info = dict(_cfg_get(config, "global_batch_info", {}) or {})
        agg, num_tokens, num_seqs, scale = _aggregation(loss_agg_mode, mask, info)
        old_logp = None
        if rollout_is_weights is not None:
            # The objective's token-tis modifier multiplies ℓ_t by min(exp(old_logp − rollout_logp), cap); with
            # rollout_logp = old_log_prob, old_logp = old_log_prob + log w and cap = ∞ that factor is w exactly.
            weights = rollout_is_weights.detach().float().expand_as(log_prob)
            old_logp = old_log_prob.detach().float() + torch.log(weights)
            hyper.update(rollout_correction="token-tis", rollout_correction_cap=math.inf)
        inputs = ObjectiveInputs(
            logp=log_prob,
            rollout_logp=old_log_prob.detach(),
            mask=mask,
            advantages=advantages,
            old_logp=old_logp,
            num_tokens=num_tokens,
            num_seqs=num_seqs,
            group=data_parallel_group(),
        )
        loss, stats = fn(inputs, agg=agg, **hyper)
        loss = loss * scale
        with torch.no_grad():
            ppo_kl = torch.where(mask, old_log_prob.detach() - log_prob.detach(), 0.0).sum() / mask.sum().clamp(min=1)
        values = stats_to_floats({**stats, "__ppo_kl": ppo_kl})
        metrics: dict[str, Any] = {
            "actor/pg_clipfrac": values.get("clipfrac", 0.0),
            "actor/ppo_kl": values.pop("__ppo_kl"),
        }
        metrics.update({f"actor/objective/{k}": v for k, v in values.items()})
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
