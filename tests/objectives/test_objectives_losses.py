"""Tests of every objective: hand-computed values, the slow-loop oracle, identities, robustness, accumulation."""

from __future__ import annotations

import inspect
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from objectives_oracle import oracle

from p3o.objectives import (
    OBJECTIVES,
    ObjectiveError,
    ObjectiveInputs,
    cispo,
    effective_sample_size,
    get_objective,
    m2po_clip_bounds,
    m2po_threshold,
    objective_defaults,
    p3o_token_loss,
    reduce_tokens,
)

COMMON = ("agg", "ref_kl_coef", "entropy_coef", "rollout_correction", "rollout_correction_cap")
REQUIRED: dict[str, dict] = {"dro": {"beta": 0.1}}  # hyper-parameters without a default


def _run(name: str, inputs: ObjectiveInputs, **hp: object) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """(loss, d loss / d logp, stats) of objective ``name`` (its required hyper-parameters filled in)."""
    logp = inputs.logp.detach().clone().requires_grad_()
    inputs.logp = logp
    loss, stats = get_objective(name)(inputs, **{**REQUIRED.get(name, {}), **hp})
    (grad,) = torch.autograd.grad(loss, logp)
    return loss.detach(), grad, stats


def _inp(logp: list, rollout: list, adv: list, mask: list | None = None, **kw: object) -> ObjectiveInputs:
    lp = torch.tensor(logp, dtype=torch.float32)
    m = torch.ones_like(lp, dtype=torch.bool) if mask is None else torch.tensor(mask)
    return ObjectiveInputs(lp, torch.tensor(rollout, dtype=torch.float32), m, torch.tensor(adv), **kw)


def _random_data(seed: int, n: int = 4, t: int = 6, spread: float = 0.3) -> dict:
    g = torch.Generator().manual_seed(seed)
    roll = -torch.rand(n, t, generator=g) * 2 - 0.1
    logp = roll + torch.randn(n, t, generator=g) * spread
    prox = logp + torch.randn(n, t, generator=g) * spread
    prox[0, 1] = roll[0, 1] + math.log(7.0)  # one behaviour weight above the decoupled-PPO cap of 5
    mask = torch.rand(n, t, generator=g) > 0.25
    mask[:, 0] = True
    adv = torch.randn(n, generator=g)
    return {"logp": logp, "rollout": roll, "prox": prox, "mask": mask, "adv": adv}


def _inputs(d: dict, **kw: object) -> ObjectiveInputs:
    return ObjectiveInputs(d["logp"].clone(), d["rollout"], d["mask"], d["adv"], prox_logp=d["prox"], **kw)


# ----------------------------------------------------------------------------------------------- hand values


def test_p3o_hand_values() -> None:
    # ρ = (1, 2): ESS = (1+2)² / (2·(1+4)) = 9/10; weights min(ρ, 0.9) = (0.9, 0.9); A = 1
    # KL = (1/1 + 0 − 1, 1/2 + ln2 − 1) = (0, 0.1931472); logp = (−1, −1 + ln2 = −0.3068528)
    # loss = [0.9·1 + 0.1·0 + 0.9·0.3068528 + 0.1·0.1931472] / 2 = 0.5977407
    # grad = [−0.9 + 0.1·(1 − 1), −0.9 + 0.1·(1 − 1/2)] / 2 = (−0.45, −0.425)
    loss, grad, stats = _run("p3o", _inp([[-1.0, -1.0 + math.log(2)]], [[-1.0, -1.0]], [1.0]))
    assert loss.item() == pytest.approx(0.5977407, rel=1e-5)
    torch.testing.assert_close(grad, torch.tensor([[-0.45, -0.425]]))
    assert stats["ess"].item() == pytest.approx(0.9)
    assert stats["kl_weight"].item() == pytest.approx(0.1, rel=1e-5)
    assert stats["capped_frac"].item() == pytest.approx(1.0)  # both ρ > 0.9
    assert stats["ratio_max"].item() == pytest.approx(2.0)
    assert stats["kl_behavior"].item() == pytest.approx(0.1931472 / 2, rel=1e-5)


