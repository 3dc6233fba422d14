"""GMPO, SAPO, DPPO, TOPR, DRO, GPG, KL-Cov and Clip-Cov: hand values and gradients, the public test vectors,
on-policy reductions and their edge cases (the slow-loop oracle and the robustness sweeps are in
test_objectives_losses.py and cover them too)."""

from __future__ import annotations

import math

import pytest
import torch

from p3o.objectives import ObjectiveError, ObjectiveInputs, get_objective


def _run(name: str, inputs: ObjectiveInputs, **hp: object) -> tuple[torch.Tensor, torch.Tensor, dict]:
    logp = inputs.logp.detach().clone().requires_grad_()
    inputs.logp = logp
    loss, stats = get_objective(name)(inputs, **hp)
    (grad,) = torch.autograd.grad(loss, logp)
    return loss.detach(), grad, stats


def _inp(lr: list, adv: list, mask: list | None = None, base: float = -1.0) -> ObjectiveInputs:
    """logp = base + lr, rollout = base (so log-ratios are lr)."""
    lrt = torch.tensor(lr, dtype=torch.float32)
    m = torch.ones_like(lrt, dtype=torch.bool) if mask is None else torch.tensor(mask)
    return ObjectiveInputs(base + lrt, torch.full_like(lrt, base), m, torch.tensor(adv, dtype=torch.float32))


def _random(seed: int, n: int = 5, t: int = 6, spread: float = 0.4) -> ObjectiveInputs:
    g = torch.Generator().manual_seed(seed)
    roll = -torch.rand(n, t, generator=g) * 2 - 0.1
    logp = roll + torch.randn(n, t, generator=g) * spread
    mask = torch.rand(n, t, generator=g) > 0.2
    mask[:, 0] = True
    return ObjectiveInputs(logp, roll, mask, torch.randn(n, generator=g))


# ----------------------------------------------------------------------------------------------- GMPO


def test_gmpo_test_vector() -> None:
    # c = (0.5, −0.5, 0.1), ε = 0.4. A = +1: c̃ = (0.4, −0.5, 0.1), R = 1, ℓ = −1.
    # A = −1: c̃ = (0.5, −0.4, 0.1), R = e^{0.2/3} = 1.068939, ℓ = +1.068939. Mean over the 2 rows.
    c = [0.5, -0.5, 0.1]
    loss, grad, stats = _run("gmpo", _inp([c, c], [1.0, -1.0]))
    r = math.exp(0.2 / 3)
    assert r == pytest.approx(1.068939, rel=1e-6)
    assert loss.item() == pytest.approx((-1.0 + r) / 2, rel=1e-6)
    # ∂ℓ_i/∂logp_t = −A_i·R_i/n_i on unclipped tokens, / 2 rows
    want = torch.tensor([[0.0, -1 / 3, -1 / 3], [r / 3, 0.0, r / 3]]) / 2
    torch.testing.assert_close(grad, want)
    assert stats["clipfrac_pos"].item() == pytest.approx(2 / 6)  # A > 0: 0.5 and −0.5 are out of the window
    assert stats["clipfrac_neg"].item() == pytest.approx(2 / 6)
    one, _, _ = _run("gmpo", _inp([c], [1.0]))
    assert one.item() == pytest.approx(-1.0, rel=1e-6)


def test_gmpo_empty_rows_leave_the_row_count_and_zero_advantage_rows_give_nothing() -> None:
    c = [0.5, -0.5, 0.1]
    base, g_base, _ = _run("gmpo", _inp([c, c], [1.0, -1.0]))
    loss, grad, _ = _run("gmpo", _inp([c, c, c], [1.0, -1.0, 2.0], mask=[[True] * 3, [True] * 3, [False] * 3]))
    assert loss.item() == pytest.approx(base.item(), rel=1e-6)
    torch.testing.assert_close(grad[:2], g_base)
    assert (grad[2] == 0).all()
    loss, grad, _ = _run("gmpo", _inp([c, c], [0.0, 0.0]))
    assert loss.item() == 0.0 and (grad == 0).all()


# ----------------------------------------------------------------------------------------------- SAPO


