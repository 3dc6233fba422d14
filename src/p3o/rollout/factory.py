"""One place that turns ``rollout.engine`` into a rollout engine: ``hf`` (p3o's own sampler) or ``vllm``.

    engine = make_engine("hf", model, tokenizer, precision="bf16", temperature=1.0, max_new_tokens=64, seed=0)

Every engine takes the same keywords (precision, temperature, top_p, top_k, max_new_tokens, logprob_mode, seed,
device) and implements :class:`p3o.rollout.base.RolloutEngine`. The vLLM engine is imported only when asked for,
so the default install never needs vLLM.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from p3o.errors import ConfigError

ENGINES = ("hf", "vllm")


def make_engine(kind: str, model: nn.Module | str, tokenizer: Any, **kwargs: Any) -> Any:
    """A rollout engine of kind ``kind`` holding its own copy of ``model`` (an HF model, or a model directory).

    Raises ConfigError (one line naming ``rollout.engine``) for an unknown kind.
    """
    if kind == "hf":
        import p3o.rollout  # looked up at call time, so `p3o.rollout.HFEngine` can be swapped (tests, subclasses)

        return p3o.rollout.HFEngine(model, tokenizer, **kwargs)
    if kind == "vllm":
        from p3o.rollout.vllm import VLLMEngine

        return VLLMEngine(model, tokenizer, **kwargs)
    raise ConfigError(f"rollout.engine: unknown engine {kind!r}; known: {', '.join(ENGINES)}")


__all__ = ["ENGINES", "make_engine"]
