"""Sampling-mask replay (issue 45): ratios on fresh top-p / top-k data with and without replay, and replay's cost.

    .venv/bin/python benchmarks/sampling_mask.py                                   # tiny-random, top-p 0.8
    .venv/bin/python benchmarks/sampling_mask.py --model smollm2 --top-k 0 --prompts 8 --group 4 --max-new-tokens 64

An fp32 HFEngine samples ``--prompts`` × ``--group`` completions of the arithmetic task's held-out prompts with the
trainer's own weights (fresh data: every ratio should be 1). The fp32 trainer re-scores them over the whole
vocabulary (replay off) and over each token's recorded kept set (replay on, `p3o.logprobs.token_logprobs` kept=):
mean ratio, share of tokens outside [0.9, 1.1], the kept mass and the mean set size.

Cost per update: one `p3o.train.step.update` (P3O, micro-batches of ``--micro-batch-size`` rows) on that batch,
with and without the kept sets, each in a fresh process: the median wall time of ``--repeats`` updates after one
warm-up, and the resident-set high-water mark (ru_maxrss) gained during the first update. The CPU may be shared:
compare the two modes, not absolute times.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def _worker(args: argparse.Namespace) -> dict:
    import torch

    from p3o.models import load_policy
    from p3o.objectives import get_objective
    from p3o.train.sources import rollouts_from_state
    from p3o.train.step import make_optimizer, update

    torch.set_num_threads(args.threads)
    model, _ = load_policy(args.model)
    model = model.float()
    batch = rollouts_from_state(torch.load(args.batch, weights_only=True))
    if args.worker == "full":
        batch.sampling_mask = None
    objective = get_objective("p3o").bind({})
    times, gained = [], 0.0
    for i in range(args.repeats + 1):
        opt = make_optimizer(model, 1e-6)
        before = _rss_mib()
        t0 = time.perf_counter()
        update(model, opt, None, batch, objective, {}, micro_batch_size=args.micro_batch_size)
        dt = time.perf_counter() - t0
        if i == 0:
            gained = _rss_mib() - before
        else:
            times.append(dt)
    return {"mode": args.worker, "seconds": statistics.median(times), "rss_gain_mib": gained}


def _sample(args: argparse.Namespace, path: Path) -> dict:
    import torch

    from p3o.eval.mismatch import encode_prompts
    from p3o.logprobs import token_logprobs
    from p3o.models import load_policy
    from p3o.rollout import HFEngine
    from p3o.train.sources import rollouts_to_state

    torch.set_num_threads(args.threads)
    model, tok = load_policy(args.model)
    model = model.float().eval()
    prompts = encode_prompts(tok, None, args.prompts, seed=0)
    eng = HFEngine(model, tok, top_p=args.top_p, top_k=args.top_k, max_new_tokens=args.max_new_tokens)
    ro = eng.generate(prompts, n=args.group, seed=0)
    ro.advantages = torch.randn(len(ro), generator=torch.Generator().manual_seed(0))
    torch.save(rollouts_to_state(ro), path)
    m = ro.mask
    qargs = (model, ro.prompt_ids, ro.prompt_mask, ro.response_ids, m)
    with torch.no_grad():
        full, _ = token_logprobs(*qargs)
        replay, _, mass = token_logprobs(*qargs, kept=ro.sampling_mask)
    out = {"tokens": int(m.sum()), "mean_set_size": float(ro.sampling_mask.counts[m].float().mean())}
    out["kept_mass"] = float(mass[m].mean())
    out["kept_set_bytes"] = ro.sampling_mask.ids.numel() * 4 + ro.sampling_mask.counts.numel() * 4
    for name, lp in (("full", full), ("replay", replay)):
        rho = (lp - ro.rollout_logp)[m].double().exp()
        out[f"ratio_mean_{name}"] = float(rho.mean())
        out[f"ratio_out_{name}"] = float(((rho < 0.9) | (rho > 1.1)).double().mean())
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny-random")
    p.add_argument("--top-p", type=float, default=0.8)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--micro-batch-size", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--worker", choices=("full", "replay"), help=argparse.SUPPRESS)
    p.add_argument("--batch", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print(json.dumps(_worker(args)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "batch.pt"
        quality = _sample(args, path)
        costs = {}
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(2**20)}
        for mode in ("full", "replay"):
            cmd = [sys.executable, __file__, *sys.argv[1:], "--worker", mode, "--batch", str(path)]
            res = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
            costs[mode] = json.loads(res.stdout.strip().splitlines()[-1])
    print(json.dumps({"model": args.model, "top_p": args.top_p, "top_k": args.top_k, **quality, "cost": costs}))
    f, r = costs["full"], costs["replay"]
    print(
        f"{args.model} top-p {args.top_p:g} top-k {args.top_k}: {quality['tokens']} tokens, mean kept set "
        f"{quality['mean_set_size']:.1f} ids, kept mass {quality['kept_mass']:.4f}\n"
        f"  ratio mean {quality['ratio_mean_full']:.4f} -> {quality['ratio_mean_replay']:.6f} with replay; outside "
        f"[0.9, 1.1]: {quality['ratio_out_full']:.1%} -> {quality['ratio_out_replay']:.1%}\n"
        f"  update: {f['seconds']:.3f} s -> {r['seconds']:.3f} s ({r['seconds'] / f['seconds'] - 1:+.1%}); RSS gained "
        f"{f['rss_gain_mib']:.0f} -> {r['rss_gain_mib']:.0f} MiB; kept sets stored: "
        f"{quality['kept_set_bytes'] / 2**20:.2f} MiB"
    )


if __name__ == "__main__":
    main()
