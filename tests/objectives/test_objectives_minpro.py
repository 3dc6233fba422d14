"""Tests of MinPRO's prefix statistics and diagnostics."""

from __future__ import annotations

import math

import pytest
import torch

from p3o.objectives import ObjectiveInputs, get_objective, minpro_diagnostics, prefix_log_stat


def _loop_stat(lrs: list[float], valid: list[bool], stat: str, include_one: bool) -> list[float]:
    """Slow oracle: m_t from the ratios of the strictly preceding valid tokens (1 on an empty prefix)."""
    out, prev = [], []
    for x, ok in zip(lrs, valid):
        rho = [math.exp(v) for v in prev] + ([1.0] if include_one else [])
        if not rho:
            m = 1.0
        elif stat == "min":
            m = min(rho)
        elif stat == "mean":
            m = sum(rho) / len(rho)
        elif stat == "geomean":
            m = math.exp(sum(math.log(r) for r in rho) / len(rho))
        else:
            m = math.prod(math.exp(v) for v in prev)
        out.append(m)
        if ok:
            prev.append(x)
    return out


@pytest.mark.parametrize("stat", ["min", "mean", "geomean", "prod"])
@pytest.mark.parametrize("include_one", [False, True])
def test_prefix_stats_match_loop(stat: str, include_one: bool) -> None:
    g = torch.Generator().manual_seed(0)
    lr = torch.randn(4, 9, generator=g)
    mask = torch.rand(4, 9, generator=g) > 0.3
    mask[0, :3] = False  # leading masked tokens: the first VALID token still has m = 1
    lr = torch.where(mask, lr, float("nan"))  # garbage at masked positions must not matter
    got = torch.exp(prefix_log_stat(lr, mask, stat, include_one=include_one))
    for i in range(4):
        want = _loop_stat(lr[i].tolist(), mask[i].tolist(), stat, include_one)
        valid = mask[i]
        torch.testing.assert_close(got[i][valid], torch.tensor(want)[valid], rtol=1e-5, atol=1e-6)


def test_min_factor_first_token_and_running_min() -> None:
    lr = torch.log(torch.tensor([[9.0, 0.5, 9.0, 2.0, 0.25, 3.0]]))
    mask = torch.tensor([[False, True, False, True, True, True]])
    m = torch.exp(prefix_log_stat(lr, mask, "min"))[0]
    # valid ratios in order: 0.5, 2, 0.25, 3 -> m = 1 (first valid), 0.5, 0.5, 0.25; the masked 9s never count
    assert m[1].item() == 1.0
    torch.testing.assert_close(m[mask[0]], torch.tensor([1.0, 0.5, 0.5, 0.25]))
    m1 = torch.exp(prefix_log_stat(lr + math.log(4), mask, "min", include_one=True))[0]
    # ratios ×4: 2, 8, 1, 12; include_one: min(1, ·) -> 1, 1, 1, 1
    torch.testing.assert_close(m1[mask[0]], torch.ones(4))


def test_prod_is_cumulative_prefix_ratio() -> None:
    g = torch.Generator().manual_seed(1)
    lr = torch.randn(3, 8, generator=g) * 0.5
    mask = torch.ones(3, 8, dtype=torch.bool)
    mask[1, 5:] = False
    log_w = prefix_log_stat(lr, mask, "prod") + lr  # log(m_t·ρ_t) = log ρ_{1:t}
    want = torch.cumsum(torch.where(mask, lr, 0.0), 1)
    torch.testing.assert_close(torch.where(mask, log_w, 0.0), torch.where(mask, want, 0.0))


def test_minpro_prod_weights_are_cumulative_ratio() -> None:
    # with ε large enough to not clip, the grad of minpro(prefix_stat="prod") is −ρ_{1:t}·A / N_tok
    lr = torch.tensor([[0.1, -0.2, 0.3]])
    logp = (lr - 1.0).requires_grad_()
    inp = ObjectiveInputs(logp, torch.full((1, 3), -1.0), torch.ones(1, 3, dtype=torch.bool), torch.tensor([2.0]))
    loss, _ = get_objective("minpro")(inp, prefix_stat="prod")
    (grad,) = torch.autograd.grad(loss, logp)
    torch.testing.assert_close(grad, -2 * torch.exp(torch.cumsum(lr, 1)) / 3)


