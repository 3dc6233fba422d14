"""Peak memory and step time of a LoRA update vs a full-parameter update on SmolLM2-135M, side by side.

    .venv/bin/python benchmarks/lora.py                                # smollm2, N=8 sequences of 64+64 tokens
    .venv/bin/python benchmarks/lora.py --model tiny-random --n 4      # quick

One step = `p3o.logprobs.token_logprobs` forward over [prompt | response], loss = −Σ A·logp, backward, AdamW step
(what `p3o.train.step.update` does per micro-batch, without the objective's few elementwise ops). LoRA: r = --r on
every attention and MLP projection (`p3o.models.lora.apply_lora`, the architecture's default targets).

Memory on CPU is the resident-set high-water mark (ru_maxrss) gained during the first two steps (AdamW allocates
its states in the first) over the RSS after loading, in a fresh process per method (MALLOC_MMAP_THRESHOLD_=1 MiB so
freed tensors go back to the OS); on CUDA it is max_memory_allocated. "state" is exact: trainable parameters × 4
bytes × 3 (gradient + AdamW m and v). Time is the median of the following repeats. The CPU may be shared: compare
the ratios, not the absolute times. "sync" is one engine update after a step (`HFEngine.load_weights` of what the
loop sends: the full state dict, or with LoRA the merged adapted layers, `p3o.models.lora.merged_weights`).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time


def _rss_peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def _worker(args: argparse.Namespace) -> dict:
    import torch

    from p3o.config import LoraConfig
    from p3o.logprobs import token_logprobs
    from p3o.models import load_policy
    from p3o.train.step import make_optimizer

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model, _ = load_policy(args.model)
    model = model.to(device).float()
    if args.method == "lora":
        from p3o.models.lora import apply_lora

        model = apply_lora(model, LoraConfig(r=args.r, alpha=2.0 * args.r), seed=0)
    else:
        model.requires_grad_(True)
    opt = make_optimizer(model, 1e-5)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    vocab = model.get_output_embeddings().weight.shape[0]
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, vocab, (args.n, args.p), generator=g).to(device)
    response = torch.randint(3, vocab, (args.n, args.t), generator=g).to(device)
    pmask = torch.ones_like(prompt, dtype=torch.bool)
    mask = torch.ones_like(response, dtype=torch.bool)
    adv = torch.randn(args.n, 1, generator=g).to(device)

    def step() -> None:
        logp, _ = token_logprobs(model, prompt, pmask, response, mask)
        (-(adv * logp).sum() / mask.sum()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    base_rss = _rss_peak_mib()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base_cuda = torch.cuda.memory_allocated() / 2**20
    step()
    step()
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated() / 2**20 - base_cuda
    else:
        peak = _rss_peak_mib() - base_rss
    times = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    # engine sync: what the loop sends to HFEngine after each update (LoRA: merged adapted layers only)
    from p3o.models.lora import is_lora, merged_copy, merged_weights
    from p3o.rollout import HFEngine

    engine = HFEngine(merged_copy(model) if is_lora(model) else model, None, device=device)
    syncs, sent = [], 0
    for v in range(args.repeats):
        t0 = time.perf_counter()
        weights = merged_weights(model) if is_lora(model) else model.state_dict()
        engine.load_weights(weights, v + 1)
        syncs.append(time.perf_counter() - t0)
        sent = sum(w.numel() for w in weights.values())
    return {
        "sync_s": statistics.median(syncs),
        "sync_mib": sent * 4 / 2**20,
        "method": args.method,
        "trainable": trainable,
        "state_mib": trainable * 4 * 3 / 2**20,
        "peak_mib": peak,
        "step_s": statistics.median(times),
    }


def main(argv: list[str] | None = None) -> int:
    """Run the full and the LoRA update in fresh worker processes and print them side by side with ratios."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2", help="smollm2 | tiny-random | a local HF directory")
    ap.add_argument("--n", type=int, default=8, help="sequences per step")
    ap.add_argument("--p", type=int, default=64, help="prompt tokens")
    ap.add_argument("--t", type=int, default=64, help="response tokens")
    ap.add_argument("--r", type=int, default=16, help="LoRA rank")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--method", choices=["full", "lora"], help=argparse.SUPPRESS)  # worker mode
    args = ap.parse_args(argv)
    if args.method:
        print(json.dumps(_worker(args)))
        return 0
    rows = {}
    for method in ("full", "lora"):
        cmd = [sys.executable, __file__, *(argv if argv is not None else sys.argv[1:]), "--method", method]
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(1 << 20)}
        out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
        rows[method] = json.loads(out.strip().splitlines()[-1])
    print(f"model {args.model}: N={args.n} sequences × ({args.p} prompt + {args.t} response) tokens, LoRA r={args.r}")
    head = f"{'method':<8}{'trainable':>14}{'grad+Adam MiB':>15}{'peak MiB':>11}{'step s':>9}"
    print(f"{head}{'sync s':>9}{'sync MiB':>10}")
    for m, r in rows.items():
        print(
            f"{m:<8}{r['trainable']:>14,}{r['state_mib']:>15.1f}{r['peak_mib']:>11.1f}{r['step_s']:>9.2f}"
            f"{r['sync_s']:>9.3f}{r['sync_mib']:>10.1f}"
        )
    full, lora = rows["full"], rows["lora"]
    print(
        f"ratio lora/full: trainable {lora['trainable'] / full['trainable']:.4f}, "
        f"peak memory {lora['peak_mib'] / max(full['peak_mib'], 1e-9):.2f}, "
        f"step time {lora['step_s'] / full['step_s']:.2f}, sync time {lora['sync_s'] / full['sync_s']:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
