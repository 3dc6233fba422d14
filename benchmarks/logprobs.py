"""Peak memory and time of p3o.logprobs's chunked log-probs vs the naive full log-softmax (forward + backward).

    .venv/bin/python benchmarks/logprobs.py                       # N=8, T=1024, V=32000, H=576
    .venv/bin/python benchmarks/logprobs.py --n 2 --t 256          # quick

Only the vocabulary head is benchmarked (random hidden states h (N·T, H) and head W (V, H), both requiring grad):
naive = log_softmax((h Wᵀ).float()).gather(y), p3o = `p3o.logprobs.chunked_head_logprobs` (what `token_logprobs`
runs after the backbone). Loss = Σ_t c_t · logp_t with random c, then backward.

Memory is measured honestly on CPU as the resident-set high-water mark (ru_maxrss) gained during the first
forward+backward, in a fresh process per method (so one method's peak cannot hide the other's; glibc returns
large tensor blocks to the OS, so RSS tracks live tensors; the workers run with MALLOC_MMAP_THRESHOLD_=1 MiB so that
this holds for chunk-sized blocks too). Time is the median of the following repeats. The CPU may be shared:
compare the ratio, not the absolute times.
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
    import torch.nn.functional as F

    from p3o.logprobs import chunked_head_logprobs

    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    m = args.n * args.t
    h = (torch.randn(m, args.h, generator=g) * 0.5).requires_grad_(True)
    w = (torch.randn(args.v, args.h, generator=g) / args.h**0.5).requires_grad_(True)
    y = torch.randint(0, args.v, (m,), generator=g)
    c = torch.randn(m, generator=g)

    def step() -> None:
        if args.method == "naive":
            logits = h @ w.t()  # (M, V)
            logp = F.log_softmax(logits.float(), dim=-1).gather(-1, y[:, None]).squeeze(-1)
        else:
            logp, _ = chunked_head_logprobs(h, w, y, chunk_size=args.chunk_size)
        (logp * c).sum().backward()
        h.grad = None
        w.grad = None

    # Load the matmul / softmax kernels (and their workspaces) before the baseline so only tensors are counted.
    tiny = torch.randn(4, args.h, requires_grad=True)
    F.log_softmax(tiny @ w[:8].detach().t(), -1).sum().backward()
    base = _rss_peak_mib()
    t0 = time.perf_counter()
    step()
    first = time.perf_counter() - t0
    peak = _rss_peak_mib() - base
    times = [first]
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return {"peak_mib": peak, "time_s": statistics.median(times[1:] if len(times) > 1 else times)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--t", type=int, default=1024)
    ap.add_argument("--v", type=int, default=32000)
    ap.add_argument("--h", type=int, default=576, help="hidden size (576 = SmolLM2-135M)")
    ap.add_argument("--chunk-size", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--method", choices=["naive", "p3o"], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.method:  # worker mode
        print(json.dumps(_worker(args)))
        return 0
    res = {}
    for method in ("naive", "p3o"):
        cmd = [sys.executable, __file__, "--method", method]
        for k in ("n", "t", "v", "h", "chunk_size", "repeats", "threads"):
            cmd += [f"--{k.replace('_', '-')}", str(getattr(args, k))]
        # A fixed mmap threshold stops glibc from keeping freed chunk-sized blocks on its heap (its dynamic
        # threshold grows to 32 MiB), so RSS follows the live tensors in both workers alike.
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(1 << 20)}
        out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
        res[method] = json.loads(out.strip().splitlines()[-1])
    full = args.n * args.t * args.v * 4 / 2**20
    print(f"N={args.n} T={args.t} V={args.v} H={args.h} chunk={args.chunk_size} threads={args.threads}")
    print(f"one (N,T,V) float32 tensor = {full:.0f} MiB\n")
    print("| method | peak extra RSS (MiB) | fwd+bwd time (s) |")
    print("|---|---:|---:|")
    for k, r in res.items():
        print(f"| {k} | {r['peak_mib']:.0f} | {r['time_s']:.2f} |")
    mem = res["p3o"]["peak_mib"] / max(res["naive"]["peak_mib"], 1e-9)
    tim = res["p3o"]["time_s"] / res["naive"]["time_s"]
    print(f"\nmemory ratio p3o/naive = {mem:.3f} (target <= 0.25); time ratio = {tim:.2f} (target <= 1.2)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
