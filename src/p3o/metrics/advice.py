"""What to do about an off-policy finding: `suggest(name, cause, source, origin, config)`, in the words of the
trainer that logged the rows (p3o, TRL, verl), fitted to the run's own config (p3o runs: config.yaml).

A setting is named only when the run can still change it (no "lower loop.max_lag" on a sync run, no "fp32" on an
fp32 engine), and an objective only when the run does not already train with one that does what the advice asks:
the objective registry says how each objective bounds a token's weight (`objective_bounds`: an ESS cap, a hard
clip, or soft weights), never a list of names here. The findings themselves are `p3o.metrics.rules`'.

    suggest("low_ess", "staleness", "p3o", config={"loop": {"mode": "async", "max_lag": 4}})
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from importlib import resources
from typing import Any

__all__ = ["SIGNAL_CAUSES", "SOURCES", "objective_bounds", "suggest"]

#: The no-signal finding's causes (`p3o.metrics.rules`' ``_no_signal``).
SIGNAL_CAUSES = ("unsolved", "solved", "tied")
#: Where the fixes live, per trainer (the source the metrics came from): the settings a suggestion names.
SOURCES = ("p3o", "trl", "verl")

# what to do, per cause and trainer: (staleness, engine, sync). "generic": a loop of one's own.
_FIX: dict[str, dict[str, str]] = {
    "staleness": {
        "p3o": "lower loop.max_lag (async; loop.staleness in stale mode) and update.epochs / update.num_mini_batches",
        "trl": "lower GRPOConfig.steps_per_generation (toward gradient_accumulation_steps) and num_iterations "
        "(toward 1)",
        "verl": "lower async_training.staleness_threshold (fully async) and actor_rollout_ref.actor.ppo_epochs / the "
        "mini-batches per step",
        "generic": "train on fresher data: fewer optimizer steps per generated batch, a smaller maximum lag",
    },
    "engine": {
        "p3o": "record rollout log-probs in fp32 (rollout.precision fp32, rollout.kv_cache_dtype auto), "
        "rollout.logprob_mode processed with top-p/top-k, train.temperature equal to rollout.temperature",
        "trl": "keep the ratio against vLLM's own log-probs (P3OGRPOTrainer does; a plain GRPOTrainer: "
        "vllm_importance_sampling_correction=True, its default); colocated vLLM runs in bf16 whatever the "
        "checkpoint (TRL passes it no dtype): for fp32 log-probs serve it with `trl vllm-serve --dtype float32` "
        "(vllm_mode='server', with --kv-cache-dtype auto)",
        "verl": "actor_rollout_ref.rollout.dtype float32 (or bfloat16 on both sides), and "
        "algorithm.rollout_correction (rollout_is=token, rollout_is_threshold=inf) so the ratio sees the mismatch",
        "generic": "record the engine's log-probs in fp32, with the trainer's temperature and processed log-probs "
        "under top-p/top-k",
    },
    "inflight": {
        "p3o": "expected with rollout.inflight_updates: a token sampled after a push in the middle of a turn reads "
        "the KV cache that the older weights computed, so its recorded log-prob is of neither version alone (the "
        "ratios stay exact: they use it); to measure the engine itself, run once with rollout.inflight_updates "
        "false (or p3o mismatch)",
        "trl": "expected when weights are pushed while vLLM generates: tokens after a push read KV computed by the "
        "older weights; measure the engine without in-flight updates",
        "verl": "expected with partial rollouts / in-flight weight updates: tokens after a push read KV computed by "
        "the older weights; measure the engine without them",
        "generic": "expected with in-flight weight updates: tokens after a push read KV computed by the older "
        "weights; measure the engine without them",
    },
    "sync": {
        "p3o": "the engine's load_weights is not taking the pushed weights (LoRA adapters not merged? a quantised "
        "copy not re-quantised?): compare the engine's log-probs with the trainer's right after a push",
        "trl": "TRL's weight sync is not reaching vLLM (LoRA not merged, a repacked CPU backend): use "
        "P3OGRPOTrainer (its CheckedVLLMSync probes the sync) or p3o.integrations.trl.reload_vllm_weights",
        "verl": "verl's weight sync is not reaching the rollout engine (LoRA adapters, e.g. verl #7495: check "
        "actor_rollout_ref.rollout.load_format and layered_summon)",
        "generic": "the rollout engine is not loading the pushed weights: check the weight sync",
    },
}

_OBJECTIVE_ADVICE = {
    "staleness": "train with a soft objective (P3O, MinPRO, CISPO, M2PO), not a hard clip (p3o docs metrics, "
    "'Which objective when')",
    "engine": "with a mismatched engine use P3O or a wide clip",
}

_EXTRA = {
    "position_drift": "suspect the KV cache or attention precision (an FP8 KV cache: kv_cache_dtype auto); shorter "
    "responses; P3O's ESS cap bounds the late tokens' weights",
    "prefix_decay": "MinPRO-style prefix weights would silence the later tokens of long responses",
    "nonfinite": "NaN/inf log-probs: check the engine's dtype and the tokenizer (ids out of the vocabulary)",
    "kl_clamped": "ratios beyond e^20: a tokenizer, temperature or precision mismatch between engine and trainer",
    "ess_degenerate": "empty or non-finite ESS sums: NaN/inf log-probs somewhere",
}


# p3o's staleness fix when the lag's origin is known (staleness_origin)
_FIX_P3O_ORIGIN = {
    "mini-batches": "fewer optimizer steps per rollout batch: lower update.num_mini_batches (each mini-batch after "
    "the first is scored by a policy the earlier ones moved) and update.epochs",
    "policy lag": "lower loop.max_lag (async; loop.staleness in stale mode)",
}


_TINY_NOTE = (
    "; the built-in tiny model knows only the built-in arithmetic wording: p3o docs tasks, 'Which models learn which "
    "data'"
)
_SIGNAL_FIX = {
    "unsolved": "a task the model can solve some of the time: an easier task or a stronger base model (task and model"
    + _TINY_NOTE
    + "), a prompt format or template the model knows, a larger group so that a rare success shows up",
    "solved": "a harder task (nothing is left to learn here), or evaluate the model instead of training it",
    "tied": "a larger group, a higher sampling temperature, or a reward that tells samples apart (partial credit)",
}
# where the no-signal fixes live, per trainer
_SIGNAL_SETTINGS = {
    "p3o": {"group": "rollout.group_size", "task": "task.name / model.name", "template": "task.template"},
    "trl": {"group": "GRPOConfig.num_generations", "task": "the dataset / the model", "template": "the chat template"},
    "verl": {"group": "actor_rollout_ref.rollout.n", "task": "data.train_files / the model", "template": "the prompt"},
}
#: Keywords of an objective that clip or mask its ratio to a fixed range: the PPO family's hard clip.
_CLIP_KEYWORDS = frozenset({"clip_eps", "clip_eps_low", "clip_eps_high", "mask_low", "mask_high"})


@functools.cache
def _objective_keywords() -> dict[str, dict[str, str]]:
    """Each registered objective's keywords and their types, from the registry's packaged snapshot
    (``p3o/configs/objectives-keys.json``, which a test keeps equal to `p3o.objectives`' records: reading it imports
    no torch, as the doctor must not)."""
    text = resources.files("p3o").joinpath("configs", "objectives-keys.json").read_text(encoding="utf-8")
    return {name: dict(rec["hypers"]) for name, rec in json.loads(text).items()}


def objective_bounds(name: Any, config: Mapping[str, Any] | None = None) -> str | None:
    """How objective `name` bounds an off-policy token's weight, asked of the objective registry (its keywords):

    ``"ess"``: an ESS cap (a ``cap`` keyword set to ``ess``: P3O; the run's ``objective.cap`` decides when it has
    one); ``"clip"``: a hard clip or mask of the ratio to a fixed range (``clip_eps*``, ``mask_*``: GRPO, DAPO,
    GSPO, GMPO, DPPO ...; or ``objective.cap clip``); ``"soft"``: any other registered objective (truncated,
    gated or budgeted weights, or no ratio: MinPRO, CISPO, M2PO, SAPO, TOPR ...); None: not a registered name.
    """
    hypers = _objective_keywords().get(str(name)) if name is not None else None
    if hypers is None:
        return None
    if "cap" in hypers and "'ess'" in hypers["cap"]:
        cap = _get(config, "objective.cap")
        return "clip" if cap == "clip" else "ess"
    if _CLIP_KEYWORDS & set(hypers):
        return "clip"
    return "soft"


def _get(config: Mapping[str, Any] | None, dotted: str) -> Any:
    """``config["a"]["b"]`` for ``"a.b"`` (None when a level is missing or not a mapping)."""
    obj: Any = config
    for part in dotted.split("."):
        obj = obj.get(part) if isinstance(obj, Mapping) else None
    return obj


def _p3o_staleness_fix(origin: str, config: Mapping[str, Any] | None) -> str:
    """p3o's staleness fix, only the settings that this run's config can still lower (all of them without one)."""
    mode = _get(config, "loop.mode")
    if mode is None:  # no config, or one that does not say its loop: every setting that could lower the lag
        return _FIX_P3O_ORIGIN.get(origin, _FIX["staleness"]["p3o"])
    lag_key = {"async": "loop.max_lag", "stale": "loop.staleness", "reuse": "loop.reuse_epochs"}.get(str(mode))
    parts = []
    if lag_key and origin != "mini-batches" and (_get(config, lag_key) or 0) > (1 if mode == "reuse" else 0):
        parts.append(f"lower {lag_key} (this run: {_get(config, lag_key)})")
    mini = [f"update.{k} (this run: {_get(config, 'update.' + k)})" for k in ("num_mini_batches", "epochs")]
    mini = [m for k, m in zip(("num_mini_batches", "epochs"), mini) if (_get(config, "update." + k) or 1) > 1]
    if mini and origin != "policy lag":
        parts.append("fewer optimizer steps per rollout batch: lower " + " and ".join(mini))
    if not parts:
        return f"this run's settings already give the least lag they can (loop.mode {mode}, one update per batch)"
    return "; ".join(parts)


def _p3o_engine_fix(config: Mapping[str, Any] | None) -> str:
    """p3o's engine fix, only the settings where this run's engine differs from the trainer (all without a config)."""
    if config is None:
        return _FIX["engine"]["p3o"]
    parts = []
    if _get(config, "rollout.precision") not in (None, "fp32"):
        parts.append(f"rollout.precision fp32 (this run: {_get(config, 'rollout.precision')})")
    if _get(config, "rollout.kv_cache_dtype") not in (None, "auto"):
        parts.append(f"rollout.kv_cache_dtype auto (this run: {_get(config, 'rollout.kv_cache_dtype')})")
    sampled = (_get(config, "rollout.top_p") or 1.0) < 1.0 or (_get(config, "rollout.top_k") or 0) > 0
    if sampled and _get(config, "rollout.logprob_mode") == "raw":
        parts.append("rollout.logprob_mode processed (this run samples with top-p / top-k but records raw log-probs)")
    t_roll, t_train = _get(config, "rollout.temperature"), _get(config, "train.temperature")
    if t_roll is not None and t_train is not None and t_roll != t_train:
        parts.append(f"train.temperature equal to rollout.temperature (this run: {t_train} vs {t_roll})")
    compute = _get(config, "train.mixed_precision")
    if compute not in (None, "no"):
        parts.append(f"the trainer computes in {compute} (train.mixed_precision): the ratios see its rounding too")
    if not parts:
        return (
            "this run's engine already matches the trainer's settings (fp32, same temperature): measure the "
            "engine's own numerics with p3o mismatch"
        )
    return "; ".join(parts)


def _objective_advice(cause: str, config: Mapping[str, Any] | None) -> str:
    """The objective to train with, for ``cause`` (staleness / engine), unless the run already trains with one that
    does what the advice asks (`objective_bounds`: the registry says how it bounds a token's weight)."""
    objective = _get(config, "objective.name")
    bounds = objective_bounds(objective, config)
    if cause == "staleness":
        if bounds in ("ess", "soft"):
            return ""  # it already trains with a soft objective
        if bounds == "clip":
            return f"this run uses the hard clip '{objective}': " + _OBJECTIVE_ADVICE["staleness"]
        return _OBJECTIVE_ADVICE["staleness"]
    if bounds == "ess":
        return ""  # an ESS cap is what the engine advice asks for
    if bounds == "clip":
        return f"this run uses '{objective}': " + _OBJECTIVE_ADVICE["engine"]
    return _OBJECTIVE_ADVICE["engine"]


def suggest(
    name: str,
    cause: str,
    source: str | None = None,
    origin: str = "",
    config: Mapping[str, Any] | None = None,
) -> str:
    """What to do about finding ``name`` with ``cause``, naming the settings of ``source`` (``p3o``, ``trl``,
    ``verl``; None: generic words); ``origin`` (:func:`staleness_origin`) narrows p3o's staleness fix.

    ``config`` (a p3o run's config as a nested mapping: config.yaml) makes the advice fit the run: a setting is named
    only when the run can still change it (no "lower loop.max_lag" on a sync run, no "fp32" on an fp32 engine), and an
    objective only when the run does not already train with it (no "use P3O" on a P3O run).
    """
    src = source if source in SOURCES else "generic"
    if cause in SIGNAL_CAUSES:
        words = _SIGNAL_SETTINGS.get(src, {})
        text = _SIGNAL_FIX[cause]
        if words:
            text = text.replace("a larger group", f"a larger group ({words['group']})")
            text = text.replace("(task and model;", f"({words['task']};")
            text = text.replace("a format or template", f"a format or template ({words['template']})")
            text = text.replace("template the model knows", f"template the model knows ({words['template']})")
        model = _get(config, "model.name")
        if model is not None and not str(model).startswith("tiny"):  # the tiny model's limits are not this run's
            text = text.replace(_TINY_NOTE, "; see p3o docs tasks, 'Which models learn which data'")
        group = _get(config, "rollout.group_size")
        if group is not None and cause != "solved":
            text += f" (this run: {group} samples per prompt)"
        return text
    fit = config if src == "p3o" else None
    parts = []
    if name in _EXTRA and (name != "position_drift" or cause in ("engine", "both", "undetermined")):
        parts.append(_EXTRA[name])
    if cause in ("staleness", "both", "undetermined"):
        fix = _p3o_staleness_fix(origin, fit) if src == "p3o" else _FIX["staleness"][src]
        parts.append("; ".join(p for p in (fix, _objective_advice("staleness", config)) if p))
    if cause in ("engine", "both", "undetermined") and name not in ("nonfinite", "kl_clamped", "ess_degenerate"):
        fix = _p3o_engine_fix(fit) if src == "p3o" else _FIX["engine"][src]
        parts.append("; ".join(p for p in (fix, _objective_advice("engine", config)) if p))
    if cause in ("sync", "inflight"):
        parts.append(_FIX[cause][src])
    text = "; ".join(p for p in parts if p)
    return ("staleness or engine (no lag recorded): " + text) if cause == "undetermined" else text
