"""p3o.rollout.settings.EngineSettings: one record, built once, checked once, taken by every engine and the factory."""

from __future__ import annotations

import argparse
import dataclasses

import pytest
import torch

import p3o.rollout
from p3o.config import RolloutConfig, TrainConfig
from p3o.errors import ConfigError
from p3o.rollout import HFEngine
from p3o.rollout.factory import make_engine
from p3o.rollout.settings import ENGINES, KV_CACHE_DTYPES, EngineSettings
from p3o.rollout.vllm import VLLMEngine

PROMPTS = [[1, 5, 7, 9], [1, 3], [1, 11, 12]]


def _same_rollouts(a, b) -> None:
    for name in ("prompt_ids", "response_ids", "mask", "rollout_logp", "policy_version", "truncated"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name


@pytest.mark.parametrize(
    ("fields", "key"),
    [
        ({"engine": "sglang"}, "rollout.engine: unknown engine 'sglang'"),
        ({"precision": "fp4"}, "rollout.precision: unknown 'fp4'"),
        ({"temperature": -1.0}, "rollout.temperature"),
        ({"top_p": 0.0}, "rollout.top_p"),
        ({"top_k": -1}, "rollout.top_k"),
        ({"max_new_tokens": 0}, "rollout.max_new_tokens"),
        ({"logprob_mode": "x"}, "rollout.logprob_mode: unknown"),
        ({"logprob_mode": "raw", "top_p": 0.9}, "rollout.logprob_mode: raw"),
        ({"engine": "vllm", "kv_cache_dtype": "fp4"}, "rollout.kv_cache_dtype: unknown 'fp4'"),
        ({"kv_cache_dtype": "fp8"}, "rollout.kv_cache_dtype: an FP8 KV cache needs rollout.engine vllm"),
    ],
)
def test_a_bad_value_is_one_line_naming_its_key(fields, key) -> None:
    with pytest.raises(ConfigError, match=key) as err:
        EngineSettings(**fields)
    assert "\n" not in str(err.value)


def test_values_are_normalised_once_and_the_record_is_frozen() -> None:
    s = EngineSettings(temperature=1, top_p=1, top_k=2.0, max_new_tokens=8.0, seed=3.0, device=torch.device("cpu"))
    assert (type(s.temperature), type(s.top_p), type(s.top_k), type(s.max_new_tokens), type(s.seed)) == (
        float,
        float,
        int,
        int,
        int,
    )
    assert s.device == "cpu" and EngineSettings(device="auto").device == "auto"  # the engine resolves "auto"
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.temperature = 0.5  # type: ignore[misc]
    assert EngineSettings(engine="vllm", kv_cache_dtype="fp8_e5m2").kv_cache_dtype in KV_CACHE_DTYPES
    assert ENGINES == ("hf", "vllm")


def test_built_from_the_rollout_config_with_every_shared_field() -> None:
    ro = RolloutConfig(precision="bf16", temperature=0.7, top_p=0.9, top_k=5, max_new_tokens=12)
    s = EngineSettings.from_config(ro, seed=11, device="cpu")
    assert s == EngineSettings(
        precision="bf16", temperature=0.7, top_p=0.9, top_k=5, max_new_tokens=12, seed=11, device="cpu"
    )
    # every field but seed and device is a rollout.* key of the config: none of them can drift apart
    config_keys = {f.name for f in dataclasses.fields(TrainConfig().rollout)}
    assert {f.name for f in dataclasses.fields(EngineSettings)} - config_keys == {"seed", "device"}
    vllm = RolloutConfig(engine="vllm", kv_cache_dtype="fp8", kv_cache_gib=2.0, gpu_memory_utilization=0.5)
    got = EngineSettings.from_config(vllm)
    assert (got.engine, got.kv_cache_dtype, got.kv_cache_gib, got.gpu_memory_utilization) == ("vllm", "fp8", 2.0, 0.5)


def test_built_from_command_options_named_like_the_fields() -> None:
    args = argparse.Namespace(engine=None, precision="fp16", temperature=0.5, top_p=1.0, seed=4, n_samples=8)
    assert EngineSettings.fields_of(args) == {"precision": "fp16", "temperature": 0.5, "top_p": 1.0, "seed": 4}
    s = EngineSettings.from_config(args, max_new_tokens=9)
    assert (s.engine, s.precision, s.temperature, s.seed, s.max_new_tokens) == ("hf", "fp16", 0.5, 4, 9)


def test_an_engine_from_the_record_samples_as_one_from_keywords(tiny_lm) -> None:
    fields = {"precision": "bf16", "temperature": 0.8, "top_k": 7, "max_new_tokens": 6, "seed": 5}
    settings = EngineSettings(**fields)
    by_record = HFEngine(tiny_lm, None, settings)
    by_keywords = HFEngine(tiny_lm, precision="bf16", temperature=0.8, top_k=7, max_new_tokens=6, seed=5)
    by_factory = make_engine(settings, tiny_lm, None)
    by_kind = make_engine("hf", tiny_lm, None, **fields)
    assert by_record.settings == by_keywords.settings == by_factory.settings == by_kind.settings == settings
    ref = by_record.generate(PROMPTS, n=3, seed=1)
    for other in (by_keywords, by_factory, by_kind):
        _same_rollouts(other.generate(PROMPTS, n=3, seed=1), ref)
    # keywords lay fields over a record; the engine's own keywords stay keywords
    greedy = HFEngine(tiny_lm, None, settings, temperature=0.0, fast_decode=False)
    assert greedy.settings == dataclasses.replace(settings, temperature=0.0) and greedy._fast is None
    with pytest.raises(TypeError, match="unexpected keyword argument 'temprature'"):
        HFEngine(tiny_lm, temprature=0.5)


def test_each_engine_runs_as_its_own_kind(tiny_lm, monkeypatch) -> None:
    # a record that says vllm given to HFEngine runs as hf; so an FP8 KV cache is refused, not silently dropped
    assert HFEngine(tiny_lm, None, EngineSettings(engine="vllm")).settings.engine == "hf"
    with pytest.raises(ConfigError, match=r"needs rollout\.engine vllm"):
        HFEngine(tiny_lm, None, EngineSettings(engine="vllm", kv_cache_dtype="fp8"))
    # the factory dispatches on the record's engine (the vLLM engine's own refusals come before vLLM is needed)
    with pytest.raises(ConfigError, match="int8 has no vLLM counterpart"):
        make_engine(EngineSettings(engine="vllm", precision="int8"), tiny_lm, None)
    with pytest.raises(ConfigError, match="int8 has no vLLM counterpart"):
        VLLMEngine(tiny_lm, precision="int8")
    seen = []
    monkeypatch.setattr(p3o.rollout, "HFEngine", lambda model, tok, **kw: seen.append(kw) or "engine")
    assert make_engine(EngineSettings(top_k=3), tiny_lm, None, pad_token_id=0) == "engine"
    assert seen == [{"settings": EngineSettings(top_k=3), "pad_token_id": 0}]
