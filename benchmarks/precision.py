"""Rollout/trainer mismatch per engine precision: a thin caller of ``p3o mismatch`` (p3o.eval.mismatch).

    .venv/bin/python benchmarks/precision.py                  # the built-in tiny policy (p3o.models.load_policy)
    .venv/bin/python benchmarks/precision.py --model random    # a random 5M-parameter Qwen3 (no training needed)
    .venv-vllm/bin/python benchmarks/precision.py --engine all # HFEngine and vLLM (p3o.rollout.VLLMEngine) rows

For each engine and precision, ``p3o.eval.mismatch.measure`` samples `--prompts` random-token prompts ×
`--group` completions at temperature 1 with processed log-probs and re-scores them with the fp32 trainer; the table
is ``p3o mismatch``'s (mean and max |Δ|, batch ESS, tails, k1/k2/k3, greedy agreement with the fp32 trainer, and
the same by decode position). What this script adds: the `random` model and random-token prompts (no tokenizer).

HFEngine's bf16 / fp16 cast its copy and its int8 / fp8 *simulate* W8A8 numerics; the vLLM rows are vLLM's own
kernels and sampler: fp32 / bf16 / fp16 on CPU and GPU, `bf16+kv-fp8` (bf16 with an FP8 KV cache; CPU too, on
AVX-512), fp8 (vLLM's dynamic FP8 weights and activations) on a GPU only.
"""

from __future__ import annotations

import argparse

import torch
from rollout import bench_model  # benchmarks/rollout.py: the same model choice

from p3o.eval.mismatch import greedy_reference, measure, render

HF_PRECISIONS = "fp32,bf16,fp16,int8,fp8"
VLLM_PRECISIONS = "fp32,bf16,fp16,bf16+kv-fp8,fp8"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny", help="a p3o.models.load_policy name, or 'random'")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--engine", default="hf", choices=["hf", "vllm", "all"], help="vllm needs vLLM (.venv-vllm)")
    ap.add_argument("--precisions", default=None, help=f"default: {HF_PRECISIONS} (hf), {VLLM_PRECISIONS} (vllm)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    model, desc = bench_model(args.model)
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    prompts = [[1, *torch.randint(3, vocab, (int(torch.randint(6, 16, (1,), generator=g)),), generator=g).tolist()]
               for _ in range(args.prompts)]  # fmt: skip
    ref = greedy_reference(model, None, prompts, args.new)
    kinds = ["hf", "vllm"] if args.engine == "all" else [args.engine]
    results = [
        measure(model, None, prompts, engine=kind, precision=prec, group=args.group, max_new_tokens=args.new,
                greedy_ref=ref)
        for kind in kinds
        for prec in (args.precisions or (HF_PRECISIONS if kind == "hf" else VLLM_PRECISIONS)).split(",")
    ]  # fmt: skip
    header = f"{desc}; {args.prompts} prompts x {args.group}, {args.new} new tokens, temperature 1, processed logp"
    print(render(results, header))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
