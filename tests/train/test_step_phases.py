"""The phases of the update step, each on its own: resolve the objective, plan, snapshots and anchors, the step's
scope (normalisers, step ESS, M2PO's threshold), the micro-batch loop, the optimizer step and the one-sync reduce."""

from __future__ import annotations

import math

import pytest
import torch
from train_fakes import make_tiny_lm, params_of, random_batch

from p3o.errors import ConfigError
from p3o.logprobs import token_logprobs
from p3o.metrics.monitor import OffPolicyMonitor
from p3o.objectives import Correction, effective_sample_size, get_objective, m2po_threshold
from p3o.train.stats import UpdateStats
from p3o.train.step import (
    UpdateSettings,
    UpdateStep,
    make_optimizer,
    resolve_objective,
    update,
)


def _step(name: str = "p3o", hyper: dict | None = None, *, ref: bool = False, **settings) -> UpdateStep:
    model = make_tiny_lm(seed=0)
    call = resolve_objective(get_objective(name), hyper or {}, None)
    return UpdateStep(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        None,
        call,
        UpdateSettings(**settings),
        ref_model=make_tiny_lm(seed=5) if ref else None,
    )


def _whole_logp(model: torch.nn.Module, batch) -> torch.Tensor:
    with torch.no_grad():
        lp, _ = token_logprobs(model, batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.mask)
    return torch.where(batch.mask, lp, torch.zeros(()))


# -- 0. the objective -------------------------------------------------------------------------------------------------
def test_resolve_objective_binds_once_and_reads_correction_and_tau():
    call = resolve_objective(
        get_objective("grpo"), {"rollout_correction": "seq-mis", "rollout_correction_cap": 3.0}, None
    )
    assert call.needs == {"old_logp"} and call.hyper == {}
    assert call.correction == Correction("seq-mis", 3.0, Correction.low)
    assert resolve_objective(get_objective("m2po"), {"tau": 0.5}, None).tau == 0.5
    assert resolve_objective(get_objective("p3o"), {}, None).correction is None  # no π_θold: no correction anchor
    bound = get_objective("p3o").bind({})
    assert resolve_objective(bound, {}, None).fn is bound
    with pytest.raises(ValueError, match="is bound"):
        resolve_objective(bound, {"cap": "clip"}, None)

    def plain(inputs, **hyper):
        return inputs.logp.sum(), {}

    call = resolve_objective(plain, {"a": 1}, None)
    assert call.needs == frozenset() and call.hyper == {"a": 1} and call.correction is None
    with pytest.raises(ValueError, match="objective record"):
        resolve_objective(plain, {}, {"m2po_threshold"})


# -- 1. the plan ------------------------------------------------------------------------------------------------------
def test_settings_refuse_empty_splits():
    for bad in ({"num_mini_batches": 0}, {"micro_batch_size": 0}, {"epochs": 0}):
        with pytest.raises(ConfigError, match="must be >= 1"):
            UpdateSettings(**bad)


def test_plan_splits_rows_contiguously_and_trims_each_micro_batch():
    step = _step(num_mini_batches=3, micro_batch_size=2)
    batch = random_batch(make_tiny_lm(), n=8)
    plan = step.plan(batch)
    assert [m.tolist() for m in plan.minis] == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert [[mb.rows.tolist() for mb in mbs] for mbs in plan.micros] == [[[0, 1], [2]], [[3, 4], [5]], [[6, 7]]]
    for mb in plan.all_micros:
        assert mb.mask[:, -1].any() and mb.prompt_mask[:, 0].any()  # no all-pad edge column is kept
        assert mb.t_full == batch.mask.shape[1]
        t = mb.mask.shape[1]
        assert torch.equal(mb.mask, batch.mask[mb.rows, :t])  # trimming drops only padding
        assert mb.mask.sum() == batch.mask[mb.rows].sum()
        assert torch.equal(mb.advantages, batch.advantages[mb.rows].float())
    batch.advantages = None
    with pytest.raises(ValueError, match="advantages"):
        step.plan(batch)


# -- 2. snapshots and anchors -----------------------------------------------------------------------------------------
def test_anchors_without_side_inputs_are_the_behaviour_policy():
    step = _step()
    plan = step.plan(random_batch(make_tiny_lm(), n=6))
    anchors = step.anchors(plan)
    assert anchors.old_logp is None and anchors.ref_logp is None
    assert anchors.anchor is plan.batch.rollout_logp and anchors.mask is plan.batch.mask
    assert not anchors.rejected.any()
    assert step.prox(plan, anchors, 0) is None


