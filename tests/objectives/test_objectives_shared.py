"""The shared settings (rollout correction, aggregation, reference KL, entropy bonus): declared once, applied by
``with_shared`` around each objective's own policy term."""

from __future__ import annotations

import inspect
import typing

import pytest
import torch

from p3o.objectives import (
    OBJECTIVES,
    SHARED,
    Objective,
    ObjectiveError,
    ObjectiveInputs,
    PolicyTerm,
    SharedSettings,
    reduce_tokens,
    with_shared,
)
from p3o.objectives.core import Agg, Prepared, RolloutCorrection

# The default aggregation of each objective (as it was when every objective declared its own keywords).
SEQ_MEAN = {"grpo", "gspo", "gmpo", "sapo", "topr"}


def _inputs(seed: int = 0, **kw: object) -> ObjectiveInputs:
    g = torch.Generator().manual_seed(seed)
    roll = -torch.rand(3, 6, generator=g) - 0.1
    logp = (roll + 0.3 * torch.randn(3, 6, generator=g)).requires_grad_()
    mask = torch.rand(3, 6, generator=g) > 0.2
    old = roll + 0.4 * torch.randn(3, 6, generator=g)
    return ObjectiveInputs(logp, roll, mask, torch.tensor([1.0, -0.5, 0.25]), old_logp=old, **kw)


def test_shared_keywords_are_the_settings_fields_in_order() -> None:
    assert SHARED == (
        "agg",
        "ref_kl_coef",
        "entropy_coef",
        "rollout_correction",
        "rollout_correction_cap",
        "rollout_correction_low",
    )
    hints = typing.get_type_hints(SharedSettings)
    assert hints["agg"] == Agg and hints["rollout_correction"] == RolloutCorrection


@pytest.mark.parametrize("name", list(OBJECTIVES))
def test_each_objective_declares_only_its_own_keywords_and_gets_the_shared_ones(name: str) -> None:
    rec = OBJECTIVES[name]
    own = [
        p.name for p in inspect.signature(rec.fn.term).parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY
    ]
    assert not set(own) & set(SHARED), name
    assert list(rec.hypers) == [*own, *SHARED], name
    defaults = rec.defaults()
    settings = SharedSettings(agg="seq-mean-token-mean" if name in SEQ_MEAN else "token-mean")
    assert {k: defaults[k] for k in SHARED} == {k: getattr(settings, k) for k in SHARED}, name
    hints = typing.get_type_hints(SharedSettings)
    assert all(rec.hypers[k].type == hints[k] for k in SHARED), name
    assert rec.fn.shared_defaults == settings


def test_with_shared_refuses_a_term_that_declares_a_shared_keyword() -> None:
    def term(prep: Prepared, *, agg: str = "token-mean") -> PolicyTerm:
        return PolicyTerm(prep.logp, {})

    with pytest.raises(AssertionError, match=r"\['agg'\] are shared settings"):
        with_shared()(term)


@with_shared(agg="seq-mean-token-mean")
def _scaled_reinforce(prep: Prepared, *, scale: float = 2.0) -> PolicyTerm:
    """ℓ_t = −scale·A_t·logp_t: a test objective written the way the registered ones are."""
    return PolicyTerm(-scale * prep.adv * prep.logp, {"scale": torch.tensor(scale)})


def test_a_new_term_gets_the_shared_settings_applied_around_it() -> None:
    inp = _inputs()
    loss, stats = _scaled_reinforce(inp, scale=3.0)
    per = torch.where(inp.mask, -3.0 * inp.advantages[:, None] * inp.logp, 0.0)
    # default aggregation of this objective: seq-mean-token-mean = Σ_i (Σ_t ℓ_it / n_i) / N
    torch.testing.assert_close(loss, reduce_tokens(per, inp.mask, "seq-mean-token-mean"), rtol=0, atol=1e-7)
    assert float(stats["scale"]) == 3.0 and float(stats["num_valid_tokens"]) == float(inp.mask.sum())
    # token-tis: the policy term is weighted by min(π_θold/π_b, C), its ratio anchored at π_θold
    loss_tis, stats_tis = _scaled_reinforce(inp, agg="token-mean", rollout_correction="token-tis")
    w = torch.exp(torch.clamp(inp.old_logp - inp.rollout_logp, max=torch.log(torch.tensor(2.0))))
    want = reduce_tokens(torch.where(inp.mask, per / 3.0 * 2.0 * w, 0.0), inp.mask, "token-mean")
    torch.testing.assert_close(loss_tis, want, rtol=1e-6, atol=1e-7)
    assert "rc_capped_frac" in stats_tis


def test_the_reference_kl_and_entropy_terms_are_added_to_every_term() -> None:
    g = torch.Generator().manual_seed(4)
    ref, ent = -torch.rand(3, 6, generator=g), torch.rand(3, 6, generator=g)
    inp = _inputs(ref_logp=ref, entropy=ent)
    base, _ = _scaled_reinforce(_inputs(), agg="token-mean")
    loss, stats = _scaled_reinforce(inp, agg="token-mean", ref_kl_coef=0.5, entropy_coef=0.1)
    lr = torch.where(inp.mask, inp.logp - ref, 0.0)
    k3 = torch.exp(-lr) + lr - 1
    extra = reduce_tokens(0.5 * k3 - 0.1 * ent, inp.mask, "token-mean")
    torch.testing.assert_close(loss, base + extra, rtol=1e-6, atol=1e-7)
    assert {"ref_kl", "entropy"} <= stats.keys()


def test_a_record_of_a_new_term_reads_its_keywords_and_needs_from_the_signature() -> None:
    rec = Objective("scaled", _scaled_reinforce)
    assert list(rec.hypers) == ["scale", *SHARED]
    assert rec.hypers["scale"].type is float and rec.hypers["agg"].type == Agg
    assert rec.defaults()["agg"] == "seq-mean-token-mean"
    assert rec.inputs_needed({"ref_kl_coef": 0.1, "rollout_correction": "seq-tis"}) == {"ref_logp", "old_logp"}
    with pytest.raises(ObjectiveError, match=r"unknown keyword 'scal'.*did you mean 'scale'"):
        rec.resolve({"scal": 1.0})
    with pytest.raises(TypeError, match="scal"):
        _scaled_reinforce(_inputs(), scal=1.0)


def test_the_wrapped_objective_keeps_the_term_name_and_docstring() -> None:
    assert _scaled_reinforce.__name__ == "_scaled_reinforce"
    assert "ℓ_t = −scale·A_t·logp_t" in (_scaled_reinforce.__doc__ or "")
    sig = inspect.signature(_scaled_reinforce)
    assert list(sig.parameters) == ["inputs", "scale", *SHARED]
    assert sig.parameters["agg"].default == "seq-mean-token-mean"
