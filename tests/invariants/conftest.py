"""Make the training fakes in tests/train importable from the invariant tests."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

_TRAIN = str(Path(__file__).resolve().parents[1] / "train")
if _TRAIN not in sys.path:
    sys.path.insert(0, _TRAIN)


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny models run fastest single-threaded (and the CPU is shared)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