def test_snapshots_are_the_whole_batch_log_probs_and_the_correction_anchors_on_them():
    hyper = {"rollout_correction": "geo-rs", "rollout_correction_low": 0.8, "rollout_correction_cap": 1.25}
    hyper["ref_kl_coef"] = 0.1
    step = _step("grpo", hyper, ref=True, micro_batch_size=3)
    batch = random_batch(make_tiny_lm(), n=8, noise=0.5, seed=3)
    plan = step.plan(batch)
    anchors = step.anchors(plan)
    torch.testing.assert_close(anchors.old_logp, _whole_logp(step.policy, batch), rtol=0, atol=1e-5)
    torch.testing.assert_close(anchors.ref_logp, _whole_logp(step.ref_model, batch), rtol=0, atol=1e-5)
    assert anchors.anchor is anchors.old_logp or torch.equal(anchors.anchor, anchors.old_logp)
    assert 0 < int(anchors.rejected.sum()) < len(batch)  # geo-rs drops some rows, keeps others
    assert not anchors.mask[anchors.rejected].any()
    assert torch.equal(anchors.mask[~anchors.rejected], batch.mask[~anchors.rejected])


def test_prox_is_old_logp_in_the_first_epoch_then_a_fresh_snapshot():
    step = _step("decoupled_ppo", micro_batch_size=4)
    plan = step.plan(random_batch(make_tiny_lm(), n=8))
    anchors = step.anchors(plan)
    assert step.prox(plan, anchors, 0) is anchors.old_logp
    with torch.no_grad():
        for p in step.policy.parameters():
            p.add_(0.01)
    later = step.prox(plan, anchors, 1)
    torch.testing.assert_close(later, _whole_logp(step.policy, plan.batch), rtol=0, atol=1e-5)
    assert not torch.equal(later, anchors.old_logp)


def test_reference_model_is_required_when_needed():
    model = make_tiny_lm()
    call = resolve_objective(get_objective("p3o"), {"ref_kl_coef": 0.1}, None)
    with pytest.raises(ValueError, match="ref_model"):
        UpdateStep(model, make_optimizer(model, 1e-3), None, call, UpdateSettings())


# -- 2b. the scope of one optimizer step ------------------------------------------------------------------------------
def test_scope_counts_the_whole_step_and_takes_step_ess_and_m2po_threshold_over_it():
    batch = random_batch(make_tiny_lm(), n=8, noise=0.5)
    for name, hyper in (("p3o", {"scope": "step"}), ("m2po", {"tau": 0.01})):
        step = _step(name, hyper, num_mini_batches=2, micro_batch_size=1)
        plan = step.plan(batch)
        anchors = step.anchors(plan)
        scope = step.scope(plan, 1, anchors, None)
        rows = plan.minis[1]
        assert scope.num_tokens.item() == batch.mask[rows].sum().item()
        assert scope.num_seqs.item() == len(rows)
        lr = (_whole_logp(step.policy, batch) - batch.rollout_logp)[rows]
        m = batch.mask[rows]
        if name == "p3o":
            assert scope.m2po_threshold is None
            torch.testing.assert_close(scope.step_ess, effective_sample_size(lr, m), rtol=1e-5, atol=1e-6)
        else:
            assert scope.step_ess is None
            flat = lr[m][None]
            want = m2po_threshold(flat, torch.ones_like(flat, dtype=torch.bool), 0.01)
            torch.testing.assert_close(scope.m2po_threshold, want, rtol=1e-5, atol=1e-6)
    plain = _step("grpo", micro_batch_size=3)
    plan = plain.plan(batch)
    scope = plain.scope(plan, 0, plain.anchors(plan), None)
    assert scope.step_ess is None and scope.m2po_threshold is None  # no pre-pass when nothing needs it


# -- 3. the micro-batch loop and the optimizer step -------------------------------------------------------------------
def _grads_of_one_step(micro: int, monitor: OffPolicyMonitor | None = None):
    step = _step("grpo", num_mini_batches=1, micro_batch_size=micro)
    plan = step.plan(random_batch(make_tiny_lm(), n=8, noise=0.3, seed=4))
    anchors = step.anchors(plan)
    stats = UpdateStats(plan.device)
    observe = None
    if monitor is not None:
        step.monitor = monitor
        observe = step.observer(plan.batch, version=3)
    loss = step.backward(plan.micros[0], anchors, step.scope(plan, 0, anchors, None), stats, observe)
    grads = {n: p.grad.clone() for n, p in step.policy.named_parameters()}
    return loss, grads, stats, plan


