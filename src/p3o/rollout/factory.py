"""One place that turns engine settings into a rollout engine: ``hf`` (p3o's own sampler) or ``vllm``.

    settings = EngineSettings.from_config(cfg.rollout, seed=cfg.seed, device="auto")   # p3o.rollout.settings
    engine = make_engine(settings, model, tokenizer)
    engine = make_engine("hf", model, tokenizer, precision="bf16", max_new_tokens=64)  # a kind and fields

Every engine takes the same record (:class:`p3o.rollout.settings.EngineSettings`: precision, temperature, top_p,
top_k, max_new_tokens, logprob_mode, seed, device, the vLLM KV-cache settings) and implements
:class:`p3o.rollout.base.RolloutEngine`. The vLLM engine is imported only when asked for, so the default install
never needs vLLM.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from p3o.rollout.base import RolloutEngine
from p3o.rollout.settings import ENGINES, EngineSettings


def make_engine(
    settings: EngineSettings | str, model: nn.Module | str, tokenizer: Any, **kwargs: Any
) -> RolloutEngine:
    """A rollout engine of kind ``settings.engine`` holding its own copy of ``model`` (an HF model, or a model dir).

    Args:
        settings: the engine settings, or an engine kind ("hf" | "vllm") for the default settings of that kind.
        kwargs: fields of the record laid over it (``temperature=0.0``), or the engine's own keywords (stop / pad
            ids; hf: ``fast_decode``; vllm: ``max_model_len``, ``llm_kwargs``).

    Raises ConfigError (one line naming ``rollout.engine``) for an unknown kind.
    """
    if isinstance(settings, str):
        settings = EngineSettings(engine=settings)
    if settings.engine == "hf":
        import p3o.rollout  # call-time lookup: `p3o.rollout.HFEngine` can be swapped (tests, subclasses)

        return p3o.rollout.HFEngine(model, tokenizer, settings=settings, **kwargs)
    from p3o.rollout.vllm import VLLMEngine  # optional: vllm (extra vllm), only when asked for

    return VLLMEngine(model, tokenizer, settings=settings, **kwargs)


__all__ = ["ENGINES", "make_engine"]
