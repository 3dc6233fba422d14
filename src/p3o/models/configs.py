"""Qwen3-architecture configurations for the built-in tiny models (about 1M, 5M and 30M parameters).

cfg = qwen3_config("5m", vocab_size=512)   # -> transformers.Qwen3Config
"""

from __future__ import annotations

from transformers import Qwen3Config

#: The fields of a size, in the order of the rows of SIZES.
SHAPE_FIELDS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
)
# Parameter counts at vocab 512 (tied embeddings): 1m ≈ 0.86M, 5m ≈ 4.9M, 30m ≈ 31.8M.
_ROWS = {
    #       hidden  layers  heads  kv heads  head_dim  mlp width
    "1m": (128, 4, 4, 2, 32, 384),
    "5m": (256, 6, 4, 2, 64, 768),
    "30m": (512, 10, 8, 4, 64, 1536),
}
SIZES: dict[str, dict[str, int]] = {name: dict(zip(SHAPE_FIELDS, row, strict=True)) for name, row in _ROWS.items()}


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