def test_grpo_hand_values() -> None:
    # A = 1, ρ = (1.5, 0.5), ε = 0.2: token 1 min(1.5, 1.2) = 1.2 (clipped, no grad); token 2 min(0.5, 0.8) = 0.5
    # seq-mean-token-mean: loss = (−1.2 − 0.5)/2 = −0.85 ; grad = (0, −0.5/2) = (0, −0.25)
    loss, grad, stats = _run("grpo", _inp([[math.log(1.5), math.log(0.5)]], [[0.0, 0.0]], [1.0]))
    assert loss.item() == pytest.approx(-0.85, rel=1e-6)
    torch.testing.assert_close(grad, torch.tensor([[0.0, -0.25]]))
    assert stats["clipfrac"].item() == pytest.approx(0.5)
    # A = −1, ρ = 4: −min(−4, −1.2) = 4; dual clip c = 3 bounds it to 3 (no grad); token 2 ρ = 1: loss 1, grad 1
    loss, grad, _ = _run("grpo", _inp([[math.log(4.0), 0.0]], [[0.0, 0.0]], [-1.0]), dual_clip=3.0)
    assert loss.item() == pytest.approx((3.0 + 1.0) / 2, rel=1e-6)
    torch.testing.assert_close(grad, torch.tensor([[0.0, 0.5]]))


def test_dapo_clip_higher() -> None:
    # A = 1, ρ = 1.25 (inside 1 + 0.28, outside 1 + 0.2): DAPO keeps the gradient −1.25, GRPO clips it to 0
    inp = _inp([[math.log(1.25)]], [[0.0]], [1.0])
    _, g_dapo, _ = _run("dapo", inp)
    _, g_grpo, _ = _run("grpo", inp)
    assert g_dapo.item() == pytest.approx(-1.25) and g_grpo.item() == 0.0


def test_cispo_hand_values() -> None:
    # ρ = (6, 0.5), A = 1, cap 1 + 4 = 5: w = (5, 0.5); logp = (ln6 − 2, ln0.5 − 2)
    # loss = −(5·(ln6 − 2) + 0.5·(ln0.5 − 2))/2 ; grad = −(5, 0.5)/2
    lp = [math.log(6) - 2, math.log(0.5) - 2]
    loss, grad, stats = _run("cispo", _inp([lp], [[-2.0, -2.0]], [1.0]))
    assert loss.item() == pytest.approx(-(5 * lp[0] + 0.5 * lp[1]) / 2, rel=1e-6)
    torch.testing.assert_close(grad, torch.tensor([[-2.5, -0.25]]))
    assert stats["trunc_high_frac"].item() == pytest.approx(0.5)


def test_minpro_hand_values() -> None:
    # ρ = (0.5, 2, 0.25, 3), A = 1: m = (1, 0.5, 0.5, 0.25) (min of STRICTLY preceding ratios)
    # m·ρ = (0.5, 1, 0.125, 0.75) (all inside [0, 5]); grad = −(0.5, 1, 0.125, 0.75)/4
    lr = [math.log(x) for x in (0.5, 2, 0.25, 3)]
    loss, grad, stats = _run("minpro", _inp([lr], [[0.0] * 4], [1.0]))
    torch.testing.assert_close(grad, -torch.tensor([[0.5, 1, 0.125, 0.75]]) / 4)
    # loss = −Σ w_t·logp_t / 4 with logp = lr (rollout_logp = 0)
    assert loss.item() == pytest.approx(-sum(w * x for w, x in zip((0.5, 1, 0.125, 0.75), lr)) / 4, rel=1e-5)
    assert stats["m_mean"].item() == pytest.approx((1 + 0.5 + 0.5 + 0.25) / 4)
    assert stats["m_median"].item() == pytest.approx(0.5)
    assert stats["m_frac_above_0.5"].item() == pytest.approx(0.25)  # only m = 1 is > 0.5
    assert stats["m_frac_above_0.2"].item() == pytest.approx(1.0)
    # deciles of relative position k/4: k = 0, 1, 2, 3 -> deciles 0, 2, 5, 7
    assert stats["weight_decile_2"].item() == pytest.approx(1.0)
    assert stats["weight_decile_7"].item() == pytest.approx(0.75)
    assert stats["weight_decile_1"].item() == 0.0