def test_minpro_diagnostics_function() -> None:
    log_m = torch.log(torch.tensor([[1.0, 0.6, 0.3, 0.15, 0.01, 9.0], [1.0, 0.04, 1.0, 1.0, 1.0, 1.0]]))
    mask = torch.tensor([[True] * 5 + [False], [True, True, False, False, False, False]])
    weight = torch.arange(12.0).reshape(2, 6)
    s = minpro_diagnostics(log_m, weight, mask)
    # valid m: 1, .6, .3, .15, .01, 1, .04 -> mean 3.1/7; sorted .01 .04 .15 .3 .6 1 1 -> lower median .3
    assert s["m_mean"].item() == pytest.approx(3.1 / 7, rel=1e-5)
    assert s["m_median"].item() == pytest.approx(0.3, rel=1e-5)
    assert s["m_frac_above_0.5"].item() == pytest.approx(3 / 7)
    assert s["m_frac_above_0.2"].item() == pytest.approx(4 / 7)
    assert s["m_frac_above_0.1"].item() == pytest.approx(5 / 7)
    assert s["m_frac_above_0.05"].item() == pytest.approx(5 / 7)
    # row 0: k/5 for k = 0..4 -> deciles 0, 2, 4, 6, 8 (weights 0..4); row 1: k/2 -> deciles 0, 5 (weights 6, 7)
    assert s["weight_decile_0"].item() == pytest.approx(3.0)  # (0 + 6)/2
    assert s["weight_decile_2"].item() == pytest.approx(1.0)
    assert s["weight_decile_5"].item() == pytest.approx(7.0)
    assert s["weight_decile_9"].item() == 0.0
    empty = minpro_diagnostics(log_m, weight, torch.zeros(2, 6, dtype=torch.bool))
    assert empty["m_median"].item() == 1.0 and empty["m_mean"].item() == 0.0


def _loop_including(lrs: list[float], valid: list[bool], stat: str) -> list[float]:
    """Slow float64 oracle of the paper's ablation: S(ρ_1 … ρ_t), the current valid token included."""
    out, seen = [], []
    for x, ok in zip(lrs, valid):
        rho = [math.exp(v) for v in seen] + ([math.exp(x)] if ok else [])
        if not rho:
            out.append(1.0)
        elif stat == "min":
            out.append(min(rho))
        elif stat == "mean":
            out.append(sum(rho) / len(rho))
        elif stat == "geomean":
            out.append(math.prod(rho) ** (1 / len(rho)))
        else:
            out.append(math.prod(rho))
        if ok:
            seen.append(x)
    return out


@pytest.mark.parametrize("stat", ["min", "mean", "geomean", "prod"])
def test_including_prefix_stats_match_float64_loop(stat: str) -> None:
    g = torch.Generator().manual_seed(5)
    lr = torch.randn(4, 9, generator=g) * 0.7
    mask = torch.rand(4, 9, generator=g) > 0.3
    mask[1, :2] = False
    lr = torch.where(mask, lr, float("nan"))
    got = torch.exp(prefix_log_stat(lr, mask, stat, including=True))
    for i in range(4):
        want = torch.tensor(_loop_including(lr[i].tolist(), mask[i].tolist(), stat), dtype=torch.float64)
        valid = mask[i]
        torch.testing.assert_close(got[i][valid].double(), want[valid], rtol=1e-5, atol=1e-7)


def test_ablation_weights_replace_the_whole_weight() -> None:
    # ρ = (2, 0.5, 4): the paper's ablation weights (current token included) vs strict-prefix × ρ_t
    lr = torch.log(torch.tensor([[2.0, 0.5, 4.0]], dtype=torch.float64))
    mask = torch.ones(1, 3, dtype=torch.bool)
    adv = torch.tensor([1.0])
    want = {
        "mean": [2.0, 1.25, 6.5 / 3],  # (1/t)Σ_{i≤t} ρ_i
        "geomean": [2.0, 1.0, 4.0 ** (1 / 3)],  # (Π_{i≤t} ρ_i)^{1/t}
        "prod": [2.0, 1.0, 4.0],  # Π_{i≤t} ρ_i = ρ_{1:t}
        "min": [2.0, 0.5, 0.5],
    }
    for stat, w in want.items():
        logp = (lr.float() - 1.0).requires_grad_()
        inp = ObjectiveInputs(logp, torch.full((1, 3), -1.0), mask, adv)
        loss, stats = get_objective("minpro")(inp, prefix_stat=stat, prefix_scope="including", trunc_eps_high=10.0)
        (grad,) = torch.autograd.grad(loss, logp)
        # token-mean: ∂/∂logp_t = −w_t·A/3, the weight detached
        torch.testing.assert_close(grad.double(), -torch.tensor([w], dtype=torch.float64) / 3, rtol=1e-6, atol=1e-7)
        # the diagnostic factor is w_t/ρ_t
        m = torch.tensor(w, dtype=torch.float64) / torch.tensor([2.0, 0.5, 4.0], dtype=torch.float64)
        assert stats["m_mean"].item() == pytest.approx(m.mean().item(), rel=1e-5)
    # the strict-prefix mean differs (weights 1·2, 2·0.5, mean(2, 0.5)·4 = 5, not 6.5/3); the product is the same
    logp = (lr.float() - 1.0).requires_grad_()
    inp = ObjectiveInputs(logp, torch.full((1, 3), -1.0), mask, adv)
    loss, _ = get_objective("minpro")(inp, prefix_stat="mean", trunc_eps_high=10.0)
    (grad,) = torch.autograd.grad(loss, logp)
    torch.testing.assert_close(
        grad.double(), -torch.tensor([[2.0, 1.0, 5.0]], dtype=torch.float64) / 3, rtol=1e-6, atol=0
    )


def test_prefix_scope_is_checked() -> None:
    inp = ObjectiveInputs(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2, dtype=torch.bool), torch.ones(1))
    with pytest.raises(ValueError, match="prefix_scope"):
        get_objective("minpro")(inp, prefix_scope="all")
