"""Generated tokens/s of transformers' model.generate, p3o's HFEngine and VLLMEngine, all returning per-token
log-probs (CPU).

    .venv/bin/python benchmarks/rollout.py                      # batch 32, 64 new tokens, 5M-parameter Qwen3
    .venv/bin/python benchmarks/rollout.py --model tiny         # the built-in tiny policy, when p3o.models has it
    .venv-vllm/bin/python benchmarks/rollout.py --engines generate,hf,vllm --model smollm2 --batch 64 --group 4
    .venv-vllm/bin/python benchmarks/rollout.py --engines generate,hf,vllm --precision bf16

All sample at temperature 1 with no top-k/top-p from the same model, with EOS disabled so that every row
generates exactly `--new` tokens; the baseline's log-probs are log_softmax(output_logits) gathered at the sampled
tokens (inside the timed region). `--precision bf16` casts generate's model and runs both engines in bf16. The
vLLM engine (p3o.rollout.VLLMEngine; `.venv-vllm` on CPU, docs/vllm.md) is started once before timing (its start-up
is reported separately). Runs are interleaved after one warm-up each; best and median are reported. The CPU may be
shared with other jobs: compare the ratios, not the absolute numbers.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F


def bench_model(name: str) -> tuple[torch.nn.Module, str]:
    """The model to benchmark and a one-line description of it."""
    if name != "random":
        from p3o.models import load_policy

        model, _ = load_policy(name)
        return model.float().eval(), f"p3o.models.load_policy({name!r})"
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(
        vocab_size=512,
        hidden_size=256,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        intermediate_size=768,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    model = Qwen3ForCausalLM(cfg).float().eval()
    n = sum(p.numel() for p in model.parameters())
    return model, f"random Qwen3 (hidden 256, 6 layers, vocab 512, {n / 1e6:.1f}M params)"


def _prompts(batch: int, vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(8, 25, (batch,), generator=g).tolist()
    return [[1, *torch.randint(3, vocab, (n - 1,), generator=g).tolist()] for n in lengths]


def run_generate(model: torch.nn.Module, prompts: list[list[int]], new: int, seed: int) -> torch.Tensor:
    """transformers' generate + log-probs of the sampled tokens; returns (N, new) float32 log-probs."""
    p = max(len(x) for x in prompts)
    ids = torch.tensor([[0] * (p - len(x)) + x for x in prompts])
    attn = torch.tensor([[0] * (p - len(x)) + [1] * len(x) for x in prompts])
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=attn,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=new,
            min_new_tokens=new,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=0,
        )
        logits = torch.stack(out.logits, dim=1).float()  # (N, new, V)
        return F.log_softmax(logits, -1).gather(-1, out.sequences[:, p:, None]).squeeze(-1)


ENGINES = {"generate": "transformers generate + log-probs", "hf": "p3o HFEngine", "vllm": "p3o VLLMEngine (vLLM)"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="random", help="'random' (default) or a p3o.models.load_policy name")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--group", type=int, default=1, help="samples per prompt (batch = prompts x group)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--engines", default="generate,hf", help="comma-separated: generate, hf, vllm")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    args = ap.parse_args(argv)
    engines = args.engines.split(",")
    if unknown := sorted(set(engines) - set(ENGINES)):
        ap.error(f"--engines: unknown {unknown}; choose from {', '.join(ENGINES)}")
    torch.set_num_threads(args.threads)
    from p3o.rollout import HFEngine

    model, desc = bench_model(args.model)
    model.generation_config.eos_token_id = None  # every row generates exactly --new tokens in every engine
    model.config.eos_token_id = None
    prompts = _prompts(args.batch // args.group, model.config.vocab_size)
    expanded = [p for p in prompts for _ in range(args.group)]
    tokens = args.batch * args.new
    fns: dict[str, Callable[[int], None]] = {}
    notes: list[str] = []
    if "generate" in engines:
        gen_model = model if args.precision == "fp32" else copy.deepcopy(model).to(torch.bfloat16)

        def baseline(seed: int) -> None:
            lp = run_generate(gen_model, expanded, args.new, seed)
            assert lp.shape == (args.batch, args.new), lp.shape

        fns["generate"] = baseline
    for kind in ("hf", "vllm"):
        if kind not in engines:
            continue
        t0 = time.perf_counter()
        if kind == "hf":
            eng = HFEngine(model, max_new_tokens=args.new, stop_token_ids=[], pad_token_id=0, precision=args.precision)
        else:
            from p3o.rollout import VLLMEngine

            eng = VLLMEngine(
                model, max_new_tokens=args.new, stop_token_ids=[], pad_token_id=0, precision=args.precision
            )
            notes.append(f"VLLMEngine start-up (vLLM import + engine): {time.perf_counter() - t0:.1f} s")

        def ours(seed: int, eng: Any = eng) -> None:
            ro = eng.generate(prompts, n=args.group, seed=seed)
            assert ro.num_tokens == tokens, ro.num_tokens

        fns[kind] = ours

    # Interleave the engines so that load from other jobs hits them alike; report the fastest run of each (the
    # least-disturbed one) and the median.
    for fn in fns.values():
        fn(0)
    times: dict[str, list[float]] = {k: [] for k in fns}
    for r in range(args.repeats):
        for key, fn in fns.items():
            t0 = time.perf_counter()
            fn(r + 1)
            times[key].append(time.perf_counter() - t0)
    best = {k: min(v) for k, v in times.items()}
    med = {k: statistics.median(v) for k, v in times.items()}
    ref = "generate" if "generate" in fns else next(iter(fns))
    print(f"{desc}; batch {args.batch} ({args.batch // args.group} prompts x {args.group}), {args.new} new tokens, ")
    print(f"temperature 1, {args.precision}, {args.threads} threads, best of {args.repeats} interleaved runs\n")
    print(f"| engine | time (s) | tokens/s | vs {ref} (best) | vs {ref} (median) |")
    print("|---|---:|---:|---:|---:|")
    for key in fns:
        print(
            f"| {ENGINES[key]} | {best[key]:.2f} | {tokens / best[key]:.0f} | {best[ref] / best[key]:.2f}x "
            f"| {med[ref] / med[key]:.2f}x |"
        )
    for note in notes:
        print(f"\n{note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
