"""``p3o mismatch``'s command line: its options, ``--help`` and option errors, answered before torch or transformers
load (issue 47; benchmarks/cli_startup.py); the measurement itself is `p3o.eval.mismatch` (its module doc says what
is measured and how).

    p3o mismatch --model tiny                                    # HFEngine bf16 vs the fp32 trainer, built-in task
    p3o mismatch --model smollm2 --precision bf16,fp8 --max-new-tokens 128 --out runs/mismatch
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from p3o.options import config_field as _f
from p3o.options import run_command

__all__ = ["ABOUT", "USAGE", "MismatchOptions", "main"]

ABOUT = "how far a rollout engine's recorded log-probs are from the fp32 trainer's, before training"


@dataclass
class MismatchOptions:
    """Options of ``p3o mismatch`` (parsed, typed and documented by the same mechanism as ``p3o train``)."""

    model: str = _f("tiny", "tiny | tiny-random | smollm2 | an HF model dir | a Hub id")
    engine: Literal["hf", "vllm"] = _f("hf", "rollout engine measured against the fp32 trainer")
    precision: str = _f("bf16", "comma list of fp32, bf16, fp16, fp8, int8[, bf16+kv-fp8]")
    kv_cache_dtype: str = _f("auto", "vLLM: auto | fp8 | fp8_e4m3 | fp8_e5m2")
    temperature: float = _f(1.0, "sampling temperature", ge=0.0)
    top_p: float = _f(1.0, "nucleus sampling mass (1: off); < 1 adds the sampling-mask replay table", gt=0, le=1)
    top_k: int = _f(0, "top-k sampling (0: off); > 0 adds the sampling-mask replay table", ge=0)
    replay_sampling_mask: bool | Literal["auto"] = _f(
        "auto", "replay each token's kept set in the trainer, as rollout.replay_sampling_mask (auto: on a truncation)"
    )
    logprob_mode: Literal["processed", "raw"] = _f("processed", "log-probs the engine records")
    prompts: str | None = _f(
        None, "a file of prompts (one per line, or .jsonl with 'prompt'; null: the built-in task)"
    )
    num_prompts: int = _f(16, "prompts measured", ge=1)
    group: int = _f(4, "completions per prompt", ge=1)
    max_new_tokens: int = _f(32, "new tokens per completion", ge=1)
    seed: int = _f(0, "sampling seed")
    threads: int = _f(0, "torch threads (0: leave as is)", ge=0)
    no_greedy: bool = _f(False, "skip the greedy-agreement runs")
    out: str | None = _f(None, "directory for mismatch.json, mismatch.md and mismatch.png")
    plot: str | None = _f(None, "the per-position plot's path (null: OUT/mismatch.png)")


USAGE = "usage: p3o mismatch [--model M] [--engine hf|vllm] [--precision bf16,fp8] [--out DIR] [--key value ...]"


def main(argv: Sequence[str] | None = None) -> int:
    """``p3o mismatch --model M [...]``; exit 0 when no finding fired, 1 when one did, 2 on bad options."""
    # p3o.eval.mismatch is heavy (torch and the model libraries): run_command imports it once the options are valid
    return run_command(argv, MismatchOptions, USAGE, ABOUT, "p3o.eval.mismatch:run")


if __name__ == "__main__":
    sys.exit(main())
