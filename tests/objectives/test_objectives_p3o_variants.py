"""P3O's opt-in variants beyond the paper: the KL estimator (k3 / k3_is / k2 / none) and the sign-following cap."""

from __future__ import annotations

import math

import pytest
import torch

from p3o.objectives import KL_ESTIMATORS, ObjectiveError, ObjectiveInputs, get_objective, kl_estimate

LN2 = math.log(2)


def _run(name: str, inputs: ObjectiveInputs, **hp: object) -> tuple[torch.Tensor, torch.Tensor, dict]:
    logp = inputs.logp.detach().clone().requires_grad_()
    inputs.logp = logp
    loss, stats = get_objective(name)(inputs, **hp)
    (grad,) = torch.autograd.grad(loss, logp)
    return loss.detach(), grad, stats


def _inp(logp: list, rollout: list, adv: list) -> ObjectiveInputs:
    lp = torch.tensor(logp, dtype=torch.float32)
    return ObjectiveInputs(lp, torch.tensor(rollout), torch.ones_like(lp, dtype=torch.bool), torch.tensor(adv))


def _random(seed: int, n: int = 4, t: int = 6, spread: float = 0.4) -> ObjectiveInputs:
    g = torch.Generator().manual_seed(seed)
    roll = -torch.rand(n, t, generator=g) * 2 - 0.1
    logp = roll + torch.randn(n, t, generator=g) * spread
    mask = torch.rand(n, t, generator=g) > 0.25
    adv = torch.randn(n, generator=g)
    adv[1] = 0.0
    return ObjectiveInputs(logp, roll, mask, adv)


@pytest.mark.parametrize(
    ("estimator", "value", "grad"),
    [
        # at lr = ln 2 (ρ = 2) and lr = −ln 2 (ρ = 1/2): value and d/dlr
        ("k3", [0.5 + LN2 - 1, 2 - LN2 - 1], [1 - 0.5, 1 - 2]),
        ("k3_is", [2 * LN2 - 2 + 1, -0.5 * LN2 - 0.5 + 1], [2 * LN2, -0.5 * LN2]),
        ("k2", [0.5 * LN2**2, 0.5 * LN2**2], [LN2, -LN2]),
        ("none", [0.0, 0.0], [0.0, 0.0]),
    ],
)
def test_kl_estimators_hand_values_and_gradients(estimator: str, value: list, grad: list) -> None:
    lr = torch.tensor([LN2, -LN2], requires_grad=True)
    k = kl_estimate(lr, estimator)
    (g,) = torch.autograd.grad(k.sum(), lr, allow_unused=True, materialize_grads=True)
    torch.testing.assert_close(k.detach(), torch.tensor(value))
    torch.testing.assert_close(g, torch.tensor(grad))
    # ≥ 0, zero at lr = 0, finite value and gradient at |lr| = 80
    lr = torch.tensor([-80.0, -3.0, 0.0, 3.0, 80.0], requires_grad=True)
    k = kl_estimate(lr, estimator)
    (g,) = torch.autograd.grad(k.sum(), lr, allow_unused=True, materialize_grads=True)
    assert torch.isfinite(k).all() and torch.isfinite(g).all() and (k >= 0).all() and k[2] == 0
    with pytest.raises(ObjectiveError, match="kl_estimator"):
        kl_estimate(lr, "k4")


@pytest.mark.parametrize(
    ("estimator", "loss", "grad2"),
    [
        # the P3O hand example (ρ = (1, 2), e_B = 0.9, A = 1): loss = [0.9 + 0.9·(1 − ln2) + 0.1·k(ln2)] / 2,
        # grad = [−0.9, −0.9 + 0.1·k'(ln2)] / 2
        ("k3", (0.9 + 0.9 * (1 - LN2) + 0.1 * (0.5 + LN2 - 1)) / 2, (-0.9 + 0.1 * 0.5) / 2),
        ("k3_is", 0.6073984868, -0.3806852819),
        ("k2", 0.6000950941, -0.4153426410),
        ("none", 0.5880837687, -0.45),
    ],
)
def test_p3o_kl_estimator_hand_values(estimator: str, loss: float, grad2: float) -> None:
    got, grad, stats = _run("p3o", _inp([[-1.0, -1.0 + LN2]], [[-1.0, -1.0]], [1.0]), kl_estimator=estimator)
    assert got.item() == pytest.approx(loss, rel=1e-5)
    torch.testing.assert_close(grad, torch.tensor([[-0.45, grad2]]))
    assert stats["ess"].item() == pytest.approx(0.9) and stats["kl_weight"].item() == pytest.approx(0.1, rel=1e-5)


