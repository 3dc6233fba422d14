"""Rollout/trainer mismatch per engine precision: |rollout_logp − trainer logp| and the batch ESS (markdown table).

    .venv/bin/python benchmarks/precision.py                  # the built-in tiny policy (p3o.models.load_policy)
    .venv/bin/python benchmarks/precision.py --model random    # a random 5M-parameter Qwen3 (no training needed)
    .venv-vllm/bin/python benchmarks/precision.py --engine all # HFEngine and vLLM (p3o.rollout.VLLMEngine) rows

For each engine and precision the engine (its own copy of the fp32 model, converted) samples `--prompts` × `--group`
completions at temperature 1 with processed log-probs; the fp32 trainer re-scores the same tokens with
`p3o.policy.token_logprobs`. Reported over the valid tokens: mean and max |Δ| with Δ = logp − rollout_logp, the
batch ESS = (Σρ)² / (|B| Σρ²) with ρ = e^Δ (Kong 1992; `p3o.objectives.effective_sample_size`),
and the agreement of greedy tokens with the fp32 trainer's own greedy tokens (HFEngine fp32).

HFEngine's bf16 / fp16 cast its copy and its int8 / fp8 *simulate* W8A8 numerics; the vLLM rows are vLLM's own
kernels and sampler: fp32 / bf16 / fp16 on CPU and GPU, `bf16+kv-fp8` (bf16 with an FP8 KV cache; CPU too, on
AVX-512), fp8 (vLLM's dynamic FP8 weights and activations) on a GPU only.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
from rollout import bench_model  # benchmarks/rollout.py: the same model choice

from p3o.objectives import effective_sample_size

HF_PRECISIONS = "fp32,bf16,fp16,int8,fp8"
VLLM_PRECISIONS = "fp32,bf16,fp16,bf16+kv-fp8,fp8"


def _engine(kind: str, model: torch.nn.Module, prec: str, **kw: Any) -> Any:
    """An HFEngine or VLLMEngine in precision `prec` ("bf16+kv-fp8": a vLLM bf16 engine with an FP8 KV cache)."""
    if kind == "hf":
        from p3o.rollout import HFEngine

        return HFEngine(model, precision=prec, **kw)
    from p3o.rollout import VLLMEngine

    base, _, kv = prec.partition("+kv-")
    return VLLMEngine(model, precision=base, kv_cache_dtype=kv or "auto", **kw)


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
    from p3o.errors import ConfigError
    from p3o.policy import token_logprobs
    from p3o.rollout import HFEngine

    model, desc = bench_model(args.model)
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    prompts = [[1, *torch.randint(3, vocab, (int(torch.randint(6, 16, (1,), generator=g)),), generator=g).tolist()]
               for _ in range(args.prompts)]  # fmt: skip
    greedy_ref = HFEngine(model, temperature=0.0, max_new_tokens=args.new).generate(prompts, n=1)
    kinds = ["hf", "vllm"] if args.engine == "all" else [args.engine]
    rows = []
    for kind in kinds:
        for prec in (args.precisions or (HF_PRECISIONS if kind == "hf" else VLLM_PRECISIONS)).split(","):
            try:
                engine = _engine(kind, model, prec, temperature=1.0, max_new_tokens=args.new)
            except ConfigError as err:  # e.g. vLLM fp8 on a CPU
                rows.append((kind, prec, None, str(err).split(";")[0]))
                continue
            ro = engine.generate(prompts, n=args.group, seed=0)
            if hasattr(engine, "close"):
                engine.close()
            with torch.no_grad():
                lp, _ = token_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.response_ids, ro.mask)
            delta = (lp - ro.rollout_logp)[ro.mask]
            greedy_engine = _engine(kind, model, prec, temperature=0.0, max_new_tokens=args.new)
            greedy = greedy_engine.generate(prompts, n=1)
            if hasattr(greedy_engine, "close"):
                greedy_engine.close()
            t = min(greedy.response_ids.shape[1], greedy_ref.response_ids.shape[1])
            agree = (greedy.response_ids[:, :t] == greedy_ref.response_ids[:, :t]).float().mean()
            ess = float(effective_sample_size(lp - ro.rollout_logp, ro.mask))
            rows.append((kind, prec, (delta.abs().mean(), delta.abs().max(), ess, agree, ro.num_tokens), ""))
    print(f"{desc}; {args.prompts} prompts x {args.group}, {args.new} new tokens, temperature 1, processed logp\n")
    print("| engine | precision | mean abs dlogp | max abs dlogp | batch ESS | greedy agreement | tokens |")
    print("|---|---|---:|---:|---:|---:|---:|")
    names = {"hf": "HFEngine", "vllm": "vLLM"}
    for kind, prec, vals, note in rows:
        if vals is None:
            print(f"| {names[kind]} | {prec} | n/a: {note} | | | | |")
            continue
        mean, mx, ess, agree, n = vals
        print(f"| {names[kind]} | {prec} | {mean:.2e} | {mx:.2e} | {ess:.6f} | {agree:.3f} | {n} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
