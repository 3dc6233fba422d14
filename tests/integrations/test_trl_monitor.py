"""The off-policy monitor in TRL: ``add_offpolicy_monitor`` on a plain ``trl.GRPOTrainer`` (two real steps on the
tiny model, CPU) logs ``offpolicy/*`` next to TRL's metrics, with the lag of the reused generation; on
``P3OGRPOTrainer`` (attached by default) its ESS is the objective's over the same tokens."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("trl")

from test_trl import make_trainer
from trl import GRPOTrainer

from p3o.integrations.trl import OffPolicyCallback, add_offpolicy_monitor


@pytest.fixture(scope="module")
def tokenizer():
    from tiny_lm import build_tokenizer

    return build_tokenizer()


def test_plain_grpo_trainer_logs_offpolicy_metrics(tokenizer, tmp_path):
    torch.set_num_threads(1)
    # num_iterations=2: the generation of step 1 is reused at step 2 (lag 1); TRL then computes old_per_token_logps,
    # the rollout log-probs the monitor compares with.
    trainer = make_trainer(tokenizer, tmp_path, cls=GRPOTrainer, num_iterations=2, max_steps=2)
    callback = add_offpolicy_monitor(trainer)
    assert isinstance(callback, OffPolicyCallback) and callback in trainer.callback_handler.callbacks
    trainer.train()
    logs = [h for h in trainer.state.log_history if "offpolicy/ess" in h]
    assert [h["step"] for h in logs] == [1, 2]
    first, second = logs
    assert "loss" in first and "reward" in first  # next to TRL's own metrics
    assert first["offpolicy/lag_max"] == 0 and second["offpolicy/lag_min"] == 1 == second["offpolicy/lag_max"]
    assert first["offpolicy/ess"] == pytest.approx(1.0, abs=1e-5)
    assert second["offpolicy/ess"] < first["offpolicy/ess"]  # the weights moved between the two passes
    assert second["offpolicy/ess_lag_1"] == pytest.approx(second["offpolicy/ess"])
    assert second["offpolicy/tokens"] > 0 and second["offpolicy/finding_low_ess"] in (0.0, 1.0)
    assert all(math.isfinite(second[f"offpolicy/{k}"]) for k in ("kl_k3", "dlogp_mean", "ratio_max", "m_mean"))
    assert callback.last["step"] == 2
    # the no-signal rule's input, live: the share of groups whose rewards tie, of the generation trained on
    assert first["offpolicy/zero_adv_frac"] == first["frac_reward_zero_std"] == second["offpolicy/zero_adv_frac"]


def test_p3o_trainer_attaches_it_and_agrees_with_the_objective(tokenizer, tmp_path):
    torch.set_num_threads(1)
    trainer = make_trainer(tokenizer, tmp_path, objective="p3o", num_iterations=2, max_steps=2)
    assert isinstance(trainer.offpolicy, OffPolicyCallback)
    trainer.train()
    second = [h for h in trainer.state.log_history if "offpolicy/ess" in h][1]
    # one micro-batch per step and one process: the monitor's ESS is the objective's e_B
    assert second["offpolicy/ess"] == pytest.approx(second["objective/ess"], rel=1e-5)
    assert second["offpolicy/ratio_max"] == pytest.approx(second["objective/ratio_max"], rel=1e-5)
    off = make_trainer(tokenizer, tmp_path / "off", objective="p3o", offpolicy_monitor=False, max_steps=1)
    assert off.offpolicy is None


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ({"top_p": 0.9}, "GRPOConfig.top_p=0.9"),
        ({"top_k": 5}, "GRPOConfig.top_k=5"),
        ({"repetition_penalty": 1.2}, "GRPOConfig.repetition_penalty=1.2"),
        ({"generation_kwargs": {"logit_bias": {3: 2.0}}}, "generation_kwargs.logit_bias"),
    ],
)
def test_sampling_contract_warns_once(tokenizer, tmp_path, setting, named):
    from p3o.integrations.trl import SamplingContractWarning, warn_sampling_contract

    with pytest.warns(SamplingContractWarning, match=named) as record:
        trainer = make_trainer(tokenizer, tmp_path, objective="p3o", max_steps=1, **setting)
    mine = [str(w.message) for w in record if w.category is SamplingContractWarning]
    assert len(mine) == 1 and ("processed log-probs" in mine[0] or "remove it" in mine[0]), mine
    assert warn_sampling_contract(trainer) is not None  # still an issue, but not warned again


def test_sampling_contract_is_silent_by_default(tokenizer, tmp_path):
    from p3o.integrations.trl import sampling_contract_issue

    trainer = make_trainer(tokenizer, tmp_path, cls=GRPOTrainer, max_steps=1, temperature=0.7)
    assert sampling_contract_issue(trainer) is None  # a temperature alone is reflected
