"""Shared fixtures: a tiny random Qwen3 causal LM (no tokenizer, no downloads) and thread settings."""

from __future__ import annotations

import os

import pytest
import torch
import venv_checks
from tiny_lm import make_tiny_lm

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture
def tiny_lm() -> torch.nn.Module:
    return make_tiny_lm()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Queue the self-contained subprocess work of the selected tests on a background runner, in test order, so it
    uses the second core while the main suite runs (tests/venv_checks.py): each module's ``VENV_CHECKS`` (the other
    virtualenvs' check sets), and what its ``prestart(items)`` queues for its selected items."""
    modules: dict[str, tuple] = {}
    for item in session.items:
        module = getattr(item, "module", None)
        if module is not None:
            modules.setdefault(module.__name__, (module, []))[1].append(item)
    for module, items in modules.values():
        for spec in getattr(module, "VENV_CHECKS", ()):
            venv_checks.prestart(**spec)
        if callable(getattr(module, "prestart", None)):
            module.prestart(items)


def pytest_sessionfinish(session: pytest.Session) -> None:
    venv_checks.shutdown()
