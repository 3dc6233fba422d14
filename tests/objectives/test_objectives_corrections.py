"""Rollout corrections: the anchoring fix (the objective's ratio is taken against π_θold when a correction is
active), verl's IcePop test vector, the new corrections' hand values, a slow per-token reference loop, accumulation
and robustness."""

from __future__ import annotations

import math

import pytest
import torch

from p3o.objectives import (
    OBJECTIVES,
    ROLLOUT_CORRECTIONS,
    Correction,
    ObjectiveError,
    ObjectiveInputs,
    correction_anchor,
    get_objective,
)

NEW = ("token-icepop", "seq-tis", "geo-rs", "seq-max-k2", "seq-max-k3")


def _run(name: str, inputs: ObjectiveInputs, **hp: object) -> tuple[torch.Tensor, torch.Tensor, dict]:
    logp = inputs.logp.detach().clone().requires_grad_()
    inputs.logp = logp
    loss, stats = get_objective(name)(inputs, **hp)
    (grad,) = torch.autograd.grad(loss, logp)
    return loss.detach(), grad, stats


def _verl_vector() -> ObjectiveInputs:
    """verl's test_rollout_corr_integration: logp = old = −1, μ = (−0.5, −3.5, −0.8), A = (1, −1, 2) per token."""
    logp = torch.full((1, 3), -1.0)
    mu = torch.tensor([[-0.5, -3.5, -0.8]])
    adv = torch.tensor([[1.0, -1.0, 2.0]])
    return ObjectiveInputs(logp, mu, torch.ones(1, 3, dtype=torch.bool), adv, old_logp=logp.clone())


def test_all_corrections_are_listed() -> None:
    assert set(ROLLOUT_CORRECTIONS) == {"none", "token-tis", "seq-mis", *NEW}
    for name, rec in OBJECTIVES.items():
        assert rec.defaults()["rollout_correction_low"] == 0.5, name


def test_verl_icepop_vector() -> None:
    # W = (e^{−0.5}, 0 (w = e^{2.5} = 12.18 > 5), e^{−0.2}); ρ vs π_θold = 1, so ℓ = −A·W; token-mean over 3
    loss, grad, stats = _run(
        "grpo", _verl_vector(), agg="token-mean", rollout_correction="token-icepop", rollout_correction_cap=5.0
    )
    w = torch.tensor([[math.exp(-0.5), 0.0, math.exp(-0.2)]])
    assert loss.item() == pytest.approx(-0.7479974, rel=1e-6)
    torch.testing.assert_close(grad, -torch.tensor([[1.0, -1.0, 2.0]]) * w / 3)
    assert stats["rc_masked_frac"].item() == pytest.approx(1 / 3)


def test_the_correction_is_not_counted_twice() -> None:
    """grpo + token-tis at cap 5 on verl's vector: verl's decoupled form gives (−e^{−0.5} + 5 − 2e^{−0.2})/3 = 0.919.
    Before the anchoring fix the ratio was taken against π_b AND weighted by π_θold/π_b, which gave 19.73."""
    loss, grad, stats = _run(
        "grpo", _verl_vector(), agg="token-mean", rollout_correction="token-tis", rollout_correction_cap=5.0
    )
    want = (-math.exp(-0.5) + 5.0 - 2 * math.exp(-0.2)) / 3
    assert loss.item() == pytest.approx(want, rel=1e-6) and loss.item() == pytest.approx(0.919, abs=5e-4)
    torch.testing.assert_close(grad, torch.tensor([[-math.exp(-0.5), 5.0, -2 * math.exp(-0.2)]]) / 3)
    assert stats["rc_capped_frac"].item() == pytest.approx(1 / 3)
    # without a correction nothing changes: the ratio stays against the recorded π_b
    inp = _verl_vector()
    inp.old_logp = inp.old_logp + 1.0  # ignored without a correction
    plain, grad, _ = _run("grpo", inp, agg="token-mean")
    rho = torch.exp(torch.tensor([[-0.5, 2.5, -0.2]]))  # π_θ/π_b
    adv = torch.tensor([[1.0, -1.0, 2.0]])
    want = torch.maximum(-adv * rho, -adv * rho.clamp(0.8, 1.2)).mean()
    assert plain.item() == pytest.approx(want.item(), rel=1e-6)


def test_double_counting_before_the_fix_is_19_73() -> None:
    """Reproduce the old number from its definition (ratio against π_b × token-tis weight) to pin what changed."""
    inp = _verl_vector()
    rho = torch.exp(inp.logp - inp.rollout_logp)[0]  # (e^{−0.5}, e^{2.5}, e^{−0.2})
    adv = inp.advantages[0]
    ppo = torch.maximum(-adv * rho, -adv * rho.clamp(0.8, 1.2))
    w = torch.exp((inp.old_logp - inp.rollout_logp)[0]).clamp(max=5.0)
    assert (ppo * w).mean().item() == pytest.approx(19.73, abs=5e-3)
    loss, _, _ = _run(
        "grpo", _verl_vector(), agg="token-mean", rollout_correction="token-tis", rollout_correction_cap=5.0
    )
    assert abs(loss.item() - 19.73) > 18


