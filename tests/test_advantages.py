"""Tests of p3o.advantages: group-relative advantages and DAPO's overlong penalty."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from p3o.advantages import group_advantages, overlong_penalty
from p3o.errors import ConfigError


def _loop(rewards: list[float], ids: list[int], std: str, scale: str, baseline: str, alpha: float) -> list[float]:
    """Slow oracle written from the formula, group by group."""
    eps = 1e-6
    pstd = statistics.pstdev if std == "population" else statistics.stdev
    batch_std = pstd(rewards) if len(rewards) > 1 else 1.0
    out = []
    for r, g in zip(rewards, ids):
        grp = [x for x, h in zip(rewards, ids) if h == g]
        mean, sd = (statistics.fmean(grp), pstd(grp)) if len(grp) > 1 else (0.0, 1.0)
        low = min(grp) if len(grp) > 1 else 0.0
        b = {"mean": mean, "asymre": mean - alpha * (mean - low), "lowered": mean - alpha * sd}[baseline]
        denom = {"group": sd + eps, "batch": batch_std + eps, "none": 1.0}[scale]
        out.append((r - b) / denom)
    return out


def test_hand_values() -> None:
    # group 7: rewards (1, 0, 0, 1): mean 0.5, population std 0.5 -> A = (±0.5)/(0.5 + 1e-6) ≈ ±1
    # group 3: rewards (2, 2): all equal -> A = 0 (a zero-advantage group)
    adv, stats = group_advantages(torch.tensor([1.0, 0, 2, 0, 2, 1]), torch.tensor([7, 7, 3, 7, 3, 7]))
    torch.testing.assert_close(adv, torch.tensor([1.0, -1.0, 0.0, -1.0, 0.0, 1.0]), atol=1e-5, rtol=0)
    assert stats["zero_adv_groups"].item() == 1.0 and stats["num_groups"].item() == 2.0
    # Bessel: std of (1, 0, 0, 1) = sqrt(1/3) = 0.57735 -> A = 0.5/0.57735 = 0.866025
    adv, _ = group_advantages(torch.tensor([1.0, 0, 0, 1]), torch.zeros(4, dtype=torch.long), std="bessel")
    assert adv[0].item() == pytest.approx(0.866025, rel=1e-5)
    # lowered baseline α = 0.5: b = 0.5 − 0.5·0.5 = 0.25 -> A = (0.75, −0.25)/0.5 = (1.5, −0.5)
    adv, _ = group_advantages(torch.tensor([1.0, 0, 0, 1]), torch.zeros(4, dtype=torch.long), baseline="lowered")
    assert adv[:2].tolist() == pytest.approx([1.5, -0.5], rel=1e-5)
    # scale none (Dr.GRPO): just r − mean
    adv, _ = group_advantages(torch.tensor([3.0, 1.0]), torch.tensor([0, 0]), scale="none")
    assert adv.tolist() == [1.0, -1.0]


def test_asymre_worked_values_from_the_minpro_paper() -> None:
    # appendix D: Â = (R − (mean − α·(mean − min))) / std, α = 0.5, population std. Pass rate 0.75, binary rewards:
    # mean 0.75, min 0, baseline 0.375, std sqrt(0.75·0.25) = 0.4330 -> correct 0.625/0.433 = 1.443, wrong −0.866
    ids = torch.zeros(4, dtype=torch.long)
    adv, _ = group_advantages(torch.tensor([1.0, 1, 1, 0]), ids, baseline="asymre")
    assert adv.tolist() == pytest.approx([1.443376, 1.443376, 1.443376, -0.866025], abs=5e-6)
    # the earlier reconstruction (mean − α·std) at the same pass rate: 1.077 / −1.232; the two agree at 0.5 only
    old, _ = group_advantages(torch.tensor([1.0, 1, 1, 0]), ids, baseline="lowered")
    assert old.tolist() == pytest.approx([1.077350, 1.077350, 1.077350, -1.232051], abs=5e-6)
    half = torch.tensor([1.0, 0, 1, 0])
    a, _ = group_advantages(half, ids, baseline="asymre")
    b, _ = group_advantages(half, ids, baseline="lowered")
    torch.testing.assert_close(a, b)


def test_asymre_float64_reference_and_edge_cases() -> None:
    # non-binary rewards, several groups, both std conventions, α ≠ 0.5, against the formula in float64
    g = torch.Generator().manual_seed(3)
    ids = torch.tensor([0, 0, 0, 1, 1, 1, 1, 2, 2, 3])
    r = torch.rand(10, generator=g, dtype=torch.float64)
    r[7:9] = 0.25  # an all-equal group: mean = min, std = 0 -> A = 0
    for std, ddof in (("population", 0), ("bessel", 1)):
        adv, stats = group_advantages(r, ids, baseline="asymre", alpha=0.3, std=std)
        for grp in range(3):
            x = r[ids == grp]
            base = x.mean() - 0.3 * (x.mean() - x.min())
            want = (x - base) / (x.std(correction=ddof) + 1e-6)
            torch.testing.assert_close(adv[ids == grp].double(), want, rtol=1e-6, atol=1e-6)
        assert adv[9].item() == pytest.approx(r[9].item() / (1 + 1e-6), rel=1e-6)  # singleton: baseline 0
        assert stats["zero_adv_groups"].item() == 1.0
    # α = 0 is GRPO's mean baseline; α = 1 puts the baseline at the group's minimum (the worst sample gets A = 0)
    a0, _ = group_advantages(r, ids, baseline="asymre", alpha=0.0)
    m, _ = group_advantages(r, ids)
    torch.testing.assert_close(a0, m)
    a1, _ = group_advantages(r, ids, baseline="asymre", alpha=1.0)
    assert all(a1[ids == grp].min().item() == pytest.approx(0.0, abs=1e-6) for grp in range(3))


def test_singleton_group_convention() -> None:
    # a group of size 1: mean 0, std 1 -> A = r / (1 + 1e-6)
    adv, stats = group_advantages(torch.tensor([0.7, 0.0]), torch.tensor([0, 1]))
    assert adv.tolist() == pytest.approx([0.7 / (1 + 1e-6), 0.0])
    assert stats["zero_adv_groups"].item() == 1.0  # the reward-0 singleton gives no gradient


@pytest.mark.parametrize("std", ["population", "bessel"])
@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("baseline", ["mean", "asymre", "lowered"])
def test_matches_loop(std: str, scale: str, baseline: str) -> None:
    g = torch.Generator().manual_seed(0)
    ids = torch.tensor([5, 2, 5, 2, 9, 5, 2, 2, 11, 9])
    rewards = torch.randint(0, 3, (10,), generator=g).float()
    rewards[ids == 9] = 1.0  # zero-variance group
    adv, stats = group_advantages(rewards, ids, std=std, scale=scale, baseline=baseline, alpha=0.3)
    want = _loop(rewards.tolist(), ids.tolist(), std, scale, baseline, 0.3)
    assert adv.tolist() == pytest.approx(want, rel=1e-5, abs=1e-6)
    assert torch.isfinite(adv).all()
    assert stats["zero_adv_groups"].item() >= 1.0


def test_bad_options_and_empty() -> None:
    with pytest.raises(ConfigError, match="std"):
        group_advantages(torch.ones(2), torch.zeros(2), std="sample")
    with pytest.raises(ConfigError, match="scale"):
        group_advantages(torch.ones(2), torch.zeros(2), scale="global")
    adv, stats = group_advantages(torch.zeros(0), torch.zeros(0, dtype=torch.long))
    assert adv.shape == (0,) and stats["zero_adv_groups"].item() == 0.0


def test_overlong_penalty() -> None:
    # L_max = 20, L_c = 4, factor 1: L ≤ 16 -> 0; L = 18 -> (16 − 18)/4 = −0.5; L = 20 -> −1; L = 25 -> −1
    pen = overlong_penalty(torch.tensor([10, 16, 18, 20, 25]), max_len=20, buffer=4, factor=1.0)
    assert pen.tolist() == pytest.approx([0.0, 0.0, -0.5, -1.0, -1.0])
    assert overlong_penalty(torch.tensor([17]), 20, 4, factor=0.5).item() == pytest.approx(-0.125)
    assert not math.isnan(overlong_penalty(torch.tensor([30]), 20, 20, 2.0).item())
    with pytest.raises(ConfigError, match="buffer"):
        overlong_penalty(torch.tensor([1]), 20, 0, 1.0)