def test_m2po_hand_values() -> None:
    # lr = (0.5, 0.1, −0.05, 0): lr² = (0.25, 0.01, 0.0025, 0); mean 0.065625 ≥ 0.04 -> drop 0.25;
    # the rest: 0.0125/3 = 0.0042 < 0.04 -> only token 1 masked. loss = −(e^0.1 + e^−0.05 + 1)/4 (A = 1)
    lr = [0.5, 0.1, -0.05, 0.0]
    loss, grad, stats = _run("m2po", _inp([lr], [[0.0] * 4], [1.0]))
    assert loss.item() == pytest.approx(-(math.exp(0.1) + math.exp(-0.05) + 1) / 4, rel=1e-6)
    torch.testing.assert_close(grad, -torch.tensor([[0.0, math.exp(0.1), math.exp(-0.05), 1.0]]) / 4)
    assert stats["masked_frac"].item() == pytest.approx(0.25)


def test_gspo_hand_values() -> None:
    # lr = (0.2, −0.1): s = e^{0.05} = 1.0512711; ε = 0.2 both sides -> unclipped; A = 1
    # every token: ℓ = −s, grad −s; seq-mean-token-mean: loss = −s, grad = −s/2 per token
    s = math.exp(0.05)
    loss, grad, stats = _run("gspo", _inp([[0.2, -0.1]], [[0.0, 0.0]], [1.0]), clip_eps_low=0.2, clip_eps_high=0.2)
    assert loss.item() == pytest.approx(-s, rel=1e-6)
    torch.testing.assert_close(grad, torch.full((1, 2), -s / 2))
    assert stats["seq_ratio_mean"].item() == pytest.approx(s, rel=1e-6)
    # default ε = 4e-4: s = 1.0513 > 1 + 4e-4 is clipped for A > 0 -> no gradient
    _, grad, stats = _run("gspo", _inp([[0.2, -0.1]], [[0.0, 0.0]], [1.0]))
    assert grad.abs().sum().item() == 0.0 and stats["clipfrac"].item() == 1.0


def test_decoupled_ppo_hand_values() -> None:
    # w = π_prox/π_b = (2, 6); 6 > cap 5 -> masked; r = π_θ/π_prox = (1.1, 1); A = 1, ε = 0.2
    # token 1: −2·min(1.1, 1.1) = −2.2, grad −2·1.1; token 2: 0. token-mean over 2: loss −1.1, grad (−1.1, 0)
    inp = _inp([[math.log(2.2), math.log(6)]], [[0.0, 0.0]], [1.0])
    inp.prox_logp = torch.tensor([[math.log(2), math.log(6)]])
    loss, grad, stats = _run("decoupled_ppo", inp)
    assert loss.item() == pytest.approx(-1.1, rel=1e-6)
    torch.testing.assert_close(grad, torch.tensor([[-1.1, 0.0]]))
    assert stats["behav_capped_frac"].item() == pytest.approx(0.5)
    # clamp mode: token 2 weight 5, r = 1: loss (−2.2 − 5)/2 = −3.6, grad (−1.1, −2.5)
    loss, grad, _ = _run("decoupled_ppo", inp, weight_mode="clamp")
    assert loss.item() == pytest.approx(-3.6, rel=1e-6)
    torch.testing.assert_close(grad, torch.tensor([[-1.1, -2.5]]))