def _two_rows(geo0: float = 0.6) -> ObjectiveInputs:
    # row 0: lr_old = (−0.5, 2.5, −0.2) (mean 0.6); row 1: lr_old = (0.1, −0.1, 0); π_θ = π_θold
    old = torch.tensor([[-1.0, -1.0, -1.0], [-2.0, -2.0, -2.0]])
    mu = old - torch.tensor([[-0.5, 2.5, -0.2], [0.1, -0.1, 0.0]])
    mu[0] += 0.6 - geo0
    adv = torch.tensor([[1.0, -1.0, 2.0], [1.0, 1.0, 1.0]])
    return ObjectiveInputs(old.clone(), mu, torch.ones(2, 3, dtype=torch.bool), adv, old_logp=old.clone())


def test_seq_tis_hand_values() -> None:
    # row 0: e^{Σ lr_old} = e^{1.8} > 2 -> w = 2; row 1: e^0 = 1. ℓ = −A·w; token-mean over 6
    loss, grad, stats = _run("grpo", _two_rows(), agg="token-mean", rollout_correction="seq-tis")
    assert loss.item() == pytest.approx((2 * (-1 + 1 - 2) + (-3)) / 6, rel=1e-6)
    torch.testing.assert_close(grad, -torch.tensor([[2.0, -2.0, 4.0], [1.0, 1.0, 1.0]]) / 6)
    assert stats["rc_capped_frac"].item() == pytest.approx(0.5)


def test_geo_rs_rejects_rows_that_leave_the_denominators() -> None:
    # geometric mean ratio of row 0: e^{0.6} = 1.82 (> 1.5, rejected), row 1: 1 (kept). Token-mean over row 1 only.
    loss, grad, stats = _run(
        "grpo", _two_rows(), agg="token-mean", rollout_correction="geo-rs", rollout_correction_cap=1.5
    )
    assert loss.item() == pytest.approx(-1.0, rel=1e-6)  # −(1+1+1)/3, not /6
    torch.testing.assert_close(grad, torch.tensor([[0.0, 0.0, 0.0], [-1 / 3, -1 / 3, -1 / 3]]))
    assert stats["rc_rejected_frac"].item() == pytest.approx(0.5)
    assert stats["num_valid_tokens"].item() == 3
    # seq-mean-token-mean: the rejected row leaves the row count too
    loss, _, _ = _run("grpo", _two_rows(), rollout_correction="geo-rs", rollout_correction_cap=1.5)
    assert loss.item() == pytest.approx(-1.0, rel=1e-6)
    # kept under the default cap 2
    _, _, stats = _run("grpo", _two_rows(), agg="token-mean", rollout_correction="geo-rs")
    assert stats["rc_rejected_frac"].item() == 0.0


def test_geo_rs_orientation_is_the_documented_one() -> None:
    """Keep iff low ≤ exp(mean lr_old) ≤ high: a row at 0.65 is kept by [0.6, 1.4]; verl's inverted test
    (1/high ≤ ρ_geo ≤ 1/low) would reject it (1/0.65 = 1.54 > 1.4)."""
    hp = {"agg": "token-mean", "rollout_correction": "geo-rs", "rollout_correction_low": 0.6}
    _, _, stats = _run("grpo", _two_rows(geo0=math.log(0.65)), rollout_correction_cap=1.4, **hp)
    assert stats["rc_rejected_frac"].item() == 0.0
    _, _, stats = _run("grpo", _two_rows(geo0=math.log(0.55)), rollout_correction_cap=1.4, **hp)
    assert stats["rc_rejected_frac"].item() == pytest.approx(0.5)


@pytest.mark.parametrize(("mode", "worst0"), [("seq-max-k2", 0.5 * 2.5**2), ("seq-max-k3", math.exp(2.5) - 3.5)])
def test_seq_max_divergence_masking(mode: str, worst0: float) -> None:
    # row 0's worst token has lr_old = 2.5; row 1's worst k is ≤ k(0.1) (tiny)
    for cap, rejected in ((worst0 - 1e-3, 0.5), (worst0 + 1e-3, 0.0)):
        loss, _, stats = _run(
            "grpo", _two_rows(), agg="token-mean", rollout_correction=mode, rollout_correction_cap=cap
        )
        assert stats["rc_rejected_frac"].item() == pytest.approx(rejected), (mode, cap)
        assert loss.item() == pytest.approx(-1.0 if rejected else (-2 - 3) / 6, rel=1e-6)