def test_p3o_default_is_the_paper_k3_and_ess_cap() -> None:
    inp = _random(0)
    base, g_base, _ = _run("p3o", inp)
    same, g_same, _ = _run("p3o", _random(0), kl_estimator="k3", cap="ess")
    assert torch.equal(base, same) and torch.equal(g_base, g_same)
    defaults = get_objective("p3o").defaults()
    assert defaults["kl_estimator"] == "k3" and defaults["cap"] == "ess" and defaults["cap_eps"] == 0.2
    assert set(KL_ESTIMATORS) == {"k3", "k3_is", "k2", "none"}


def test_p3o_sign_clip_cap_hand_values() -> None:
    # row 0: A = +1, ρ = (1.1, 1.5); row 1: A = −1, ρ = (0.7, 0.9); ε = 0.2 keeps 1.1 (≤ 1.2) and 0.9 (≥ 0.8)
    rho = [[1.1, 1.5], [0.7, 0.9]]
    lr = [[math.log(r) for r in row] for row in rho]
    inp = _inp(lr, [[0.0, 0.0], [0.0, 0.0]], [1.0, -1.0])
    flat = [r for row in rho for r in row]
    e_b = sum(flat) ** 2 / (4 * sum(r * r for r in flat))
    loss, grad, stats = _run("p3o", inp, cap="clip", kl_estimator="none")
    assert loss.item() == pytest.approx((-1.1 * lr[0][0] + 0.9 * lr[1][1]) / 4, rel=1e-5)
    torch.testing.assert_close(grad, torch.tensor([[-1.1, 0.0], [0.0, 0.9]]) / 4)
    assert stats["capped_frac"].item() == 0.5
    # with the k3 term: + (1 − e_B)·(1/ρ + lr − 1) per token, gradient (1 − e_B)·(1 − 1/ρ)
    loss_k3, grad_k3, _ = _run("p3o", inp, cap="clip")
    kl = sum(1 / r + math.log(r) - 1 for r in flat)
    assert loss_k3.item() == pytest.approx(loss.item() + (1 - e_b) * kl / 4, rel=1e-5)
    kl_grad = torch.tensor([[1 - 1 / r for r in row] for row in rho]) * (1 - e_b) / 4
    torch.testing.assert_close(grad_k3, grad + kl_grad)
    with pytest.raises(ObjectiveError, match="cap"):
        _run("p3o", inp, cap="hard")
    with pytest.raises(ObjectiveError, match="cap_eps"):
        _run("p3o", inp, cap="clip", cap_eps=-0.1)


@pytest.mark.parametrize("eps", [0.1, 0.2, 0.4])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_p3o_clip_cap_policy_gradient_equals_grpo_token_mean(eps: float, seed: int) -> None:
    """The PG part of cap="clip" has exactly GRPO's token-mean gradient at the same ε (no KL term)."""
    inp = _random(seed, spread=0.6)
    _, g_p3o, _ = _run("p3o", inp, cap="clip", cap_eps=eps, kl_estimator="none")
    _, g_grpo, _ = _run("grpo", _random(seed, spread=0.6), clip_eps=eps, agg="token-mean")
    torch.testing.assert_close(g_p3o, g_grpo, rtol=1e-6, atol=1e-8)
    assert (g_p3o != 0).any() and (g_p3o == 0).sum() > (~inp.mask).sum()  # some tokens are clipped


@pytest.mark.parametrize("estimator", ["k3", "k3_is", "k2", "none"])
@pytest.mark.parametrize("cap", ["ess", "clip"])
def test_p3o_variants_finite_at_extreme_ratios_and_nan_free(estimator: str, cap: str) -> None:
    inp = _random(3)
    g = torch.Generator().manual_seed(3)
    sign = torch.where(torch.rand(4, 6, generator=g) > 0.5, 80.0, -80.0)
    logp = inp.rollout_logp + sign * (torch.rand(4, 6, generator=g) > 0.5)
    inp.mask[2] = False  # an empty row
    inp.logp = torch.where(inp.mask, logp, float("nan"))
    inp.rollout_logp = torch.where(inp.mask, inp.rollout_logp, float("-inf"))
    loss, grad, stats = _run("p3o", inp, kl_estimator=estimator, cap=cap)
    assert torch.isfinite(loss) and torch.isfinite(grad).all()
    assert (grad[~inp.mask] == 0).all()
    assert all(torch.isfinite(v) for v in stats.values())


