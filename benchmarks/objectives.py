"""Forward + backward time of every objective next to GRPO on the same tensors (CPU, float32).

Usage: ``.venv/bin/python benchmarks/objectives.py --n 512 --t 1024 --repeats 5``
(a benchmark, not a test: the P3O target is ≤ 1.15× GRPO).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from p3o.objectives import OBJECTIVES, ObjectiveInputs, get_objective


def make_inputs(n: int, t: int, seed: int = 0) -> tuple[torch.Tensor, ObjectiveInputs]:
    """Random off-policy-ish tensors: ~10% padding at the end of rows, ratios spread by σ = 0.3."""
    g = torch.Generator().manual_seed(seed)
    base = -torch.rand(n, t, generator=g) * 3
    rollout = base + torch.randn(n, t, generator=g) * 0.3
    lengths = torch.randint(int(0.8 * t), t + 1, (n,), generator=g)
    mask = torch.arange(t)[None, :] < lengths[:, None]
    adv = torch.randn(n, generator=g)
    prox = base + torch.randn(n, t, generator=g) * 0.1
    inputs = ObjectiveInputs(base, rollout, mask, adv, prox_logp=prox, num_tokens=int(mask.sum()))
    return base, inputs


def time_objective(name: str, base: torch.Tensor, inputs: ObjectiveInputs, repeats: int) -> float:
    """Median seconds of forward + backward (one warm-up run first)."""
    fn = get_objective(name)
    times = []
    for i in range(repeats + 1):
        logp = base.clone().requires_grad_()
        inputs.logp = logp
        t0 = time.perf_counter()
        loss, _ = fn(inputs, **dict.fromkeys(fn.required, 0.1))  # a value for keywords with no default (dro's beta)
        loss.backward()
        if i:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=512)
    p.add_argument("--t", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: leave the default)")
    p.add_argument("--objectives", nargs="*", default=list(OBJECTIVES))
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    base, inputs = make_inputs(args.n, args.t)
    names = ["grpo"] + [n for n in args.objectives if n != "grpo"]
    results = {}
    # interleave the objectives round by round so shared-CPU noise hits all of them alike
    per = {n: [] for n in names}
    for _ in range(args.repeats):
        for n in names:
            per[n].append(time_objective(n, base, inputs, 1))
    results = {n: statistics.median(v) for n, v in per.items()}
    ref = results["grpo"]
    print(f"N={args.n} T={args.t} float32 CPU threads={torch.get_num_threads()} repeats={args.repeats}")
    print(f"{'objective':<16}{'fwd+bwd ms':>12}{'x grpo':>9}")
    for n in names:
        print(f"{n:<16}{results[n] * 1e3:>12.1f}{results[n] / ref:>9.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
