"""Named presets for the experiment grid: off-policy regimes and objective settings, as dotted config overrides.

Every value is expressed with exactly the config keys of docs/contracts.md, so a preset is nothing more than the
command-line overrides `p3o train` would take:

    REGIMES["stale-4"]            # {"loop.mode": "stale", "loop.staleness": 4}
    OBJECTIVE_PRESETS["grpo-0.4"]  # {"objective.name": "grpo", "objective.clip_eps": 0.4}
"""

from __future__ import annotations

import difflib
from typing import Any

Overrides = dict[str, Any]

#: MinPRO's prefix statistics other than its own min (the ablations below).
PREFIX_STATS = ("mean", "geomean", "prod")


def _at_defaults(*names: str) -> dict[str, Overrides]:
    """A preset per objective, named as it, at the objective's own defaults."""
    return {name: {"objective.name": name} for name in names}


def _temperature_mismatch(t: float) -> Overrides:
    """The engine samples at temperature `t` and records raw (T = 1) log-probs; the trainer runs at T = 1."""
    return {"loop.mode": "sync", "rollout.temperature": t, "train.temperature": 1.0, "rollout.logprob_mode": "raw"}


#: Regimes that make the training batch off-policy (docs/training.md, "The pipelines").
REGIMES: dict[str, Overrides] = {
    # Generate → update once → push weights: every ratio starts at 1.
    "on-policy": {"loop.mode": "sync"},
    # Four optimizer steps per rollout batch: mini-batches 2..4 are trained on data of an older policy.
    "multi-step": {"loop.mode": "sync", "update.num_mini_batches": 4},
    # A FIFO delay: rollouts generated at step k are trained on at step k + n (the MinPRO paper's buffer).
    **{f"stale-{n}": {"loop.mode": "stale", "loop.staleness": n} for n in (2, 4, 8)},
    # Generation runs concurrently with training, at most 4 policy versions behind.
    "async": {"loop.mode": "async", "loop.max_lag": 4},
    # A low-precision rollout engine (W8A8 quantise–dequantise) against a full-precision trainer.
    **{f"{p}-rollout": {"loop.mode": "sync", "rollout.precision": p} for p in ("fp8", "int8", "bf16")},
    # A real inference engine: vLLM in bf16 against the fp32 trainer, one update per batch, so only the engine's
    # kernels / sampler move the ratios (the P3O paper's clip-sensitivity mechanism). Needs vLLM (docs/vllm.md).
    "vllm-bf16": {
        "loop.mode": "sync",
        "rollout.engine": "vllm",
        "rollout.precision": "bf16",
        "update.num_mini_batches": 1,
    },
    # The same with vLLM's FP8 KV cache: a larger real mismatch that a CPU can produce (fp8 weights need a GPU).
    "vllm-bf16-kvfp8": {
        "loop.mode": "sync",
        "rollout.engine": "vllm",
        "rollout.precision": "bf16",
        "rollout.kv_cache_dtype": "fp8",
        "update.num_mini_batches": 1,
    },
    # Eight optimizer steps per rollout batch (the calibrated multi-step regime).
    "multi-step-8": {"loop.mode": "sync", "update.num_mini_batches": 8},
    # MinPRO's "stale n" counts global steps of several updates each: with 4 updates per batch, stale-n delays a
    # batch by n batches = 4n..4n+3 optimizer updates (the paper: 16 updates per global step).
    "mb4-stale-0": {"loop.mode": "sync", "update.num_mini_batches": 4},
    **{f"mb4-stale-{n}": {"loop.mode": "stale", "loop.staleness": n, "update.num_mini_batches": 4} for n in (2, 4, 8)},
    # The P3O paper's temperature mismatch at both of its temperatures (raw T = 1 log-probs recorded).
    **{f"temp-{t}": _temperature_mismatch(t) for t in (0.6, 1.2)},
    # The P3O paper's temperature mismatch: engine samples at T = 1.2 and records raw (T = 1) log-probs.
    "temperature": _temperature_mismatch(1.2),
}