def test_sapo_values_at_ratio_one_and_gate() -> None:
    # r = 1: ℓ = −σ(0)·4/τ·A = −2A/τ: −2 for A = +1 (τ_pos = 1), +1.9047619 for A = −1 (τ_neg = 1.05)
    loss, grad, stats = _run("sapo", _inp([[0.0, 0.0], [0.0, 0.0]], [1.0, -1.0]))
    assert loss.item() == pytest.approx((-2.0 + 1.9047619) / 2, rel=1e-5)
    torch.testing.assert_close(grad, torch.tensor([[-0.25, -0.25], [0.25, 0.25]]))  # −A/(2 tokens · 2 rows)
    assert stats["soft_gate_mean"].item() == pytest.approx(1.0)
    # off-policy: ∂ℓ/∂lr = −A·4σ(1 − σ)·r with σ = σ(τ(r − 1)); r = 2, A = 1, τ = 1
    _, grad, _ = _run("sapo", _inp([[math.log(2)]], [1.0]))
    sig = 1 / (1 + math.exp(-1.0))
    assert grad.item() == pytest.approx(-4 * sig * (1 - sig) * 2, rel=1e-6)
    with pytest.raises(ObjectiveError, match="tau"):
        _run("sapo", _inp([[0.0]], [1.0]), tau_neg=0.0)


# ----------------------------------------------------------------------------------------------- DPPO


def test_dppo_probability_difference_mask_and_squared_log_ratio() -> None:
    # A = +1: token 1 p 0.5 vs 0.2 (Δ = 0.3 > 0.2, masked), token 2 p 0.3 vs 0.25 (Δ = 0.05, kept)
    # A = −1: token 1 p 0.1 vs 0.4 (Δ = −0.3 < −0.2, masked), token 2 p 0.3 vs 0.35 (kept)
    p = torch.tensor([[0.5, 0.3], [0.1, 0.3]])
    mu = torch.tensor([[0.2, 0.25], [0.4, 0.35]])
    adv = torch.tensor([1.0, -1.0])
    inp = ObjectiveInputs(p.log(), mu.log(), torch.ones(2, 2, dtype=torch.bool), adv)
    loss, grad, stats = _run("dppo", inp, kl_tau=0.1)
    lr, rho = (p / mu).log(), p / mu
    keep = torch.tensor([[0.0, 1.0], [0.0, 1.0]])
    per = -keep * adv[:, None] * rho + 0.1 * lr**2
    assert loss.item() == pytest.approx(per.mean().item(), rel=1e-5)
    torch.testing.assert_close(grad, (-keep * adv[:, None] * rho + 0.2 * lr) / 4)
    assert stats["masked_frac"].item() == 0.5
    assert stats["masked_high_frac"].item() == 0.25 and stats["masked_low_frac"].item() == 0.25
    with pytest.raises(ObjectiveError, match="kl_tau"):
        _run("dppo", inp, kl_tau=-1.0)


# ----------------------------------------------------------------------------------------------- TOPR


def test_topr_tapers_only_negative_sequences_by_their_truncated_ratio() -> None:
    # row 0: A = +1 -> c = 1; row 1: A = −1, Σ lr = ln 0.5 -> c = 0.5; row 2: A = −1, Σ lr = ln 2 -> c = 1
    h = math.log(0.5) / 2
    inp = _inp([[0.1, 0.2], [h, h], [-h, -h]], [1.0, -1.0, -1.0])
    loss, grad, stats = _run("topr", inp)
    c = torch.tensor([1.0, 0.5, 1.0])
    adv = torch.tensor([1.0, -1.0, -1.0])
    logp = inp.logp.detach()
    assert loss.item() == pytest.approx((-(c * adv)[:, None] * logp).sum().item() / 6, rel=1e-6)
    torch.testing.assert_close(grad, (-(c * adv)[:, None]).expand(3, 2) / 6)
    assert stats["neg_weight_mean"].item() == pytest.approx(0.75)
    assert stats["neg_frac"].item() == pytest.approx(2 / 3)


# ----------------------------------------------------------------------------------------------- DRO