@pytest.mark.parametrize(
    ("mode", "hp", "match"),
    [
        ("token-icepop", {"rollout_correction_low": 1.5}, "rollout_correction_low"),
        ("geo-rs", {"rollout_correction_cap": 0.9}, "rollout_correction_low"),
        ("seq-tis", {"rollout_correction_cap": 1.0}, "rollout_correction_cap"),
        ("seq-max-k2", {"rollout_correction_cap": 0.0}, "rollout_correction_cap"),
    ],
)
def test_bad_bounds_are_one_line_errors(mode: str, hp: dict, match: str) -> None:
    with pytest.raises(ObjectiveError, match=match):
        _run("grpo", _two_rows(), rollout_correction=mode, **hp)


# ----------------------------------------------------------------------------------------------- reference loop


def _slow(name: str, d: dict, mode: str, low: float, cap: float) -> tuple[float, list[list[float]]]:
    """Per-token loop: the correction from lr_old = old − μ, the objective (grpo or cispo, token-mean) on
    ρ = π_θ/π_θold, rejected rows out of the denominator."""
    logp, mu, old, mask, adv = d["logp"], d["rollout"], d["old"], d["mask"], d["adv"]
    n, t = len(logp), len(logp[0])
    weights, keep = [[1.0] * t for _ in range(n)], [True] * n
    for i in range(n):
        lro = [min(max(old[i][k] - mu[i][k], -20.0), 20.0) for k in range(t) if mask[i][k]]
        s = sum(old[i][k] - mu[i][k] for k in range(t) if mask[i][k])
        for k in range(t):
            x = min(max(old[i][k] - mu[i][k], -20.0), 20.0)
            if mode == "token-tis":
                weights[i][k] = min(math.exp(x), cap)
            elif mode == "token-icepop":
                weights[i][k] = math.exp(x) if low <= math.exp(x) <= cap else 0.0
            elif mode == "seq-tis":
                weights[i][k] = min(math.exp(min(max(s, -20.0), 20.0)), cap)
            elif mode == "seq-mis":
                weights[i][k] = 1.0 if abs(s) <= math.log(cap) else 0.0
        if mode == "geo-rs" and lro:
            keep[i] = low <= math.exp(sum(lro) / len(lro)) <= cap
        if mode == "seq-max-k2" and lro:
            keep[i] = max(0.5 * x * x for x in lro) <= cap
        if mode == "seq-max-k3" and lro:
            keep[i] = max(math.exp(x) - 1 - x for x in lro) <= cap
    count = sum(1 for i in range(n) for k in range(t) if mask[i][k] and keep[i])
    loss, grad = 0.0, [[0.0] * t for _ in range(n)]
    for i in range(n):
        for k in range(t):
            if not (mask[i][k] and keep[i]):
                continue
            rho, a = math.exp(logp[i][k] - old[i][k]), adv[i]
            if name == "grpo":
                unclipped, clipped = -rho * a, -min(max(rho, 0.8), 1.2) * a
                val, g = (unclipped, -rho * a) if unclipped >= clipped else (clipped, 0.0)
            else:  # cispo (ε_l = 1, ε_h = 4)
                w = min(max(rho, 0.0), 5.0)
                val, g = -w * a * logp[i][k], -w * a
            loss += weights[i][k] * val / max(count, 1)
            grad[i][k] = weights[i][k] * g / max(count, 1)
    return loss, grad


def _random(seed: int, n: int = 5, t: int = 6) -> dict:
    g = torch.Generator().manual_seed(seed)
    mu = -torch.rand(n, t, generator=g) * 2 - 0.1
    old = mu + torch.randn(n, t, generator=g) * 0.5
    logp = old + torch.randn(n, t, generator=g) * 0.15
    mask = torch.rand(n, t, generator=g) > 0.2
    mask[:, 0] = True
    return {"logp": logp, "rollout": mu, "old": old, "mask": mask, "adv": torch.randn(n, generator=g)}


