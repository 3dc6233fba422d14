"""The registry's one resolver (Objective.resolve) and the pre-resolved call path (Objective.bind)."""

from __future__ import annotations

import typing

import pytest
import torch

from p3o.objectives import OBJECTIVES, BoundObjective, ObjectiveError, ObjectiveInputs, get_objective


def _inputs(seed: int = 0) -> ObjectiveInputs:
    g = torch.Generator().manual_seed(seed)
    roll = -torch.rand(3, 5, generator=g) - 0.1
    logp = (roll + 0.3 * torch.randn(3, 5, generator=g)).requires_grad_()
    return ObjectiveInputs(logp, roll, torch.rand(3, 5, generator=g) > 0.2, torch.randn(3, generator=g))


def test_resolve_fills_defaults_renames_aliases_and_returns_given_only() -> None:
    rec = get_objective("cispo")
    full = rec.resolve({"trunc_eps_high": 2.0})
    assert full == {**rec.defaults(), "trunc_eps_high": 2.0}
    assert rec.resolve({"trunc_eps_high": 2.0}, given_only=True) == {"trunc_eps_high": 2.0}
    with pytest.warns(DeprecationWarning, match="cispo keyword 'clip_eps_high' is deprecated; use 'trunc_eps_high'"):
        assert rec.resolve({"clip_eps_high": 2.0}, given_only=True) == {"trunc_eps_high": 2.0}
    with pytest.warns(
        DeprecationWarning, match=r"objective.clip_eps_high is deprecated for cispo; use objective.trunc"
    ):
        rec.resolve({"clip_eps_high": 2.0}, key_prefix="objective.")
    with pytest.raises(ObjectiveError, match="'clip_eps_high' and 'trunc_eps_high' are the same keyword"):
        rec.resolve({"clip_eps_high": 1.0, "trunc_eps_high": 1.0})
    with pytest.raises(ObjectiveError, match=r"objective.clip_eps_high: old spelling of objective.trunc_eps_high"):
        rec.resolve({"clip_eps_high": 1.0, "trunc_eps_high": 1.0}, key_prefix="objective.")


def test_resolve_unknown_keyword_names_the_nearest_and_who_accepts_it() -> None:
    p3o = get_objective("p3o")
    with pytest.raises(ObjectiveError, match=r"^kw: unknown keyword 'clip_eps' for objective 'p3o'.*belongs to grpo"):
        p3o.resolve({"clip_eps": 0.2}, where="kw")
    with pytest.raises(
        ObjectiveError, match=r"unknown key 'objective.clip_eps' for objective 'p3o'.*belongs to .*grpo"
    ):
        p3o.resolve({"clip_eps": 0.2}, key_prefix="objective.")
    with pytest.raises(ObjectiveError, match=r"unknown key 'objective.clip_epss'.*did you mean 'objective.clip_eps'"):
        get_objective("grpo").resolve({"clip_epss": 0.2}, key_prefix="objective.")
    with pytest.raises(ObjectiveError, match=r"objective.name: unknown objective 'grpoo' \(did you mean 'grpo'\?\)"):
        get_objective("grpoo")


def test_resolve_check_hook_coerces_each_given_value_with_the_declared_type() -> None:
    seen: list[tuple[str, typing.Any, typing.Any]] = []

    def check(key: str, value: typing.Any, tp: typing.Any) -> typing.Any:
        seen.append((key, value, tp))
        return float(value) if tp is float else value

    full = get_objective("grpo").resolve({"clip_eps": 1, "agg": "token-mean"}, key_prefix="objective.", check=check)
    assert full["clip_eps"] == 1.0 and isinstance(full["clip_eps"], float)
    assert [k for k, _, _ in seen] == ["objective.clip_eps", "objective.agg"]
    assert typing.get_origin(seen[1][2]) is typing.Literal


@pytest.mark.parametrize("name", ["p3o", "grpo", "minpro", "cispo"])
def test_bind_resolves_once_and_matches_the_record_call(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    rec = get_objective(name)
    bound = rec.bind({"agg": "token-mean"}, rollout_correction="none")
    assert isinstance(bound, BoundObjective) and bound.name == name
    assert bound.hyper == rec.resolve({"agg": "token-mean"})
    assert bound.needs == rec.inputs_needed({"agg": "token-mean"})
    want, want_stats = rec(_inputs(), agg="token-mean")
    calls = []
    monkeypatch.setattr(type(rec), "resolve", lambda *a, **k: calls.append(a) or {})
    got, stats = bound(_inputs())
    assert not calls  # no re-resolution per call
    assert torch.equal(got, want) and stats.keys() == want_stats.keys()
    with pytest.raises(ObjectiveError, match="bound"):
        bound(_inputs(), agg="token-mean")


def test_bind_warns_once_for_a_deprecated_spelling() -> None:
    with pytest.warns(DeprecationWarning) as record:
        bound = get_objective("minpro").bind(clip_eps_high=2.0)
        for _ in range(3):
            bound(_inputs())
    assert len(record) == 1 and bound.hyper["trunc_eps_high"] == 2.0


def test_every_record_binds_with_its_defaults() -> None:
    for name, rec in OBJECTIVES.items():
        required = {k: 0.1 for k, h in rec.hypers.items() if h.default is None and k == "beta"}
        assert rec.bind(**required).hyper == rec.resolve(required), name


def test_coupling_for_a_row_rejecting_correction_is_batch() -> None:
    grpo = get_objective("grpo")
    assert grpo.coupling_for({}) == "row" and grpo.coupling_for({"rollout_correction": "token-tis"}) == "row"
    for mode in ("geo-rs", "seq-max-k2", "seq-max-k3"):
        assert grpo.coupling_for({"rollout_correction": mode}) == "batch"
    assert get_objective("p3o").coupling_for({}) == "ess-scope"