#: Objective settings compared in the papers. DAPO's dynamic sampling is a data-side feature of the loop
#: (`loop.dynamic_sampling`) and is left off here so that every objective sees the same data.
OBJECTIVE_PRESETS: dict[str, Overrides] = {
    "p3o": {"objective.name": "p3o"},
    # P3O's policy-gradient part alone: the p3o record with its KL term off (the probe's decomposition).
    "p3o-pg": {"objective.name": "p3o", "objective.kl_estimator": "none"},
    # P3O with the other KL estimators (beyond the paper; k3 is the paper's and the default): k3_is = ρ·k3(1/ρ) is
    # unbiased for KL(π_θ‖π_b) on π_b's samples, k2 = ½·lr².
    "p3o-k3_is": {"objective.name": "p3o", "objective.kl_estimator": "k3_is"},
    "p3o-k2": {"objective.name": "p3o", "objective.kl_estimator": "k2"},
    # P3O with its KL term taken against the proximal snapshot (beyond the paper; = p3o-pg with one step per batch).
    "p3o-kl-prox": {"objective.name": "p3o", "objective.kl_anchor": "proximal"},
    "grpo": {"objective.name": "grpo", "objective.clip_eps": 0.2},
    **{f"grpo-{eps}": {"objective.name": "grpo", "objective.clip_eps": eps} for eps in (0.2, 0.4, 0.6)},
    "grpo-tis": {"objective.name": "grpo", "objective.clip_eps": 0.2, "objective.rollout_correction": "token-tis"},
    **_at_defaults("dapo", "gspo", "cispo", "minpro", "m2po", "decoupled_ppo"),
    # ---- paper-faithful baselines (../PAPERS: the settings each paper ran) ----
    # The P3O paper's GRPO: token-mean over the optimizer step (as P3O), symmetric clip ε ∈ {0.2, 0.4, 0.6}.
    # Same aggregation as `p3o`, so on fresh data `grpo-tm-*` and `p3o` give identical runs (claim a; bit-identical
    # when the recorded log-probs are the trainer's own).
    **{
        f"grpo-tm-{eps}": {"objective.name": "grpo", "objective.clip_eps": eps, "objective.agg": "token-mean"}
        for eps in (0.2, 0.4, 0.6)
    },
    # The P3O paper's GRPO with truncated importance sampling against the engine (token-TIS, cap 2), token-mean.
    "grpo-tm-tis": {
        "objective.name": "grpo",
        "objective.clip_eps": 0.2,
        "objective.agg": "token-mean",
        "objective.rollout_correction": "token-tis",
    },
    # The MinPRO paper's GRPO: clip-higher 0.2 / 0.28, token-mean (= DAPO's loss without its data-side tricks).
    "grpo-minpro": {
        "objective.name": "grpo",
        "objective.clip_eps_low": 0.2,
        "objective.clip_eps_high": 0.28,
        "objective.agg": "token-mean",
    },
    # The MinPRO paper's GSPO: sequence-ratio clip at ε = 2e-3 on both sides.
    "gspo-2e-3": {"objective.name": "gspo", "objective.clip_eps_low": 2e-3, "objective.clip_eps_high": 2e-3},
    # CISPO and MinPRO with the MinPRO paper's truncation (ε_l, ε_h) = (1, 4); M2PO at τ = 0.04.
    "cispo-1-4": {"objective.name": "cispo", "objective.trunc_eps_low": 1.0, "objective.trunc_eps_high": 4.0},
    "minpro-1-4": {"objective.name": "minpro", "objective.trunc_eps_low": 1.0, "objective.trunc_eps_high": 4.0},
    "m2po-0.04": {"objective.name": "m2po", "objective.tau": 0.04},
    # MinPRO's prefix statistic over the strictly earlier tokens, times ρ_t (min is MinPRO itself). The earlier
    # studies (minpro-stale3) ran these as "the ablation"; the paper's ablation is the `-incl` set below.
    **{f"minpro-{stat}": {"objective.name": "minpro", "objective.prefix_stat": stat} for stat in PREFIX_STATS},
    # The MinPRO paper's prefix-statistic ablation (section 5.3): the statistic of ρ_1 … ρ_t, the current token
    # included, replaces the whole weight m_t·ρ_t; same truncation (1, 4) and stop-gradient as MinPRO.
    **{
        f"minpro-{stat}-incl": {
            "objective.name": "minpro",
            "objective.prefix_stat": stat,
            "objective.prefix_scope": "including",
            "objective.trunc_eps_low": 1.0,
            "objective.trunc_eps_high": 4.0,
        }
        for stat in PREFIX_STATS
    },
    # M2PO as its public code runs it: the second-moment budget τ = 0.04 as one PPO clip range per micro-batch.
    "m2po-clip-0.04": {"objective.name": "m2po_clip", "objective.tau": 0.04},
    # P3O with both the rollout and a proximal anchor (the paper's P4O); GRPO + decoupled loss for async.
    "p3o-two-anchor": {"objective.name": "p3o_two_anchor"},
    "decoupled-ppo-0.2": {"objective.name": "decoupled_ppo", "objective.clip_eps": 0.2},
    # ---- the objectives of issue 21 at their reference defaults (docs/objectives.md gives each one's source) ----
    # GMPO: log-space window [e^-0.4, e^0.4] (the GMPO README and verl example); SAPO: τ+ 1.0, τ- 1.05 (verl, SkyRL,
    # AReaL); DPPO: prime-rl's default loss (Δ-mask 0.2 / 0.2, adv_tau 1, kl_tau 1e-3); TOPR: the paper's sequence
    # form (no hyper-parameter); GPG: plain REINFORCE; KL-Cov / Clip-Cov: verl's defaults (ratio 2e-4, β 0.1 /
    # band [1, 5], ε 0.2).
    **_at_defaults("gmpo", "sapo", "dppo", "topr", "gpg", "kl_cov", "clip_cov"),
    # DRO / Kimi-1.5 has no reference default (verl: dro_beta is required); β = 0.1 is ROLL's kimi15_tau default,
    # the one published default of this loss family.
    "dro-0.1": {"objective.name": "dro", "objective.beta": 0.1},
    # Token-mean GRPO ε = 0.2 with each new rollout correction (the ratio is then anchored at π_θold and the
    # correction carries π_θold/π_b). Bounds: IcePop [0.5, 5] (verl's IcePop presets, OpenRLHF's default); seq-TIS
    # cap 2 (verl's decoupled_seq_is); Geo-RS [0.5, 2] (verl's legacy reciprocal default and SkyRL's product band:
    # verl's presets 0.999–1.001 are for rows of thousands of tokens, a toy row has 8); seq-max k2 / k3 U = 2.5
    # (verl's documented example; no preset uses them).
    "grpo-tm-icepop": {
        "objective.name": "grpo",
        "objective.clip_eps": 0.2,
        "objective.agg": "token-mean",
        "objective.rollout_correction": "token-icepop",
        "objective.rollout_correction_low": 0.5,
        "objective.rollout_correction_cap": 5.0,
    },
    "grpo-tm-seq-tis": {
        "objective.name": "grpo",
        "objective.clip_eps": 0.2,
        "objective.agg": "token-mean",
        "objective.rollout_correction": "seq-tis",
        "objective.rollout_correction_cap": 2.0,
    },
    "grpo-tm-geo-rs": {
        "objective.name": "grpo",
        "objective.clip_eps": 0.2,
        "objective.agg": "token-mean",
        "objective.rollout_correction": "geo-rs",
        "objective.rollout_correction_low": 0.5,
        "objective.rollout_correction_cap": 2.0,
    },
    "grpo-tm-seq-max-k2": {
        "objective.name": "grpo",
        "objective.clip_eps": 0.2,
        "objective.agg": "token-mean",
        "objective.rollout_correction": "seq-max-k2",
        "objective.rollout_correction_cap": 2.5,
    },
    "grpo-tm-seq-max-k3": {
        "objective.name": "grpo",
        "objective.clip_eps": 0.2,
        "objective.agg": "token-mean",
        "objective.rollout_correction": "seq-max-k3",
        "objective.rollout_correction_cap": 2.5,
    },
}


def _lookup(table: dict[str, Overrides], name: str, kind: str) -> Overrides:
    if name not in table:
        near = difflib.get_close_matches(name, table, n=1)
        hint = f" (did you mean '{near[0]}'?)" if near else ""
        raise KeyError(f"unknown {kind} '{name}'{hint}; known: {', '.join(table)}")
    return dict(table[name])


def regime_overrides(name: str) -> Overrides:
    """The dotted overrides of regime `name`; KeyError naming the known regimes otherwise."""
    return _lookup(REGIMES, name, "regime")


def objective_overrides(name: str) -> Overrides:
    """The dotted overrides of objective preset `name`; KeyError naming the known presets otherwise."""
    return _lookup(OBJECTIVE_PRESETS, name, "objective preset")