@pytest.mark.parametrize("mode", ["token-tis", "seq-mis", *NEW])
@pytest.mark.parametrize("name", ["grpo", "cispo"])
@pytest.mark.parametrize("seed", [0, 1])
def test_corrections_match_the_slow_loop(mode: str, name: str, seed: int) -> None:
    d = _random(seed)
    low, cap = (0.7, 1.6) if mode in ("token-icepop", "geo-rs") else (0.5, {"seq-max-k2": 0.3}.get(mode, 2.0))
    inp = ObjectiveInputs(d["logp"].clone(), d["rollout"], d["mask"], d["adv"], old_logp=d["old"])
    hp = {
        "agg": "token-mean",
        "rollout_correction": mode,
        "rollout_correction_low": low,
        "rollout_correction_cap": cap,
    }
    loss, grad, _ = _run(name, inp, **hp)
    want_loss, want_grad = _slow(name, {k: v.tolist() for k, v in d.items()}, mode, low, cap)
    assert loss.item() == pytest.approx(want_loss, rel=1e-5, abs=1e-7)
    torch.testing.assert_close(grad, torch.tensor(want_grad), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("mode", ["geo-rs", "seq-max-k3", "token-icepop", "seq-tis"])
@pytest.mark.parametrize("name", ["grpo", "p3o", "minpro"])
def test_accumulation_with_the_anchor_counts(mode: str, name: str) -> None:
    """Micro-batches add up to the one-batch loss when the caller counts what correction_anchor keeps (the
    update step does), including a step-scope P3O ESS taken against π_θold over the kept rows."""
    from p3o.objectives import effective_sample_size

    d = _random(3, n=6)
    corr = Correction(mode, 1.6, 0.7)
    anchor, eff = correction_anchor(d["rollout"], d["mask"], d["old"], corr)
    step = {"num_tokens": eff.sum(), "num_seqs": int(6 - (d["mask"] & ~eff).any(-1).sum())}
    hp: dict = {"rollout_correction": mode, "rollout_correction_low": 0.7, "rollout_correction_cap": 1.6}
    if name == "p3o":
        step["step_ess"] = effective_sample_size(d["logp"] - anchor, eff)
        hp["scope"] = "step"

    def inp(sl: slice) -> ObjectiveInputs:
        return ObjectiveInputs(
            d["logp"][sl].clone(), d["rollout"][sl], d["mask"][sl], d["adv"][sl], old_logp=d["old"][sl], **step
        )

    full, g_full, _ = _run(name, inp(slice(0, 6)), **hp)
    parts = [_run(name, inp(sl), **hp) for sl in (slice(0, 2), slice(2, 3), slice(3, 6))]
    assert sum(p[0].item() for p in parts) == pytest.approx(full.item(), rel=1e-5, abs=1e-7)
    torch.testing.assert_close(torch.cat([p[1] for p in parts]), g_full)


@pytest.mark.parametrize("mode", NEW)
@pytest.mark.parametrize("name", list(OBJECTIVES))
def test_new_corrections_finite_with_extreme_ratios_empty_rows_and_nan(mode: str, name: str) -> None:
    d = _random(4, n=5, t=7)
    g = torch.Generator().manual_seed(4)
    sign = torch.where(torch.rand(5, 7, generator=g) > 0.5, 80.0, -80.0)
    d["old"] = d["rollout"] + sign * (torch.rand(5, 7, generator=g) > 0.6)
    d["logp"] = d["old"] + sign * (torch.rand(5, 7, generator=g) > 0.7)
    d["mask"][3] = False
    d["adv"][1] = 0.0
    bad = ~d["mask"]
    inp = ObjectiveInputs(
        torch.where(bad, float("nan"), d["logp"]),
        torch.where(bad, float("-inf"), d["rollout"]),
        d["mask"],
        d["adv"],
        old_logp=torch.where(bad, float("inf"), d["old"]),
        prox_logp=torch.where(bad, float("nan"), d["old"]),
    )
    hp: dict = {"rollout_correction": mode, "rollout_correction_cap": 5.0}
    if name == "dro":
        hp["beta"] = 0.1
    loss, grad, stats = _run(name, inp, **hp)
    assert torch.isfinite(loss) and torch.isfinite(grad).all(), (name, mode)
    assert (grad[bad] == 0).all()
    assert all(not torch.isnan(v) for v in stats.values())


def test_loss_weight_multiplies_the_policy_term_and_moves_no_anchor() -> None:
    """ObjectiveInputs.loss_weight (verl's zero / sequence-level rollout_is_weights) multiplies ℓ_t only."""
    d = _random(5)
    u = torch.rand(5, 6, generator=torch.Generator().manual_seed(5))
    u[0, 0] = 0.0
    for name in ("p3o", "grpo", "minpro"):
        inp = ObjectiveInputs(d["logp"].clone(), d["rollout"], d["mask"], d["adv"], loss_weight=u)
        _, grad, stats = _run(name, inp, agg="token-mean")
        _, plain, plain_stats = _run(
            name, ObjectiveInputs(d["logp"].clone(), d["rollout"], d["mask"], d["adv"]), agg="token-mean"
        )
        assert stats["ess"] == plain_stats["ess"]  # the ratio is still π_θ/π_b
        if name != "p3o":  # P3O's KL term is part of its per-token loss too: both terms are weighted
            torch.testing.assert_close(grad, plain * torch.where(d["mask"], u, 0.0))
        assert grad[0, 0] == 0