def test_extra_terms_and_rollout_correction() -> None:
    # on-policy grpo, A = 1, one token: loss −1. ref KL with ref = logp − ln2: k3 = e^{−ln2}... lr_ref = ln2:
    # e^{−ln2} + ln2 − 1 = 0.1931472; η = 0.5 -> +0.0965736. entropy H = 0.3, β = 0.1 -> −0.03
    inp = _inp([[-1.0]], [[-1.0]], [1.0], ref_logp=torch.tensor([[-1.0 - math.log(2)]]), entropy=torch.tensor([[0.3]]))
    loss, _, stats = _run("grpo", inp, ref_kl_coef=0.5, entropy_coef=0.1)
    assert loss.item() == pytest.approx(-1 + 0.0965736 - 0.03, rel=1e-5)
    assert stats["ref_kl"].item() == pytest.approx(0.1931472, rel=1e-5)
    # token-tis: π_θold/π_b = 3 -> min(3, 2) = 2 multiplies the policy loss (whose ratio is anchored at π_θold = π_θ)
    inp = _inp([[-1.0, -1.0]], [[-1.0 - math.log(3), -1.0]], [1.0], old_logp=torch.tensor([[-1.0, -1.0]]))
    loss, grad, stats = _run("cispo", inp, rollout_correction="token-tis")
    torch.testing.assert_close(grad, torch.tensor([[-1.0, -0.5]]))  # −(2, 1)·1/2
    assert stats["rc_capped_frac"].item() == pytest.approx(0.5)
    # seq-mis: sequence ratio 3 ∉ [1/2, 2] -> the row is masked; with cap 4 it is kept
    _, grad, stats = _run("cispo", inp, rollout_correction="seq-mis")
    assert grad.abs().sum().item() == 0.0 and stats["rc_masked_frac"].item() == 1.0
    _, grad, _ = _run("cispo", inp, rollout_correction="seq-mis", rollout_correction_cap=4.0)
    torch.testing.assert_close(grad, torch.tensor([[-0.5, -0.5]]))
    with pytest.raises(ObjectiveError, match="ref_logp"):
        _run("p3o", _inp([[-1.0]], [[-1.0]], [1.0]), ref_kl_coef=0.1)
    with pytest.raises(ObjectiveError, match="entropy"):
        _run("p3o", _inp([[-1.0]], [[-1.0]], [1.0]), entropy_coef=0.1)


# ----------------------------------------------------------------------------------------------- oracle


@pytest.mark.parametrize(
    ("name", "hp"),
    [
        ("p3o", {}),
        ("p3o_two_anchor", {}),
        ("p3o_two_anchor", {"variant": "mixture"}),
        ("grpo", {}),
        ("grpo", {"clip_eps": 0.1, "dual_clip": 2.0, "agg": "token-mean"}),
        ("dapo", {}),
        ("gspo", {"clip_eps_low": 0.02, "clip_eps_high": 0.03}),
        ("cispo", {"trunc_eps_low": 0.5, "trunc_eps_high": 0.2}),
        ("decoupled_ppo", {}),
        ("decoupled_ppo", {"weight_mode": "clamp"}),
        ("m2po", {}),
        ("m2po", {"tau": 0.01}),
        ("minpro", {}),
        ("minpro", {"trunc_eps_low": 0.5, "trunc_eps_high": 0.5}),
        ("minpro", {"prefix_stat": "mean"}),
        ("minpro", {"prefix_stat": "mean", "prefix_scope": "including"}),
        ("minpro", {"prefix_stat": "geomean", "prefix_scope": "including"}),
        ("minpro", {"prefix_stat": "prod", "prefix_scope": "including", "trunc_eps_high": 0.3}),
        ("minpro", {"prefix_stat": "min", "prefix_scope": "including"}),
        ("m2po_clip", {}),
        ("m2po_clip", {"tau": 0.01, "floor_low": 0.0, "floor_high": 0.0}),
        ("m2po_clip", {"tau": 5.0}),
        ("p3o", {"agg": "seq-mean-token-sum-norm"}),
        ("gmpo", {}),
        ("gmpo", {"clip_eps_low": 0.1, "clip_eps_high": 0.2}),
        ("sapo", {}),
        ("sapo", {"tau_pos": 2.0, "tau_neg": 0.5, "agg": "token-mean"}),
        ("dppo", {}),
        ("dppo", {"mask_low": 0.02, "mask_high": 0.05, "kl_tau": 0.1, "adv_tau": 2.0}),
        ("topr", {}),
        ("dro", {"beta": 0.5}),
        ("gpg", {}),
        ("kl_cov", {}),
        ("kl_cov", {"ratio": 0.3, "beta": 1.0}),
        ("clip_cov", {"ratio": 1.0, "cov_low": 0.0}),
        ("p3o", {"kl_estimator": "k3_is"}),
        ("p3o", {"kl_estimator": "k2", "scope": "micro-batch"}),
        ("p3o", {"kl_estimator": "none"}),
        ("p3o", {"cap": "clip"}),
        ("p3o", {"cap": "clip", "cap_eps": 0.1, "kl_estimator": "k3_is"}),
    ],
)
@pytest.mark.parametrize("seed", [0, 1])
def test_matches_slow_loop(name: str, hp: dict, seed: int) -> None:
    d = _random_data(seed, spread=0.3 if name != "gspo" else 0.05)
    loss, grad, stats = _run(name, _inputs(d), **hp)
    data = {k: v.tolist() for k, v in d.items()}
    want_loss, want_grad = oracle(name, data, **hp)
    assert loss.item() == pytest.approx(want_loss, rel=1e-4, abs=1e-6)
    torch.testing.assert_close(grad, torch.tensor(want_grad), rtol=1e-4, atol=1e-6)
    for key, value in stats.items():
        assert value.dim() == 0 and not value.requires_grad and torch.isfinite(value), key