@pytest.mark.parametrize("estimator", ["k3", "k3_is", "k2", "none"])
def test_p3o_variants_on_policy_give_the_policy_gradient(estimator: str) -> None:
    inp = _random(4)
    inp.logp = inp.rollout_logp.clone()  # ρ ≡ 1: e_B = 1, no KL weight, both caps give weight 1
    _, g_ess, _ = _run("p3o", inp, kl_estimator=estimator)
    _, g_clip, _ = _run("p3o", inp, kl_estimator=estimator, cap="clip")
    adv = inp.advantages[:, None].expand_as(inp.mask)
    want = torch.where(inp.mask, -adv, 0.0) / inp.mask.sum()
    torch.testing.assert_close(g_ess, want)
    torch.testing.assert_close(g_clip, want)


def test_p3o_kl_at_proximal_hand_values() -> None:
    """kl_anchor="proximal": e_B and the cap from ρ = π_θ/π_b, the KL term k3(logp − prox_logp) with its gradient."""
    # one row, ρ_b = (1, 2) (e_B = 0.9), π_prox such that logp − prox = (ln 2, −ln 2), A = 1
    inp = _inp([[-1.0, -1.0 + LN2]], [[-1.0, -1.0]], [1.0])
    inp.prox_logp = torch.tensor([[-1.0 - LN2, -1.0 + 2 * LN2]])
    loss, grad, stats = _run("p3o", inp, kl_anchor="proximal")
    kl = (0.5 + LN2 - 1) + (2 - LN2 - 1)  # k3(ln 2) + k3(−ln 2)
    assert loss.item() == pytest.approx((0.9 + 0.9 * (1 - LN2) + 0.1 * kl) / 2, rel=1e-5)
    torch.testing.assert_close(grad, torch.tensor([[-0.9 + 0.1 * (1 - 0.5), -0.9 + 0.1 * (1 - 2)]]) / 2)
    assert stats["ess"].item() == pytest.approx(0.9)
    assert stats["kl_prox"].item() == pytest.approx(kl / 2, rel=1e-5)
    with pytest.raises(ObjectiveError, match="prox_logp"):
        _run("p3o", _inp([[-1.0]], [[-1.0]], [1.0]), kl_anchor="proximal")
    with pytest.raises(ObjectiveError, match="kl_anchor"):
        _run("p3o", inp, kl_anchor="reference")
    assert get_objective("p3o").inputs_needed({"kl_anchor": "proximal"}) >= {"prox_logp"}
    assert "prox_logp" not in get_objective("p3o").inputs_needed()


@pytest.mark.parametrize("estimator", ["k3", "k3_is", "k2"])
@pytest.mark.parametrize("seed", [0, 1])
def test_p3o_kl_at_proximal_is_the_policy_gradient_part_with_one_step_per_batch(estimator: str, seed: int) -> None:
    """With one optimizer step per batch π_prox = sg(π_θ): every estimator has k'(0) = 0, so the gradient is
    exactly P3O's policy-gradient part (kl_estimator="none"), and the KL term's value is 0."""
    inp = _random(seed, spread=0.6)
    inp.prox_logp = inp.logp.detach().clone()
    loss, g_prox, stats = _run("p3o", inp, kl_anchor="proximal", kl_estimator=estimator)
    pg_loss, g_pg, _ = _run("p3o", _random(seed, spread=0.6), kl_estimator="none")
    torch.testing.assert_close(g_prox, g_pg, rtol=0, atol=0)
    torch.testing.assert_close(loss, pg_loss)
    assert stats["kl_prox"].item() == 0.0 and stats["ess"].item() < 0.99  # off-policy w.r.t. π_b all the same
    # a slow reference loop: per token −min(ρ_b, e_B)·A/n_tokens, zero at masked positions
    e_b = stats["ess"].item()
    n = inp.mask.sum().item()
    want = torch.zeros_like(g_prox)
    for i in range(inp.mask.shape[0]):
        for t in range(inp.mask.shape[1]):
            if inp.mask[i, t]:
                rho = math.exp(inp.logp[i, t].item() - inp.rollout_logp[i, t].item())
                want[i, t] = -min(rho, e_b) * inp.advantages[i].item() / n
    torch.testing.assert_close(g_prox, want, rtol=1e-5, atol=1e-7)
