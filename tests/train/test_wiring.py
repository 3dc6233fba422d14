"""p3o.train.wiring.build_rollout_side: every engine of a run comes from ONE engine-settings record of the config."""

from __future__ import annotations

import pytest

from p3o.config import load_config
from p3o.errors import ConfigError
from p3o.models import load_policy
from p3o.rollout.settings import EngineSettings
from p3o.train.wiring import build_rollout_side


def _cfg(tmp_path, *extra: str):
    return load_config(
        [
            "--run_dir",
            str(tmp_path / "run"),
            "--model.name",
            "tiny-random",
            "--model.device",
            "cpu",
            "--task.n_train",
            "8",
            "--task.n_eval",
            "0",
            "--seed",
            "3",
            *extra,
        ]
    )


def test_the_engines_of_a_run_share_the_record_of_its_rollout_config(tmp_path) -> None:
    cfg = _cfg(tmp_path, "--rollout.precision", "bf16", "--rollout.temperature", "0.7", "--rollout.top_k", "5")
    model, tokenizer = load_policy("tiny-random")
    side = build_rollout_side(cfg, lambda: tokenizer)
    first, second = side.make_engine(model), side.make_engine(model)
    assert first.settings is second.settings  # built once, not per engine
    assert first.settings == EngineSettings.from_config(cfg.rollout, seed=3, device="cpu")
    assert (first.settings.precision, first.settings.temperature, first.settings.top_k) == ("bf16", 0.7, 5)
    ro = first.generate(side.prompts[:2], n=2, seed=0)
    assert ro.response_ids.shape[1] <= cfg.rollout.max_new_tokens


def test_a_bad_record_fails_before_the_tokenizer_loads(tmp_path, monkeypatch) -> None:
    cfg = _cfg(tmp_path)
    cfg.rollout.top_p = 0.0  # past the config's own checks (as a programmatic caller could)

    def no_tokenizer():
        raise AssertionError("the tokenizer was loaded before the engine settings were checked")

    with pytest.raises(ConfigError, match=r"rollout\.top_p"):
        build_rollout_side(cfg, no_tokenizer)
