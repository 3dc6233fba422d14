"""Data parallel on gloo: world size 2 equals world size 1 on the same global batch (the update step).

Each rank holds half the rows; the step's token / sequence counts, the P3O ESS sums and the gradients are
all-reduced, so the parameters after two updates (2 mini-batches each, gradient clipping on) match.
"""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp
from train_fakes import dp_train

NAMES = ["p3o", "grpo", "decoupled_ppo"]


def test_world_size_2_equals_world_size_1(tmp_path):
    dp_train(0, 1, "", str(tmp_path), NAMES)
    # fork: the children inherit the imported torch / transformers (spawning would re-import them, ~10 s each)
    mp.start_processes(
        dp_train, args=(2, str(tmp_path / "init"), str(tmp_path), NAMES), nprocs=2, join=True, start_method="fork"
    )
    for name in NAMES:
        one = torch.load(tmp_path / f"ws1_{name}.pt")
        two = torch.load(tmp_path / f"ws2_{name}.pt")
        for k, v in one["params"].items():
            torch.testing.assert_close(two["params"][k], v, rtol=1e-4, atol=1e-6, msg=f"{name}: {k}")
        # the loss (Σ over micro-batches and ranks) and the clipped global gradient norm are global quantities
        for k in ("loss", "grad_norm", "ratio_max", "ratio_min"):
            assert two["stats"][k] == pytest.approx(one["stats"][k], rel=1e-4, abs=1e-6), f"{name}: {k}"
