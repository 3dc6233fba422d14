"""A tiny random Qwen3 causal LM for tests, and the arithmetic tokenizer and reward the TRL tests share
(imported by name: `from tiny_lm import make_tiny_lm, build_tokenizer, digit_reward`)."""

from __future__ import annotations

from typing import Any

import torch


def make_tiny_lm(seed: int = 0, vocab_size: int = 64, hidden: int = 32, layers: int = 2) -> torch.nn.Module:
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


def build_tokenizer() -> Any:
    """A byte-level BPE tokenizer trained here on a few arithmetic strings (no downloads); pad 0, eos 2 as
    make_tiny_lm's config uses."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=64,
        special_tokens=["<pad>", "<bos>", "<eos>", "<unk>"],
        initial_alphabet=sorted(set("0123456789+=? ")),
    )
    tok.train_from_iterator([f"{a}+{b}={a + b}" for a in range(10) for b in range(10)], trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>"
    )
    assert (hf.pad_token_id, hf.eos_token_id) == (0, 2)  # the ids make_tiny_lm's config uses
    return hf


def digit_reward(completions: list[str], **_: object) -> list[float]:
    """A trivial verifiable reward: the fraction of characters that are digits."""
    return [sum(c.isdigit() for c in s) / max(1, len(s)) for s in completions]
