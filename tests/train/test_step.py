"""The update step: schedules, what each objective needs, optimizer-step accounting, clipping, side inputs."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from train_fakes import make_tiny_lm, params_of, random_batch

from p3o.errors import ConfigError
from p3o.logprobs import token_logprobs
from p3o.objectives import Objective, ObjectiveInputs, get_objective, reduce_tokens
from p3o.train.step import lr_factor, make_optimizer, make_scheduler, update


def test_lr_factor_warmup_then_constant_or_cosine():
    # warmup 4: 1/4, 2/4, 3/4, 4/4, then constant 1
    assert [lr_factor(s, warmup_steps=4, total_steps=10, schedule="constant") for s in range(6)] == [
        0.25,
        0.5,
        0.75,
        1.0,
        1.0,
        1.0,
    ]
    # cosine from 1 at the end of warmup to min_factor at total_steps: midpoint = (1 + 0.1) / 2
    cos = [lr_factor(s, warmup_steps=2, total_steps=12, schedule="cosine", min_factor=0.1) for s in range(13)]
    assert cos[2] == pytest.approx(1.0) and cos[7] == pytest.approx(0.55) and cos[12] == pytest.approx(0.1)
    assert all(a >= b for a, b in itertools.pairwise(cos[2:]))
    with pytest.raises(ConfigError, match=r"optim\.schedule"):
        make_scheduler(
            torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0),
            warmup_steps=0,
            total_steps=1,
            schedule="sawtooth",
        )


def _needs(name, hyper):
    return get_objective(name).inputs_needed(hyper)


def test_objective_needs():
    assert _needs("p3o", {}) == frozenset()
    assert _needs("decoupled_ppo", {}) == {"prox_logp"}
    assert _needs("p3o_two_anchor", {}) == {"prox_logp"}
    assert _needs("grpo", {"rollout_correction": "token-tis"}) == {"old_logp"}
    assert _needs("p3o", {"ref_kl_coef": 0.1, "entropy_coef": 0.01, "scope": "step"}) == {
        "ref_logp",
        "entropy",
        "step_ess",
    }
    assert _needs("m2po", {}) == {"m2po_threshold"}


def test_update_counts_optimizer_steps_and_reports_stats():
    model = make_tiny_lm()
    batch = random_batch(make_tiny_lm(), n=8)
    opt = make_optimizer(model, 1e-3)
    sched = make_scheduler(opt, warmup_steps=10, total_steps=100)
    stats = update(
        model, opt, sched, batch, get_objective("p3o"), {}, num_mini_batches=2, epochs=3, micro_batch_size=3
    )
    assert stats["optimizer_steps"] == 6  # 2 mini-batches × 3 epochs
    assert sched.last_epoch == 6 and stats["lr"] == pytest.approx(1e-3 * 7 / 10)  # after 6 steps: factor 7/10
    for key in ("loss", "grad_norm", "ess", "kl_weight", "capped_frac", "ratio_max", "ratio_min", "entropy"):
        assert math.isfinite(stats[key]), key
    assert 0 < stats["ess"] <= 1 and stats["ratio_min"] <= stats["ratio_max"]
    assert stats["entropy"] > 0


def test_gradient_clipping_bounds_the_step():
    model = make_tiny_lm()
    before = params_of(model)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    stats = update(model, opt, None, random_batch(make_tiny_lm(), n=8), get_objective("grpo"), {}, grad_clip=1e-3)
    step = torch.cat([(v - before[k]).flatten() for k, v in params_of(model).items()])
    assert stats["grad_norm"] > 1e-3  # the raw norm is reported (before clipping)
    # tied embeddings appear twice in the state dict; the step is at most 2 × the clip norm
    assert step.norm() <= 2e-3 * (1 + 1e-4)


@pytest.mark.parametrize(
    ("name", "hyper", "epochs"),
    [
        ("decoupled_ppo", {}, 2),
        ("p3o_two_anchor", {}, 2),
        ("grpo", {"rollout_correction": "seq-mis"}, 1),
        ("p3o", {"scope": "step"}, 1),
        ("m2po", {}, 1),
        ("p3o", {"entropy_coef": 0.01}, 1),
    ],
)
def test_side_inputs_are_supplied(name, hyper, epochs):
    model = make_tiny_lm()
    opt = make_optimizer(model, 1e-3)
    stats = update(
        model,
        opt,
        None,
        random_batch(make_tiny_lm(), n=6),
        get_objective(name),
        hyper,
        needs=_needs(name, hyper),
        epochs=epochs,
        micro_batch_size=4,
    )
    assert math.isfinite(stats["loss"])


def test_reference_model_for_ref_kl():
    model, ref = make_tiny_lm(seed=0), make_tiny_lm(seed=1)
    opt = make_optimizer(model, 1e-3)
    hyper = {"ref_kl_coef": 0.1}
    batch = random_batch(make_tiny_lm(), n=4)
    with pytest.raises(ValueError, match="ref_model"):
        update(model, opt, None, batch, get_objective("p3o"), hyper, needs=_needs("p3o", hyper))
    stats = update(model, opt, None, batch, get_objective("p3o"), hyper, needs=_needs("p3o", hyper), ref_model=ref)
    assert stats["ref_kl"] > 0  # different random weights: a non-zero KL to the reference


def test_update_needs_advantages_and_valid_sizes():
    model = make_tiny_lm()
    opt = make_optimizer(model, 1e-3)
    batch = random_batch(make_tiny_lm(), n=4)
    with pytest.raises(ConfigError, match="micro_batch_size"):
        update(model, opt, None, batch, get_objective("p3o"), {}, micro_batch_size=0)
    batch.advantages = None
    with pytest.raises(ValueError, match="advantages"):
        update(model, opt, None, batch, get_objective("p3o"), {})
    with pytest.raises(ConfigError, match=r"optim\.lr"):
        make_optimizer(model, 0.0)


# --------------------------------------------------------------------------------------------------------------------
# The record is the only source of what an objective needs: a spy objective sees exactly those inputs.
# --------------------------------------------------------------------------------------------------------------------

_SIDE = ("old_logp", "prox_logp", "ref_logp", "entropy", "step_ess", "m2po_threshold")


def _spy_record(calls: list, needs: frozenset[str]):
    def spy(
        inputs,
        *,
        rollout_correction: str = "none",
        ref_kl_coef: float = 0.0,
        entropy_coef: float = 0.0,
        scope: str = "micro-batch",
        tau: float = 0.04,
    ):
        calls.append({k: getattr(inputs, k) for k in _SIDE})
        per = -(inputs.logp - inputs.rollout_logp) * inputs.advantages[:, None]
        return reduce_tokens(per, inputs.mask, "token-mean", inputs.num_tokens), {}

    return Objective("spy", spy, needs=needs, coupling="batch")


@pytest.mark.parametrize(
    ("needs", "hyper", "want"),
    [
        (frozenset(), {}, set()),
        (frozenset({"prox_logp"}), {}, {"prox_logp"}),
        (frozenset({"prox_logp"}), {"rollout_correction": "token-tis"}, {"prox_logp", "old_logp"}),
        (frozenset(), {"ref_kl_coef": 0.1, "entropy_coef": 0.01}, {"ref_logp", "entropy"}),
        (frozenset(), {"scope": "step"}, {"step_ess"}),
        (frozenset({"m2po_threshold"}), {"tau": 0.5}, {"m2po_threshold"}),
    ],
)
def test_update_supplies_exactly_the_inputs_the_record_needs(needs, hyper, want):
    calls: list = []
    rec = _spy_record(calls, needs)
    assert rec.inputs_needed(hyper) == want
    model = make_tiny_lm()
    batch = random_batch(make_tiny_lm(), n=6)
    ref = make_tiny_lm() if "ref_logp" in want else None
    update(model, make_optimizer(model, 1e-2), None, batch, rec, hyper, epochs=2, micro_batch_size=3, ref_model=ref)
    assert len(calls) == 2 * 2  # 2 epochs × 2 micro-batches
    for call in calls:
        assert {k for k, v in call.items() if v is not None} == want
    if {"prox_logp", "old_logp"} <= want:
        # π_prox is the snapshot at the start of each epoch: at the first epoch it IS the pre-update policy
        for call in calls[:2]:
            torch.testing.assert_close(call["prox_logp"], call["old_logp"], rtol=0, atol=0)
        assert not torch.equal(calls[2]["prox_logp"], calls[2]["old_logp"])  # the second epoch moved on


@pytest.mark.parametrize(
    ("name", "hyper"),
    [
        ("p3o", {"scope": "step", "rollout_correction": "geo-rs"}),
        ("grpo", {"agg": "token-mean", "rollout_correction": "seq-max-k2", "rollout_correction_cap": 0.3}),
        ("grpo", {"rollout_correction": "geo-rs"}),
    ],
)
def test_row_rejecting_corrections_are_counted_for_the_whole_step(name, hyper):
    """A row rejection removes rows from the step's denominators and its step-scope ESS, which are taken against
    π_θold like the objective's ratio: splitting the step into micro-batches changes nothing."""
    hyper = {"rollout_correction_low": 0.8, "rollout_correction_cap": 1.25, **hyper}
    batch = random_batch(make_tiny_lm(), n=8, noise=0.5, seed=3)
    out = []
    for mbs in (8, 2):
        model = make_tiny_lm()
        sgd = torch.optim.SGD(model.parameters(), lr=1.0)  # scale-sensitive: Adam would hide a wrong denominator
        stats = update(model, sgd, None, batch, get_objective(name), hyper, micro_batch_size=mbs, grad_clip=0.0)
        out.append((params_of(model), stats))
    assert 0 < out[0][1]["rc_rejected_frac"] < 1
    before = params_of(make_tiny_lm())
    steps = [{k: v - before[k] for k, v in params.items()} for params, _ in out]
    scale = max(v.abs().max().item() for v in steps[0].values())
    for key, value in steps[0].items():
        torch.testing.assert_close(steps[1][key], value, rtol=1e-4, atol=1e-5 * scale)
    assert out[0][1]["loss"] == pytest.approx(out[1][1]["loss"], rel=1e-5, abs=1e-7)
    # and the step's loss is the objective on the whole batch with its own (kept-row) denominators
    with torch.no_grad():
        logp, _ = token_logprobs(make_tiny_lm(), batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.mask)
    whole = ObjectiveInputs(logp, batch.rollout_logp, batch.mask, batch.advantages, old_logp=logp)
    want, _ = get_objective(name)(whole, **{**hyper, "scope": "micro-batch"} if name == "p3o" else hyper)
    assert out[1][1]["loss"] == pytest.approx(want.item(), rel=1e-5, abs=1e-7)