# ----------------------------------------------------------------------------------------------- identities


@pytest.mark.parametrize(("other", "agg"), [("grpo", "seq-mean-token-mean"), ("dapo", "token-mean")])
def test_on_policy_p3o_gradient_equals_grpo(other: str, agg: str) -> None:
    d = _random_data(3)
    d["logp"] = d["rollout"].clone()  # ρ ≡ 1
    _, g_p3o, stats = _run("p3o", _inputs(d), agg=agg)
    _, g_other, _ = _run(other, _inputs(d), agg=agg)
    assert stats["ess"].item() == 1.0 and stats["kl_weight"].item() == 0.0
    assert torch.equal(g_p3o, g_other)


def test_p3o_with_cap_one_plus_eps_and_no_kl_is_cispo() -> None:
    d = _random_data(4, spread=1.0)
    eps_h = 0.3
    inp = _inputs(d)
    logp = inp.logp.clone().requires_grad_()
    mask = inp.mask
    lr = torch.where(mask, logp - inp.rollout_logp, 0.0)
    adv = inp.advantages[:, None].expand_as(mask)
    per = p3o_token_loss(torch.where(mask, logp, 0.0), lr, adv, torch.tensor(1 + eps_h), kl=False)
    loss = reduce_tokens(per, mask, "token-mean")
    (g1,) = torch.autograd.grad(loss, logp)
    loss2, g2, _ = _run("cispo", _inputs(d), trunc_eps_high=eps_h)
    torch.testing.assert_close(loss, loss2)
    torch.testing.assert_close(g1, g2)
    assert cispo is get_objective("cispo").fn


def test_m2po_threshold_matches_brute_force() -> None:
    g = torch.Generator().manual_seed(5)
    for spread in (0.05, 0.2, 0.5, 3.0):
        lr = torch.randn(5, 7, generator=g) * spread
        mask = torch.rand(5, 7, generator=g) > 0.3
        vals = sorted((x * x for x in lr[mask].tolist()), reverse=True)
        k = 0
        while k < len(vals) and sum(vals[k:]) / len(vals[k:]) >= 0.04:
            k += 1
        keep = mask & (lr**2 < m2po_threshold(lr, mask, 0.04))
        assert int((mask & ~keep).sum()) == k
        want_kept = sorted(vals[k:])
        assert sorted((lr[keep] ** 2).tolist()) == pytest.approx(want_kept)
    assert m2po_threshold(torch.zeros(2, 2), torch.zeros(2, 2, dtype=torch.bool)).item() == math.inf


# ----------------------------------------------------------------------------------------------- robustness


def _hostile(seed: int) -> dict:
    d = _random_data(seed, n=5, t=7)
    g = torch.Generator().manual_seed(seed)
    sign = torch.where(torch.rand(5, 7, generator=g) > 0.5, 80.0, -80.0)
    d["logp"] = d["rollout"] + sign * (torch.rand(5, 7, generator=g) > 0.6)  # log-ratios of ±80
    d["mask"][3] = False  # an all-masked row
    bad = ~d["mask"]
    d["logp"] = torch.where(bad, float("nan"), d["logp"])
    d["rollout"] = torch.where(bad, float("-inf"), d["rollout"])
    d["prox"] = torch.where(bad, float("inf"), d["prox"])
    d["adv"][1] = 0.0  # a zero-variance group
    return d


