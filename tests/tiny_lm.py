"""A tiny random Qwen3 causal LM for tests (imported by name: `from tiny_lm import make_tiny_lm`)."""

from __future__ import annotations

import torch


def make_tiny_lm(vocab_size: int = 64, hidden: int = 32, layers: int = 2, seed: int = 0) -> torch.nn.Module:
    """A randomly initialised Qwen3ForCausalLM small enough for unit tests (float32, eval mode)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden // 4,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    model = Qwen3ForCausalLM(cfg).float().eval()
    return model