def test_dro_hand_values_and_required_beta() -> None:
    # ℓ = −(A·logp − ½β·lr²), ∂ℓ/∂logp = −(A − β·lr); lr = (0.2, −0.4), logp = −1 + lr, A = 1, β = 0.5
    loss, grad, stats = _run("dro", _inp([[0.2, -0.4]], [1.0]), beta=0.5)
    want = (-(-0.8 - 0.25 * 0.04) - (-1.4 - 0.25 * 0.16)) / 2
    assert loss.item() == pytest.approx(want, rel=1e-6)
    torch.testing.assert_close(grad, torch.tensor([[-(1 - 0.1), -(1 + 0.2)]]) / 2)
    assert stats["sq_log_ratio"].item() == pytest.approx(0.1, rel=1e-5)
    with pytest.raises(ObjectiveError, match="'beta' must be set for objective 'dro'"):
        get_objective("dro")(_inp([[0.0]], [1.0]))
    with pytest.raises(ObjectiveError, match="beta must be set and > 0"):
        get_objective("dro")(_inp([[0.0]], [1.0]), beta=0.0)
    with pytest.raises(ObjectiveError, match=r"objective.beta must be set"):
        get_objective("dro").resolve({}, key_prefix="objective.")
    assert get_objective("dro").resolve({}, given_only=True) == {}


# ----------------------------------------------------------------------------------------------- KL-Cov / Clip-Cov


def test_kl_cov_penalises_the_top_covariance_tokens() -> None:
    # 8 tokens, ratio 0.25 -> k = 2 tokens with the largest (A − Ā)(logp − mean logp) get + β·|lr|
    inp = _random(1, n=2, t=4)
    inp.mask[:] = True
    loss, grad, stats = _run("kl_cov", inp, ratio=0.25, beta=1.0)
    lp, adv = inp.logp.detach(), inp.advantages[:, None].expand(2, 4)
    lr = lp - inp.rollout_logp
    cov = (adv - adv.mean()) * (lp - lp.mean())
    top = torch.zeros(8, dtype=torch.bool)
    top[cov.flatten().argsort(descending=True)[:2]] = True
    top = top.view(2, 4)
    rho = lr.exp()
    want_loss = (-adv * rho + torch.where(top, lr.abs(), 0.0)).mean()
    assert loss.item() == pytest.approx(want_loss.item(), rel=1e-6)
    torch.testing.assert_close(grad, (-adv * rho + torch.where(top, lr.sign(), 0.0)) / 8)
    assert stats["cov_selected_frac"].item() == 0.25


def test_clip_cov_is_reproducible_leaves_the_global_rng_alone_and_uses_its_seed() -> None:
    inp = _random(2, n=8, t=8, spread=0.1)
    hp = {"ratio": 0.1, "cov_low": -10.0, "cov_high": 10.0}  # every unclipped token is a candidate
    state = torch.random.get_rng_state()
    _, g1, s1 = _run("clip_cov", inp, **hp)
    _, g2, _ = _run("clip_cov", inp, **hp)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert torch.equal(g1, g2)
    n_valid = int(inp.mask.sum())
    assert (g1[inp.mask] == 0).sum().item() >= int(n_valid * 0.1)  # the chosen tokens lost their gradient
    assert s1["cov_clipped_frac"].item() == pytest.approx(int(n_valid * 0.1) / n_valid)
    others = [_run("clip_cov", inp, choice_seed=s, **hp)[1] for s in (1, 2, 3)]
    assert any(not torch.equal(g1, g) for g in others)
    # no candidate in the band: plain PPO clip
    _, g_none, s_none = _run("clip_cov", inp, cov_low=100.0, cov_high=200.0)
    _, g_grpo, _ = _run("grpo", inp, agg="token-mean")
    torch.testing.assert_close(g_none, g_grpo)
    assert s_none["cov_clipped_frac"].item() == 0.0


# ----------------------------------------------------------------------------------------------- on-policy


@pytest.mark.parametrize("name", ["gmpo", "sapo", "dppo", "topr", "dro", "kl_cov"])
def test_on_policy_gradient_is_the_policy_gradient(name: str) -> None:
    """At ρ ≡ 1 each gives the on-policy policy gradient −A·∇logp (GPG's) under the same aggregation."""
    inp = _random(3)
    inp.logp = inp.rollout_logp.clone()
    agg = get_objective(name).defaults()["agg"]
    hp = {"beta": 0.3} if name == "dro" else {}
    _, g, _ = _run(name, inp, **hp)
    _, g_pg, _ = _run("gpg", inp, agg=agg)
    torch.testing.assert_close(g, g_pg)
    assert (g != 0).any()


def test_gpg_is_reinforce_on_and_off_policy() -> None:
    inp = _random(4)
    _, g, stats = _run("gpg", inp)
    adv = inp.advantages[:, None].expand_as(inp.mask)
    torch.testing.assert_close(g, torch.where(inp.mask, -adv, 0.0) / inp.mask.sum())
    assert "ess" in stats
