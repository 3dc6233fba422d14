"""Qwen3-architecture configurations for the built-in tiny models (about 1M, 5M and 30M parameters).

cfg = qwen3_config("5m", vocab_size=512)   # -> transformers.Qwen3Config
"""

from __future__ import annotations

from transformers import Qwen3Config

# hidden, layers, heads, kv heads, head_dim, mlp width. Parameter counts at vocab 512 (tied embeddings):
# 1m ≈ 0.86M, 5m ≈ 4.9M, 30m ≈ 31.8M.
SIZES: dict[str, dict[str, int]] = {
    "1m": dict(
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        intermediate_size=384,
    ),
    "5m": dict(
        hidden_size=256,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        intermediate_size=768,
    ),
    "30m": dict(
        hidden_size=512,
        num_hidden_layers=10,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=64,
        intermediate_size=1536,
    ),
}


def qwen3_config(
    size: str,
    vocab_size: int,
    pad_token_id: int = 0,
    bos_token_id: int = 1,
    eos_token_id: int = 2,
    max_position_embeddings: int = 512,
) -> Qwen3Config:
    """A Qwen3Config of one of SIZES; tied input/output embeddings; unknown size -> ValueError listing SIZES."""
    if size not in SIZES:
        raise ValueError(f"unknown model size {size!r}; known: {', '.join(SIZES)}")
    return Qwen3Config(
        vocab_size=vocab_size,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=pad_token_id,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        rope_theta=10000.0,
        **SIZES[size],
    )
