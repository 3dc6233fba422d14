"""Gradient accumulation is exact: any micro-batch size gives the parameters of one big batch.

SGD is used so parameter differences are gradient differences (Adam's first step, m/√v ≈ sign(g), would turn
float noise in near-zero gradients into full-size steps).

"Exact" up to the order of floating-point summation, which differs between micro-batch splits and between the
kernels a CPU selects (AVX2 and AVX-512 accumulate in different orders). The tolerance is derived, not tuned: for
each parameter tensor k the two runs may differ by at most

    tol_k = safety · updates · n_red · u · max|θ_k(one batch) − θ_k(init)|

u = the dtype's unit round-off (2⁻²⁴ for float32), n_red = the longest reduction in the backward pass (valid tokens of
a mini-batch × hidden size: a weight gradient sums outer products over tokens, an activation gradient dots over the
hidden size), `updates` the SGD steps over which errors compound, safety = 4. Measured on an AVX-512 machine the worst
tensor differs by ≤ 0.17 of this bound; a wrong normaliser (micro-batch-local token counts) exceeds it by > 10⁴×
(test_derived_tolerance_catches_a_wrong_normaliser).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from train_fakes import make_tiny_lm, params_of, random_batch

from p3o.objectives import get_objective
from p3o.train.step import update

SAFETY = 4.0


def _train(
    name: str, micro: int, minis: int = 2, noise: float = 0.3, updates: int = 2, objective=None
) -> dict[str, torch.Tensor]:
    model = make_tiny_lm(seed=0)
    batch = random_batch(make_tiny_lm(seed=0), n=8, seed=1, noise=noise)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    rec = get_objective(name)
    for _ in range(updates):
        update(
            model,
            opt,
            None,
            batch,
            objective or rec,
            {},
            needs=rec.inputs_needed({}),
            num_mini_batches=minis,
            micro_batch_size=micro,
            grad_clip=0.0,
        )
    return params_of(model)


def _reduction_size(minis: int) -> int:
    """n_red: valid tokens of the largest mini-batch × hidden size (see the module docstring)."""
    model = make_tiny_lm(seed=0)
    batch = random_batch(model, n=8, seed=1)
    per_row = batch.mask.sum(-1).sort(descending=True).values
    rows = -(-per_row.numel() // minis)
    return int(per_row[:rows].sum()) * int(model.config.hidden_size)


def assert_equal_up_to_rounding(
    got: dict[str, torch.Tensor],
    want: dict[str, torch.Tensor],
    init: dict[str, torch.Tensor],
    *,
    n_red: int,
    updates: int,
) -> None:
    """Every tensor within tol_k = SAFETY · updates · n_red · u · max|want_k − init_k| (module docstring)."""
    for k in want:
        u = torch.finfo(want[k].dtype).eps / 2
        move = (want[k] - init[k]).abs().max().item()
        tol = SAFETY * updates * n_red * u * move
        diff = (got[k] - want[k]).abs().max().item()
        assert diff <= tol, f"{k}: max |Δ| {diff:.3e} > derived tolerance {tol:.3e} (movement {move:.3e})"


@pytest.mark.parametrize(("name", "micro"), [("grpo", 1), ("dapo", 3), ("decoupled_ppo", 2), ("cispo", 3)])
def test_micro_batches_equal_one_batch(name, micro):
    # grpo: seq-mean-token-mean (num_seqs normaliser); dapo / cispo / decoupled_ppo: token-mean (num_tokens);
    # micro = 3 leaves a ragged last micro-batch
    init = params_of(make_tiny_lm(seed=0))
    one = _train(name, micro=4)  # each mini-batch of 4 rows in one micro-batch
    acc = _train(name, micro=micro)
    assert any(not torch.equal(one[k], init[k]) for k in one)
    assert_equal_up_to_rounding(acc, one, init, n_red=_reduction_size(2), updates=2)


class _LocalNormaliser:
    """A deliberately wrong objective: each micro-batch normalised by its OWN token / sequence count instead of
    the step's (what gradient accumulation must not do)."""

    def __init__(self, name: str) -> None:
        self.rec = get_objective(name)

    def inputs_needed(self, hyper):
        return self.rec.inputs_needed(hyper)

    def __call__(self, inputs, **hyper):
        local = dataclasses.replace(
            inputs,
            num_tokens=inputs.mask.sum().float(),
            num_seqs=torch.tensor(float(inputs.mask.shape[0])),
        )
        return self.rec(local, **hyper)


@pytest.mark.parametrize(("name", "micro"), [("grpo", 1), ("dapo", 3)])
def test_derived_tolerance_catches_a_wrong_normaliser(name, micro):
    init = params_of(make_tiny_lm(seed=0))
    one = _train(name, micro=4)
    wrong = _train(name, micro=micro, objective=_LocalNormaliser(name))
    with pytest.raises(AssertionError, match="derived tolerance"):
        assert_equal_up_to_rounding(wrong, one, init, n_red=_reduction_size(2), updates=2)


def test_p3o_on_policy_accumulation_matches():
    # P3O's ESS is a per-micro-batch statistic; on-policy (all ratios 1) every e_B is 1 whatever the split,
    # so one update from on-policy data must not depend on the micro-batch size
    init = params_of(make_tiny_lm(seed=0))
    one = _train("p3o", micro=8, minis=1, noise=0.0, updates=1)
    acc = _train("p3o", micro=1, minis=1, noise=0.0, updates=1)
    assert_equal_up_to_rounding(acc, one, init, n_red=_reduction_size(1), updates=1)
