"""LoRA adapters (PEFT) for the trainer: wrap, merge for the rollout engine, reference = adapters off.

    policy = apply_lora(policy, cfg.model.lora, seed=cfg.seed)   # only the adapters require grad
    engine.load_weights(merged_weights(policy), version)        # W0 + (α/r)·B·A of the adapted layers only
    ref = AdaptersOff(policy)                                   # the base model, no second copy

LoRA (Hu et al. 2021, arXiv:2106.09685) replaces W by W0 + (α/r)·B·A with B (out, r), A (r, in) trainable and W0
frozen. The rollout engine holds its own plain copy of the model; at each sync it receives the merged weights of the
adapted layers only (every other tensor is the frozen base, already in the engine since it was built), so a sync
moves no embedding, norm or unadapted weight. PEFT is the optional extra ``p3o[lora]``, imported where used.
"""

from __future__ import annotations

import contextlib
import copy
import functools
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn

from p3o.errors import ConfigError

__all__ = [
    "DEFAULT_TARGETS",
    "AdaptersOff",
    "apply_lora",
    "is_lora",
    "merged_copy",
    "merged_weights",
    "require_peft",
    "resolve_target_modules",
]

_ATTN_MLP = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# Per-architecture defaults (config.model_type): every attention and MLP projection, as in the QLoRA paper's
# "all linear layers but the head" (Dettmers et al. 2023), which matters more than r for RL fine-tuning.
DEFAULT_TARGETS: dict[str, tuple[str, ...]] = {
    "llama": _ATTN_MLP,
    "mistral": _ATTN_MLP,
    "qwen2": _ATTN_MLP,
    "qwen3": _ATTN_MLP,
    "qwen2_moe": _ATTN_MLP,
    "qwen3_moe": _ATTN_MLP,
    "gemma": _ATTN_MLP,
    "gemma2": _ATTN_MLP,
    "olmo2": _ATTN_MLP,
}


def require_peft() -> Any:
    """The ``peft`` module, or an ImportError naming the extra to install."""
    try:
        import peft  # optional: peft (extra lora)
    except ImportError as e:
        raise ImportError("LoRA (model.lora.r > 0) needs PEFT: pip install 'p3o[lora]'") from e
    return peft


def is_lora(model: nn.Module) -> bool:
    """Whether `model` is a PEFT model carrying adapters (checked without importing peft)."""
    return hasattr(model, "peft_config") and hasattr(model, "disable_adapter") and hasattr(model, "get_base_model")


