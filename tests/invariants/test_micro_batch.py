"""Gradient accumulation is exact: any micro-batch size gives the parameters of one big batch.

SGD is used so parameter differences are gradient differences (Adam's first step, m/√v ≈ sign(g), would turn
float noise in near-zero gradients into full-size steps).
"""

from __future__ import annotations

import pytest
import torch
from train_fakes import make_tiny_lm, params_of, random_batch

from p3o.objectives import get_objective
from p3o.train.step import objective_needs, update


def _train(name: str, micro: int, minis: int = 2, noise: float = 0.3, updates: int = 2) -> dict[str, torch.Tensor]:
    model = make_tiny_lm(seed=0)
    batch = random_batch(make_tiny_lm(seed=0), n=8, seed=1, noise=noise)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for _ in range(updates):
        update(
            model,
            opt,
            None,
            batch,
            get_objective(name),
            {},
            needs=objective_needs(name, {}),
            num_mini_batches=minis,
            micro_batch_size=micro,
            grad_clip=0.0,
        )
    return params_of(model)


@pytest.mark.parametrize(("name", "micro"), [("grpo", 1), ("dapo", 3), ("decoupled_ppo", 2), ("cispo", 3)])
def test_micro_batches_equal_one_batch(name, micro):
    # grpo: seq-mean-token-mean (num_seqs normaliser); dapo / cispo / decoupled_ppo: token-mean (num_tokens);
    # micro = 3 leaves a ragged last micro-batch
    init = params_of(make_tiny_lm(seed=0))
    one = _train(name, micro=4)  # each mini-batch of 4 rows in one micro-batch
    acc = _train(name, micro=micro)
    assert any(not torch.equal(one[k], init[k]) for k in one)
    for k in one:
        torch.testing.assert_close(acc[k], one[k], rtol=1e-5, atol=1e-6, msg=k)


def test_p3o_on_policy_accumulation_matches():
    # P3O's ESS is a per-micro-batch statistic; on-policy (all ratios 1) every e_B is 1 whatever the split,
    # so one update from on-policy data must not depend on the micro-batch size
    one = _train("p3o", micro=8, minis=1, noise=0.0, updates=1)
    acc = _train("p3o", micro=1, minis=1, noise=0.0, updates=1)
    for k in one:
        torch.testing.assert_close(acc[k], one[k], rtol=1e-5, atol=1e-6, msg=k)
