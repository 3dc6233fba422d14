"""Rollout engines: sample completions and RECORD per-token log-probs and policy versions.

from p3o.rollout import HFEngine
engine = HFEngine(model, tokenizer, precision="bf16", temperature=1.0, max_new_tokens=64)
rollouts = engine.generate(prompt_ids, n=8, answers=answers)
engine.load_weights(trainer_model.state_dict(), version=step)

`VLLMEngine` (vLLM rollouts, docs/vllm.md) is exported lazily: `import p3o.rollout` never imports vLLM.
"""

from typing import Any

from p3o.rollout.base import RolloutEngine
from p3o.rollout.hf import LOGPROB_MODES, HFEngine
from p3o.rollout.quant import PRECISIONS
from p3o.rollout.settings import EngineSettings

__all__ = ["LOGPROB_MODES", "PRECISIONS", "EngineSettings", "HFEngine", "RolloutEngine", "VLLMEngine"]


def __getattr__(name: str) -> Any:
    if name == "VLLMEngine":
        from p3o.rollout.vllm import VLLMEngine  # optional: vllm (extra vllm), imported when first named

        return VLLMEngine
    raise AttributeError(f"module 'p3o.rollout' has no attribute {name!r}")
