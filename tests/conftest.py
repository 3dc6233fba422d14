"""Shared fixtures: a tiny random Qwen3 causal LM (no tokenizer, no downloads) and thread settings."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


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


@pytest.fixture
def tiny_lm() -> torch.nn.Module:
    return make_tiny_lm()
