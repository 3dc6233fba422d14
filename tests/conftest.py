"""Shared fixtures: a tiny random Qwen3 causal LM (no tokenizer, no downloads) and thread settings."""

from __future__ import annotations

import os

import pytest
import torch
from tiny_lm import make_tiny_lm

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture
def tiny_lm() -> torch.nn.Module:
    return make_tiny_lm()