def test_micro_batches_accumulate_the_gradient_of_the_whole_step():
    loss_one, grads_one, stats_one, plan = _grads_of_one_step(8)
    loss_many, grads_many, stats_many, _ = _grads_of_one_step(3)
    torch.testing.assert_close(loss_many, loss_one, rtol=1e-5, atol=1e-7)
    for k, g in grads_one.items():
        torch.testing.assert_close(grads_many[k], g, rtol=1e-4, atol=1e-6)
    assert stats_one.weight.item() == stats_many.weight.item() == plan.batch.mask.sum().item()
    assert stats_many.ent_count.item() == plan.batch.mask.sum().item()  # every valid token's entropy counted


def test_the_monitor_sees_every_micro_batch_of_the_first_epoch():
    monitor = OffPolicyMonitor(max_len=6, warn=False)
    *_, plan = _grads_of_one_step(3, monitor)
    out = monitor.update(step=1)
    assert out["tokens"] == plan.batch.mask.sum().item()
    assert _step().observer(plan.batch, 0) is None  # no monitor: nothing to feed


def test_optimizer_step_reports_the_norm_before_clipping_and_clears_gradients():
    step = _step("grpo", grad_clip=1e-3)
    before = params_of(step.policy)
    for p in step.policy.parameters():
        p.grad = torch.ones_like(p)
    want = math.sqrt(sum(p.numel() for p in step.policy.parameters()))
    norm = step.optimizer_step()
    assert norm.item() == pytest.approx(want, rel=1e-5)
    assert all(p.grad is None for p in step.policy.parameters())
    moved = torch.cat([(v - before[k]).flatten() for k, v in params_of(step.policy).items()]).norm()
    assert 0 < moved.item() <= 2 * 0.1 * 1e-3 * (1 + 1e-5)  # lr 0.1 × clipped norm; tied weights count twice


# -- 4. the statistics ------------------------------------------------------------------------------------------------
def test_stats_are_token_weighted_means_maxes_mins_and_step_means():
    stats = UpdateStats(torch.device("cpu"))
    masks = [torch.tensor([[True, True, False]]), torch.tensor([[True, True, True], [True, False, False]])]
    ents = [torch.tensor([[1.0, 3.0, 9.0]]), torch.tensor([[2.0, 2.0, 2.0], [6.0, 9.0, 9.0]])]
    for i, (m, e) in enumerate(zip(masks, ents)):
        st = {"kl": torch.tensor(float(i + 1)), "ratio_max": torch.tensor(2.0 - i), "ratio_min": torch.tensor(0.5 + i)}
        stats.add_micro(st, m, e)
    stats.add_step(torch.tensor(1.0), torch.tensor(3.0))
    stats.add_step(torch.tensor(2.0), torch.tensor(5.0))
    model = torch.nn.Linear(1, 1)
    out = stats.reduce(torch.optim.SGD(model.parameters(), lr=0.25))
    assert out["kl"] == pytest.approx((1 * 2 + 2 * 4) / 6)  # weighted by 2 and 4 valid tokens
    assert out["entropy"] == pytest.approx((1 + 3 + 2 + 2 + 2 + 6) / 6)
    assert out["ratio_max"] == 2.0 and out["ratio_min"] == 0.5
    assert out["loss"] == 1.5 and out["grad_norm"] == 4.0 and out["lr"] == 0.25 and out["optimizer_steps"] == 2.0
    bare = UpdateStats(torch.device("cpu"))
    bare.add_micro({"kl": torch.tensor(1.0)}, masks[0], None)
    bare.add_step(torch.tensor(0.0), torch.tensor(0.0))
    assert "ratio_max" not in bare.reduce(torch.optim.SGD(model.parameters(), lr=0.1))


# -- the whole step ---------------------------------------------------------------------------------------------------
def test_an_update_step_built_once_equals_update_called_per_batch():
    batches = [random_batch(make_tiny_lm(), n=8, seed=s) for s in (1, 2)]
    hyper = {"scope": "step", "ref_kl_coef": 0.1, "entropy_coef": 0.01}
    settings = {"num_mini_batches": 2, "micro_batch_size": 3, "epochs": 2}
    runs = []
    for once in (True, False):
        model, ref = make_tiny_lm(seed=0), make_tiny_lm(seed=5)
        opt = make_optimizer(model, 1e-2)
        call = resolve_objective(get_objective("p3o"), hyper, None)
        built = UpdateStep(model, opt, None, call, UpdateSettings(**settings), ref_model=ref)
        stats = [
            built.run(b, v)
            if once
            else update(model, opt, None, b, get_objective("p3o"), hyper, ref_model=ref, **settings)
            for v, b in enumerate(batches)
        ]
        runs.append((stats, params_of(model)))
    assert runs[0][0] == runs[1][0]
    for k, v in runs[0][1].items():
        assert torch.equal(v, runs[1][1][k]), k
