"""p3o.rollout.capabilities: the CPU probe and the one-line refusals that come before any model loads."""

from __future__ import annotations

import json

import pytest

from p3o.errors import ConfigError
from p3o.rollout import capabilities as cap


def test_probe_reports_this_machine_and_the_forced_avx2_view(monkeypatch):
    monkeypatch.delenv(cap.ISA_ENV, raising=False)
    native = cap.cpu_isa()
    assert native.forced is None
    flags = cap._cpuinfo_flags()
    if "avx512f" in flags:  # the kernel's own report agrees with the probe (torch's checks are the first source)
        assert native.avx512 and native.fp8_kv_cache
    if flags and "avx2" not in flags and "avx512f" not in flags:
        assert not (native.avx2 or native.avx512)
    if native.arch in ("x86_64", "amd64"):
        monkeypatch.setenv(cap.ISA_ENV, "avx2")
        forced = cap.cpu_isa()
        assert forced.avx2 and not (forced.avx512 or forced.amx or forced.fp8_kv_cache)
        assert forced.forced == "avx2" and forced.name == "avx2"


def test_unknown_isa_override_is_one_line(monkeypatch):
    monkeypatch.setenv(cap.ISA_ENV, "sse9")
    with pytest.raises(ConfigError, match="P3O_CPU_ISA") as err:
        cap.cpu_isa()
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("kv", ["fp8", "fp8_e4m3", "fp8_e5m2"])
def test_fp8_kv_cache_refused_without_avx512(monkeypatch, kv):
    if cap.cpu_isa().arch not in ("x86_64", "amd64"):
        pytest.skip("the AVX2 view exists on x86 only")
    monkeypatch.setenv(cap.ISA_ENV, "avx2")
    with pytest.raises(ConfigError, match=r"rollout.kv_cache_dtype: .* needs x86 with AVX-512 or AMX") as err:
        cap.check_vllm_support(kv_cache_dtype=kv, head_dim=32)
    assert "\n" not in str(err.value) and "avx2" in str(err.value)
    cap.check_vllm_support(kv_cache_dtype="auto", head_dim=32)  # the bf16/fp32 cache is fine
    cap.check_vllm_support(kv_cache_dtype=kv, head_dim=32, device="cuda:0")  # GPUs are not this probe's business


def test_head_sizes_without_kernels_are_refused():
    for bad in (8, 16, 24, 272):
        with pytest.raises(ConfigError, match=f"head size {bad} ") as err:
            cap.check_vllm_support(head_dim=bad)
        assert "\n" not in str(err.value) and "rollout.engine hf" in str(err.value)
    for good in (32, 64, 128):
        cap.check_vllm_support(head_dim=good)
    cap.check_vllm_support(head_dim=None)


def test_head_dim_from_configs(tmp_path):
    assert cap.head_dim_of({"head_dim": 48, "hidden_size": 96, "num_attention_heads": 4}) == 48
    assert cap.head_dim_of({"hidden_size": 128, "num_attention_heads": 4}) == 32
    assert cap.head_dim_of({}) is None
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64, "num_attention_heads": 4}))
    assert cap.model_dir_head_dim(tmp_path) == 16
    assert cap.model_dir_head_dim(tmp_path / "missing") is None
    assert cap.model_dir_head_dim("tiny") is None


def _no_model_may_load(monkeypatch):
    import p3o.train.loop

    def refuse(*a, **k):
        raise AssertionError("a model was loaded before the capability check")

    monkeypatch.setattr(p3o.train.loop, "run", refuse)


def test_train_refuses_fp8_kv_cache_before_loading_a_model(monkeypatch, capsys, tmp_path):
    if cap.cpu_isa().arch not in ("x86_64", "amd64"):
        pytest.skip("the AVX2 view exists on x86 only")
    from p3o.train.cli import main

    monkeypatch.setenv(cap.ISA_ENV, "avx2")
    _no_model_may_load(monkeypatch)
    argv = ["--run_dir", str(tmp_path / "r"), "--rollout.engine", "vllm", "--rollout.kv_cache_dtype", "fp8"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "AVX-512 or AMX" in err and err.startswith("p3o train: error:"), err
    assert not (tmp_path / "r").exists()


def test_train_refuses_a_head_size_vllm_cannot_run(monkeypatch, capsys, tmp_path):
    from p3o.train.cli import main

    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"head_dim": 16, "hidden_size": 64, "num_attention_heads": 4}))
    _no_model_may_load(monkeypatch)
    argv = ["--run_dir", str(tmp_path / "r"), "--rollout.engine", "vllm", "--model.name", str(model)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "head size 16" in err, err
