"""Tests of token aggregation and the effective sample size (p3o.objectives.core)."""

from __future__ import annotations

import math

import pytest
import torch

from p3o.objectives import ObjectiveError, effective_sample_size, ess_from_parts, ess_parts, reduce_tokens


def _ess_loop(lrs: list[float]) -> float:
    """Slow oracle: (Σρ)² / (n Σρ²) in plain Python."""
    rho = [math.exp(x) for x in lrs]
    return sum(rho) ** 2 / (len(rho) * sum(r * r for r in rho))


# ----------------------------------------------------------------------------------------------- reduce_tokens


def test_reduce_tokens_hand_values() -> None:
    per = torch.tensor([[1.0, 2.0, 3.0], [4.0, float("nan"), float("inf")]])
    mask = torch.tensor([[True, True, True], [True, False, False]])
    # token-mean: (1+2+3+4)/4 = 2.5 ; with the step's count 8: 10/8 = 1.25
    assert reduce_tokens(per, mask, "token-mean").item() == pytest.approx(2.5)
    assert reduce_tokens(per, mask, "token-mean", num_tokens=8).item() == pytest.approx(1.25)
    assert reduce_tokens(per, mask, "token-mean", num_tokens=torch.tensor(8)).item() == pytest.approx(1.25)
    # seq-mean-token-mean: (6/3 + 4/1)/2 = 3
    assert reduce_tokens(per, mask, "seq-mean-token-mean").item() == pytest.approx(3.0)
    # seq-mean-token-sum-norm: (6/3 + 4/3)/2 = 5/3 (constant = T = 3); with constant 2: (3 + 2)/2 = 2.5
    assert reduce_tokens(per, mask, "seq-mean-token-sum-norm").item() == pytest.approx(5 / 3)
    assert reduce_tokens(per, mask, "seq-mean-token-sum-norm", norm_const=2).item() == pytest.approx(2.5)


def test_reduce_tokens_empty_and_bad_mode() -> None:
    per = torch.full((2, 3), float("nan"))
    mask = torch.zeros(2, 3, dtype=torch.bool)
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        assert reduce_tokens(per, mask, mode).item() == 0.0
    with pytest.raises(ObjectiveError, match="seq-mean"):
        reduce_tokens(per, mask, "bogus")


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_reduce_tokens_accumulation(mode: str) -> None:
    g = torch.Generator().manual_seed(0)
    per = torch.randn(6, 5, generator=g)
    mask = torch.rand(6, 5, generator=g) > 0.3
    full = reduce_tokens(per, mask, mode)
    parts = sum(
        reduce_tokens(per[i : i + 2], mask[i : i + 2], mode, num_tokens=mask.sum(), num_seqs=6) for i in (0, 2, 4)
    )
    torch.testing.assert_close(parts, full)


# ----------------------------------------------------------------------------------------------- ESS


def test_ess_hand_value() -> None:
    # ρ = (1, 2, 3): (1+2+3)² / (3·(1+4+9)) = 36/42 = 6/7
    lr = torch.log(torch.tensor([[1.0, 2.0, 3.0, 100.0]]))
    mask = torch.tensor([[True, True, True, False]])
    assert effective_sample_size(lr, mask).item() == pytest.approx(6 / 7, rel=1e-6)


def test_ess_matches_loop_bounds_and_scale_invariance() -> None:
    g = torch.Generator().manual_seed(1)
    for _ in range(5):
        lr = torch.randn(4, 7, generator=g) * 2
        mask = torch.rand(4, 7, generator=g) > 0.3
        ess = effective_sample_size(lr, mask).item()
        assert ess == pytest.approx(_ess_loop(lr[mask].tolist()), rel=1e-5)
        n = int(mask.sum())
        assert 1 / n - 1e-7 <= ess <= 1.0
        # multiplying every ratio by e^c leaves the ESS unchanged, even for huge c
        for c in (-50.0, 3.0, 75.0):
            assert effective_sample_size(lr + c, mask).item() == pytest.approx(ess, rel=1e-5)


def test_ess_equal_ratios_is_one_and_extremes() -> None:
    mask = torch.ones(3, 4, dtype=torch.bool)
    lr = torch.full((3, 4), math.log(0.5))  # ρ ≡ 0.5 -> 1
    assert effective_sample_size(lr, mask).item() == pytest.approx(1.0)
    # one ratio e^80 dominates the others (e^-80): ESS -> 1/|B|, computed without overflow
    lr = torch.full((3, 4), -80.0)
    lr[0, 0] = 80.0
    assert effective_sample_size(lr, mask).item() == pytest.approx(1 / 12, rel=1e-5)


def test_ess_empty_and_nonfinite_give_one() -> None:
    lr = torch.full((2, 3), float("nan"))
    assert effective_sample_size(lr, torch.zeros(2, 3, dtype=torch.bool)).item() == 1.0
    assert effective_sample_size(torch.zeros(0, 3), torch.zeros(0, 3, dtype=torch.bool)).item() == 1.0
    mask = torch.ones(2, 3, dtype=torch.bool)
    assert effective_sample_size(lr, mask).item() == 1.0  # NaN at a valid position -> flagged fallback 1
    lr = torch.zeros(2, 3)
    lr[0, 0] = float("inf")
    assert effective_sample_size(lr, mask).item() == 1.0


def test_ess_sequence_scope_and_parts() -> None:
    g = torch.Generator().manual_seed(2)
    lr = torch.randn(3, 5, generator=g)
    mask = torch.rand(3, 5, generator=g) > 0.3
    mask[2] = False
    per_seq = effective_sample_size(lr, mask, scope="sequence")
    assert per_seq.shape == (3, 1)
    for i in range(2):
        assert per_seq[i, 0].item() == pytest.approx(_ess_loop(lr[i][mask[i]].tolist()), rel=1e-5)
    assert per_seq[2, 0].item() == 1.0  # empty row
    # combining micro-batch parts == the ESS of the concatenated batch (the loop's scope="step" path)
    parts = [ess_parts(lr[i : i + 1] + 10 * i, mask[i : i + 1]) for i in range(3)]
    whole = effective_sample_size(lr + 10 * torch.arange(3.0)[:, None], mask)
    torch.testing.assert_close(ess_from_parts(parts), whole)
    with pytest.raises(ObjectiveError, match="scope"):
        effective_sample_size(lr, mask, scope="bogus")