def _check_finite(name: str, d: dict, **hp: object) -> None:
    inp = _inputs(d, ref_logp=torch.where(d["mask"], d["rollout"], float("nan")), entropy=torch.rand(5, 7))
    inp.old_logp = torch.where(d["mask"], d["logp"], float("inf"))
    hp = {"ref_kl_coef": 0.1, "entropy_coef": 0.01, "rollout_correction": "token-tis", **hp}
    loss, grad, stats = _run(name, inp, **hp)
    assert torch.isfinite(loss), name
    assert torch.isfinite(grad).all(), name
    assert (grad[~d["mask"]] == 0).all(), name
    for key, value in stats.items():
        assert not torch.isnan(value), (name, key)


@pytest.mark.parametrize("name", list(OBJECTIVES))
def test_robust_to_extreme_ratios_and_nan_at_masked_positions(name: str) -> None:
    _check_finite(name, _hostile(0))
    d = _hostile(1)
    d["mask"][:] = False  # all-masked batch
    inp = _inputs(d)
    loss, grad, stats = _run(name, inp)
    assert loss.item() == 0.0 and (grad == 0).all()
    assert stats["ess"].item() == 1.0


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    scale=st.sampled_from([0.01, 1.0, 20.0, 80.0]),
    name=st.sampled_from(list(OBJECTIVES)),
)
def test_property_finite_everywhere(seed: int, scale: float, name: str) -> None:
    d = _hostile(seed)
    g = torch.Generator().manual_seed(seed)
    lr = (torch.rand(5, 7, generator=g) * 2 - 1) * scale
    d["logp"] = torch.where(d["mask"], d["rollout"].nan_to_num() + lr, d["logp"])
    d["mask"] &= torch.rand(5, 7, generator=g) > 0.2
    _check_finite(name, d)


# ----------------------------------------------------------------------------------------------- accumulation


# kl_cov / clip_cov choose their tokens per call (coupling "batch", as verl does per micro-batch)
# m2po_clip sets its clip range per call (as verl calls M2PO's loss per micro-batch)
@pytest.mark.parametrize(
    "name", [n for n in OBJECTIVES if n not in ("p3o_two_anchor", "kl_cov", "clip_cov", "m2po_clip")]
)
def test_gradient_accumulation_matches_one_batch(name: str) -> None:
    d = _random_data(6, n=6, t=5)
    mask = d["mask"]
    extra: dict = {}
    if name == "p3o":
        extra["step_ess"] = effective_sample_size(d["logp"] - d["rollout"], mask)
    if name == "m2po":
        extra["m2po_threshold"] = m2po_threshold(d["logp"] - d["rollout"], mask, 0.04)
    hp = {"scope": "step"} if name == "p3o" else {}
    step = {"num_tokens": mask.sum(), "num_seqs": 6, **extra}
    full_loss, full_grad, _ = _run(name, _inputs(d, **step), **hp)
    loss_sum, grads = 0.0, []
    for sl in (slice(0, 2), slice(2, 3), slice(3, 6)):
        part = {k: v[sl] for k, v in d.items()}
        loss, grad, _ = _run(name, _inputs(part, **step), **hp)
        loss_sum += loss.item()
        grads.append(grad)
    assert loss_sum == pytest.approx(full_loss.item(), rel=1e-5, abs=1e-6)
    torch.testing.assert_close(torch.cat(grads), full_grad)


def test_p3o_micro_batch_scope_uses_its_own_ess() -> None:
    d = _random_data(7, n=6, t=5, spread=0.8)
    whole = effective_sample_size(d["logp"] - d["rollout"], d["mask"])
    for sl in (slice(0, 3), slice(3, 6)):
        part = {k: v[sl] for k, v in d.items()}
        own = effective_sample_size(part["logp"] - part["rollout"], part["mask"])
        _, _, stats = _run("p3o", _inputs(part, num_tokens=d["mask"].sum()))
        assert stats["ess"].item() == pytest.approx(own.item(), rel=1e-6)
        assert abs(own.item() - whole.item()) > 1e-4
    with pytest.raises(ObjectiveError, match="step_ess"):
        _run("p3o", _inputs(d), scope="step")
    # scope="sequence": one e_B per row (the oracle's per-row ESS)
    _, _, stats = _run("p3o", _inputs(d), scope="sequence")
    rows = effective_sample_size(d["logp"] - d["rollout"], d["mask"], scope="sequence")
    assert stats["ess"].item() == pytest.approx(rows.mean().item(), rel=1e-6)


