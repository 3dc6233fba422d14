"""Rollout/trainer mismatch per engine precision: |rollout_logp − trainer logp| and the batch ESS (markdown table).

    .venv/bin/python benchmarks/precision.py                  # p3o.models.load_policy("tiny") when available
    .venv/bin/python benchmarks/precision.py --model random    # a random 5M-parameter Qwen3 (no training needed)

For each precision the engine (its own copy of the fp32 model, converted) samples `--prompts` × `--group`
completions at temperature 1 with processed log-probs; the fp32 trainer re-scores the same tokens with
`p3o.policy.token_logprobs`. Reported over the valid tokens: mean and max |Δ| with Δ = logp − rollout_logp, the
batch ESS = (Σρ)² / (|B| Σρ²) with ρ = e^Δ (Kong 1992; `p3o.objectives.effective_sample_size` when present, else
the same formula in log space here), and the agreement of greedy tokens with the fp32 engine.
"""

from __future__ import annotations

import argparse
import math

import torch


def _ess(log_ratio: torch.Tensor, mask: torch.Tensor) -> float:
    try:
        from p3o.objectives import effective_sample_size
    except ImportError:  # objectives not built yet: same formula, log space, float64 sums
        lr = log_ratio[mask].double()
        if lr.numel() == 0:
            return 1.0
        m = lr.max()
        s1, s2 = torch.exp(lr - m).sum(), torch.exp(2 * (lr - m)).sum()
        return math.exp(float(2 * s1.log() - s2.log() - math.log(lr.numel())))
    return float(effective_sample_size(log_ratio, mask))


def _model(name: str) -> tuple[torch.nn.Module, str]:
    if name != "random":
        try:
            from p3o.models import load_policy

            model, _ = load_policy(name)
            return model.float().eval(), f"p3o.models.load_policy({name!r})"
        except Exception as exc:  # the models module may not exist yet / fail offline: say so and fall back
            note = f"load_policy({name!r}) unavailable ({type(exc).__name__}: {str(exc)[:80]}); "
    else:
        note = ""
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
    return Qwen3ForCausalLM(cfg).float().eval(), note + "random Qwen3 (hidden 256, 6 layers, vocab 512, untrained)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny", help="a p3o.models.load_policy name, or 'random'")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--precisions", default="fp32,bf16,fp16,int8,fp8")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from p3o.policy import token_logprobs
    from p3o.rollout import HFEngine

    model, desc = _model(args.model)
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    prompts = [[1, *torch.randint(3, vocab, (int(torch.randint(6, 16, (1,), generator=g)),), generator=g).tolist()]
               for _ in range(args.prompts)]  # fmt: skip
    greedy_ref = HFEngine(model, temperature=0.0, max_new_tokens=args.new).generate(prompts, n=1)
    rows = []
    for prec in args.precisions.split(","):
        engine = HFEngine(model, precision=prec, temperature=1.0, max_new_tokens=args.new)
        ro = engine.generate(prompts, n=args.group, seed=0)
        with torch.no_grad():
            lp, _ = token_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.response_ids, ro.mask)
        delta = (lp - ro.rollout_logp)[ro.mask]
        greedy = HFEngine(model, precision=prec, temperature=0.0, max_new_tokens=args.new).generate(prompts, n=1)
        t = min(greedy.response_ids.shape[1], greedy_ref.response_ids.shape[1])
        agree = (greedy.response_ids[:, :t] == greedy_ref.response_ids[:, :t]).float().mean()
        ess = _ess(lp - ro.rollout_logp, ro.mask)
        rows.append((prec, delta.abs().mean(), delta.abs().max(), ess, agree, ro.num_tokens))
    print(f"{desc}; {args.prompts} prompts x {args.group}, {args.new} new tokens, temperature 1, processed logp\n")
    print("| precision | mean abs dlogp | max abs dlogp | batch ESS | greedy agreement | tokens |")
    print("|---|---:|---:|---:|---:|---:|")
    for prec, mean, mx, ess, agree, n in rows:
        print(f"| {prec} | {mean:.2e} | {mx:.2e} | {ess:.6f} | {agree:.3f} | {n} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