def _linear_names(model: nn.Module) -> list[str]:
    """Leaf names of the linear layers below the output head (candidates for target_modules)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    names = {
        name.rsplit(".", 1)[-1]
        for name, mod in model.named_modules()
        if isinstance(mod, nn.Linear) and mod is not head and name
    }
    return sorted(names)


def resolve_target_modules(model: nn.Module, target_modules: str | None) -> list[str]:
    """The module names to adapt: `target_modules` ("q_proj,v_proj", "all-linear") or the architecture's default.

    Raises ConfigError (one line naming the layers the model has) when a name matches no linear layer.
    """
    available = _linear_names(model)
    if target_modules is None:
        model_type = getattr(getattr(model, "config", None), "model_type", None)
        wanted = list(DEFAULT_TARGETS.get(str(model_type), ()))
        if not wanted or not set(wanted) <= set(available):
            return available  # unknown architecture: every linear layer but the head ("all-linear")
        return wanted
    if target_modules.strip() == "all-linear":
        return available
    wanted = [t.strip() for t in target_modules.split(",") if t.strip()]
    unknown = [t for t in wanted if t not in available]
    if not wanted or unknown:
        what = f"no linear layer named {', '.join(repr(u) for u in unknown)}" if unknown else "empty"
        raise ConfigError(
            f"model.lora.target_modules: {what} in {type(model).__name__}; its linear layers are: "
            f"{', '.join(available)} (or 'all-linear')"
        )
    return wanted


def apply_lora(model: nn.Module, cfg: Any, *, seed: int = 0) -> nn.Module:
    """Wrap `model` with LoRA adapters per `cfg` (a `p3o.config.LoraConfig`); only the adapters require grad.

    The adapters' initialisation (A ~ Kaiming-uniform, B = 0, so the wrapped model starts equal to the base) uses a
    generator seeded by `seed` alone, so every data-parallel rank builds the same adapters; the global RNG is left
    as it was.
    """
    if cfg.r < 1:
        raise ConfigError(f"model.lora.r: must be >= 1 to apply LoRA, got {cfg.r}")
    targets = resolve_target_modules(model, cfg.target_modules)
    peft = require_peft()
    peft_cfg = peft.LoraConfig(
        r=int(cfg.r),
        lora_alpha=float(cfg.alpha),
        lora_dropout=float(cfg.dropout),
        target_modules=targets,
        bias="none",
        task_type="CAUSAL_LM",
    )
    devices = [model.device] if getattr(model, "device", None) is not None and model.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        wrapped = peft.get_peft_model(model, peft_cfg, autocast_adapter_dtype=False)
    return wrapped


def _adapted_layers(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """(plain-model module name, LoRA layer) for every adapted layer of a PEFT model."""
    from peft.tuners.lora import LoraLayer  # optional: peft (extra lora)

    for name, mod in model.get_base_model().named_modules():
        if isinstance(mod, LoraLayer) and hasattr(mod, "get_delta_weight"):
            yield name, mod


@torch.no_grad()
def merged_weights(model: nn.Module) -> dict[str, Tensor]:
    """{plain-model key: W0 + (α/r)·B·A} for the adapted layers of `model` (fresh tensors, base dtype).

    The keys are those of the unwrapped HF model (``model.layers.0.self_attn.q_proj.weight``), so the dict is a
    partial state dict for the rollout engine's plain copy; every other tensor of the policy is the frozen base.
    """
    out: dict[str, Tensor] = {}
    for name, mod in _adapted_layers(model):
        base = mod.get_base_layer().weight
        w = base.detach().clone()
        for adapter in mod.active_adapters:
            if adapter in mod.lora_A:
                w += mod.get_delta_weight(adapter).to(w.dtype)
        out[f"{name}.weight"] = w
    return out


@torch.no_grad()
def merged_copy(model: nn.Module) -> nn.Module:
    """A plain HF model (no PEFT wrappers) equal to `model` with its adapters merged; `model` is unchanged.

    The merged tensors come from `merged_weights`, so the copy and a later engine sync agree bit for bit.
    """
    plain = copy.deepcopy(model).unload()
    own = plain.state_dict()
    for k, v in merged_weights(model).items():
        own[k].copy_(v)
    return plain.requires_grad_(False)


class AdaptersOff(nn.Module):
    """The base model of a PEFT policy seen with its adapters disabled: the frozen reference for `ref_kl_coef`.

    It shares every tensor with the policy (no second copy) and registers none of them, so `.eval()` or
    `.requires_grad_(False)` on it never touch the policy. It offers what `p3o.logprobs.token_logprobs` uses: the
    output head and a decoder whose forward runs under `disable_adapter()`.
    """

    def __init__(self, policy: nn.Module) -> None:
        super().__init__()
        object.__setattr__(self, "_policy", policy)
        decoder = policy.get_base_model().get_decoder()
        object.__setattr__(self, "_decoder", _AdaptersOffDecoder(policy, decoder))

    def get_output_embeddings(self) -> nn.Module:
        """The (shared, never adapted) vocabulary head."""
        return self._policy.get_base_model().get_output_embeddings()

    def get_decoder(self) -> nn.Module:
        """The decoder stack, run with the adapters disabled."""
        return self._decoder

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The base model's forward (adapters disabled)."""
        with _adapters_disabled(self._policy):
            return self._policy(*args, **kwargs)


class _AdaptersOffDecoder(nn.Module):
    def __init__(self, policy: nn.Module, decoder: nn.Module) -> None:
        super().__init__()
        object.__setattr__(self, "_policy", policy)
        object.__setattr__(self, "_inner", decoder)

        @functools.wraps(decoder.forward)  # keeps the signature: token_logprobs inspects the cache keyword
        def forward(*args: Any, **kwargs: Any) -> Any:
            with _adapters_disabled(policy):
                return decoder(*args, **kwargs)

        object.__setattr__(self, "forward", forward)


@contextlib.contextmanager
def _adapters_disabled(policy: nn.Module) -> Iterator[None]:
    with policy.disable_adapter():
        yield