# ----------------------------------------------------------------------------------------------- registry


def test_registry_names_defaults_and_errors() -> None:
    want = {"p3o", "p3o_two_anchor", "grpo", "dapo", "gspo", "cispo", "decoupled_ppo", "m2po", "minpro"}
    assert want <= set(OBJECTIVES)
    with pytest.raises(ValueError, match="known: p3o"):
        get_objective("ppo2")
    with pytest.raises(ValueError, match=r"unknown keyword 'clip_epsilon'.*clip_eps"):
        get_objective("grpo")(_inp([[0.0]], [[0.0]], [1.0]), clip_epsilon=0.3)
    for name in OBJECTIVES:
        params = inspect.signature(get_objective(name)).parameters
        assert all(params[k].kind is inspect.Parameter.KEYWORD_ONLY for k in COMMON), name
        defaults = objective_defaults(name)
        assert defaults["ref_kl_coef"] == 0.0 and defaults["rollout_correction"] == "none", name
        assert defaults["rollout_correction_cap"] == 2.0 and defaults["entropy_coef"] == 0.0
    assert objective_defaults("grpo")["agg"] == "seq-mean-token-mean"
    assert objective_defaults("p3o")["agg"] == "token-mean"
    assert objective_defaults("dapo")["clip_eps_high"] == 0.28
    assert objective_defaults("cispo")["trunc_eps_high"] == 4.0
    assert objective_defaults("m2po")["tau"] == 0.04


@pytest.mark.parametrize(
    ("name", "hp", "match"),
    [
        ("p3o", {"agg": "mean"}, "agg"),
        ("p3o", {"scope": "global"}, "scope"),
        ("grpo", {"rollout_correction": "tis"}, "rollout_correction"),
        ("minpro", {"prefix_stat": "max"}, "prefix_stat"),
        ("decoupled_ppo", {"weight_mode": "drop"}, "weight_mode"),
        ("grpo", {"clip_eps": -0.1}, "clip_eps_low"),
        ("p3o_two_anchor", {"variant": "avg"}, "variant"),
    ],
)
def test_bad_option_values(name: str, hp: dict, match: str) -> None:
    inp = _inp([[0.0]], [[0.0]], [1.0], prox_logp=torch.zeros(1, 1))
    with pytest.raises(ObjectiveError, match=match):
        get_objective(name)(inp, **hp)


def test_missing_prox_logp_is_named() -> None:
    with pytest.raises(ObjectiveError, match="prox_logp"):
        get_objective("decoupled_ppo")(_inp([[0.0]], [[0.0]], [1.0]))


def test_p3o_capped_frac_ignores_float_noise_on_policy():
    import torch

    from p3o.objectives import ObjectiveInputs, get_objective

    # ratios within ±1e-7 of 1 (fp32 engine vs trainer): e_B ≈ 1 - 1e-14; no token is really above the cap
    torch.manual_seed(0)
    rollout = torch.randn(4, 8)
    logp = (rollout + 1e-7 * torch.randn(4, 8)).requires_grad_()
    _, stats = get_objective("p3o")(ObjectiveInputs(logp, rollout, torch.ones(4, 8, dtype=torch.bool), torch.ones(4)))
    assert stats["capped_frac"] == 0.0
    # a real excursion is still counted: one token with ρ = e^0.5 pulls e_B below 1, so every token (ρ ≥ 1 > e_B)
    # is capped; with that token at ρ = e^-0.5 instead, only the 31 tokens at ρ = 1 are above e_B
    mask = torch.ones(4, 8, dtype=torch.bool)
    up, down = rollout.clone(), rollout.clone()
    up[0, 0] += 0.5
    down[0, 0] -= 0.5
    assert get_objective("p3o")(ObjectiveInputs(up, rollout, mask, torch.ones(4)))[1]["capped_frac"] == 1.0
    assert get_objective("p3o")(ObjectiveInputs(down, rollout, mask, torch.ones(4)))[1]["capped_frac"] == 31 / 32


@pytest.mark.parametrize("name", ["cispo", "minpro"])
def test_truncation_caps_keep_their_old_spelling_for_one_release(name: str) -> None:
    inp = _inp([[0.9, -0.4, 0.3]], [[0.0, 0.0, 0.0]], [1.0])
    new, g_new, _ = _run(name, inp, trunc_eps_low=0.5, trunc_eps_high=0.5)
    with pytest.warns(DeprecationWarning, match=f"{name} keyword 'clip_eps_high' is deprecated; use 'trunc_eps_high'"):
        old, g_old, _ = _run(name, _inp([[0.9, -0.4, 0.3]], [[0.0] * 3], [1.0]), clip_eps_low=0.5, clip_eps_high=0.5)
    torch.testing.assert_close(new, old)
    torch.testing.assert_close(g_new, g_old)
    with pytest.raises(ObjectiveError, match="'clip_eps_high' and 'trunc_eps_high' are the same keyword"):
        get_objective(name)(inp, clip_eps_high=1.0, trunc_eps_high=1.0)


def test_m2po_clip_bounds_hand_values() -> None:
    # harmful tokens: A > 0 with lr > 0, A < 0 with lr < 0. Row 0 (A = 1): lr 0.1, 0.5, −0.3 -> harmful 0.1, 0.5;
    # row 1 (A = −1): lr −0.2, 0.4 -> harmful −0.2. v sorted: 0.01, 0.04, 0.25 (M2 0.1); τ = 0.04 -> budget 0.12:
    # cap at v_(0): 0.01·3 = 0.03 < 0.12; at v_(1): 0.01 + 0.04·2 = 0.09 < 0.12; at v_(2): 0.30 ≥ 0.12 -> k = 2,
    # cap c = sqrt(0.04) = 0.2 -> ε_l = max(1 − e^{−0.2}, 0.3) = 0.3, ε_h = max(e^{0.2} − 1, 0.5) = 0.5
    lr = torch.tensor([[0.1, 0.5, -0.3], [-0.2, 0.4, 0.0]])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    adv = torch.tensor([[1.0] * 3, [-1.0] * 3])
    lo, hi, m2 = m2po_clip_bounds(lr, mask, adv, 0.04)
    assert (lo, hi) == (0.3, 0.5) and m2 == pytest.approx(0.1)
    lo, hi, _ = m2po_clip_bounds(lr, mask, adv, 0.04, floor_low=0.0, floor_high=0.0)
    assert lo == pytest.approx(1 - math.exp(-0.2)) and hi == pytest.approx(math.exp(0.2) - 1)
    # τ = 0.005: even the smallest cap overshoots (0.03 ≥ 0.015) -> c = 0 -> the floors
    assert m2po_clip_bounds(lr, mask, adv, 0.005, floor_low=0.0, floor_high=0.0)[:2] == (0.0, 0.0)
    # M2 ≤ τ, or no harmful token: unconstrained
    assert m2po_clip_bounds(lr, mask, adv, 0.2)[:2] == (1.0, math.inf)
    assert m2po_clip_bounds(lr, mask, torch.zeros_like(adv), 0.04) == (1.0, math.inf, 0.0)
    # the loss: a PPO clip with that range (gradient 0 on the clipped tokens)
    loss, grad, stats = _run("m2po_clip", _inp(lr.tolist(), [[0.0] * 3] * 2, [1.0, -1.0], mask=mask.tolist()))
    assert stats["m2po_eps_low"].item() == pytest.approx(0.3) and stats["m2po_eps_high"].item() == pytest.approx(0.5)
    # ρ(0.5) = 1.65 > 1.5 with A > 0: clipped; every other token inside [0.7, 1.5]
    assert grad[0, 1].item() == 0.0 and grad[0, 0].item() == pytest.approx(-math.exp(0.1) / 5, rel=1e-6)
    want = (-math.exp(0.1) - 1.5 - math.exp(-0.3) + math.exp(-0.2) + math.exp(0.4)) / 5
    assert loss.item() == pytest.approx(want, rel=1e-6)
    assert stats["clipfrac"].item() == pytest.approx(1 / 5)
