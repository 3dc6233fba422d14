"""The trainer at scale, side by side in one run: per-rank memory of DDP vs FSDP2 in fp32 and bf16 mixed precision,
update throughput of DDP vs FSDP2 vs the old hand-written all-reduce, and token-budget micro-batches on a skewed batch.

    .venv/bin/p3o convert-smollm2                       # once: SmolLM2-135M-Instruct, fp32 (load_policy builds it)
    nice .venv/bin/python benchmarks/trainer_scale.py   # SmolLM2-135M, 2 gloo ranks forked on the CPU
    .venv/bin/python benchmarks/trainer_scale.py --model tiny-random --parts memory   # quick

Every layout runs in fresh processes (forked; 2 ranks over gloo, one torch thread each) that load the model from
the cache, place it (`p3o.train.placement.Placement`), build AdamW and run `p3o.train.step.update` on this rank's
rows of one global batch of `--rows` sequences (`--prompt` + `--response` tokens, all valid, `--micro-batches`
micro-batches per rank: gradient accumulation, objective P3O with a KL to a frozen reference model, `--ref-kl`, so
the reference is placed too): `--warmup` updates, then `--repeats` timed ones.

1. **Memory per rank** (layouts: one process, FSDP2 at world size 1, the old all-reduce, DDP and FSDP2 at 2 ranks;
   `train.mixed_precision` no and bf16). Bytes are counted from the tensors each rank holds: parameters
   (`DTensor.to_local()` under FSDP), their gradients just before the optimizer step (a step pre-hook), the most
   gradient bytes the rank held after any micro-batch's backward (`Placement.held_gradient_bytes`: FSDP's unsharded
   gradients kept between micro-batches included; "accum"), the reference model's parameters (`ref`) and the AdamW
   states after the step (a post-hook). DDP's gradient buckets, FSDP's transient all-gathered layers and the bf16
   copies of autocast are not tensors the rank keeps and are not counted; the peak RSS sees them:

       load RSS  = ru_maxrss (resource.getrusage(RUSAGE_SELF)) once the model is loaded and placed and AdamW built:
                   every rank loads the whole model before it is sharded, as `p3o train` does
       train RSS = VmHWM after the updates, the high-water mark having been reset (/proc/self/clear_refs 5) after
                   the load (nan where the reset is refused)
       peak RSS  = the rank's whole-life peak: the larger of the two

   The checks: FSDP2's per-rank parameters + AdamW states at 2 ranks ≤ 0.55 × DDP's (issue 38), and its gradient
   bytes held during accumulation ≤ 0.55 × DDP's (issue 45).
2. **Throughput** at 2 ranks, fp32: the old hand-written all-reduce (`naive`: no wrapper, then after the whole
   backward every gradient copied into one flat buffer, `dist.all_reduce` SUM, copied back, as `p3o.dist.
   all_reduce_grads_` did before commit c6a8b7a), torch DDP (bucketed, overlapped with the backward) and FSDP2.
   tokens/s = the global batch's valid tokens (prompt + response) / the median wall time of one update (both
   ranks between barriers).
3. **Token budget** (one process): a length-skewed batch of `--skew-rows` rows, one long response (`--long`
   tokens) in every micro-batch of `--micro` rows and the rest `--short` tokens long, trained with micro-batches of
   `--micro` rows and with `update.max_tokens_per_micro_batch` = `--micro` × the longest sequence (the same
   worst micro-batch). P3O with `objective.scope step` (its ESS over the step, so both sides train one objective);
   padded tokens = Σ over micro-batches of rows × (prompt width + response width) after trimming, as the forward
   computes them. The first update of each side starts from the same weights: their losses and gradient norms
   must agree. The sides alternate, `--repeats` timed updates each.

The CPU may be shared with other jobs: compare the ratios, not the absolute times.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import platform
import resource
import statistics
import tempfile
import time
import types
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch
import torch.multiprocessing as mp

MIB = 2**20
# (label, strategy, world size, train.mixed_precision); "single": one process, no wrapper; "naive": the old all-reduce
LAYOUTS = [
    ("1 process", "single", 1, "no"),
    ("1 process", "single", 1, "bf16"),
    ("fsdp", "fsdp", 1, "no"),
    ("fsdp", "fsdp", 1, "bf16"),
    ("old all-reduce", "naive", 2, "no"),
    ("ddp", "ddp", 2, "no"),
    ("ddp", "ddp", 2, "bf16"),
    ("fsdp", "fsdp", 2, "no"),
    ("fsdp", "fsdp", 2, "bf16"),
]


def _release_freed_memory() -> None:
    """glibc: serve every allocation ≥ 1 MiB by mmap, so freed tensors leave the RSS (fork children inherit it)."""
    with contextlib.suppress(OSError):  # not glibc: the RSS figures may then keep freed memory
        ctypes.CDLL("libc.so.6").mallopt(-3, MIB)  # M_MMAP_THRESHOLD


def _vm(field: str) -> float:
    """A /proc/self/status field (VmRSS, VmHWM) in MiB; nan where there is none."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return float("nan")


def _reset_peak() -> bool:
    """Reset this process's RSS high-water mark (Linux ≥ 4.0); False where it cannot."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _local_bytes(t: torch.Tensor | None) -> int:
    """Bytes this rank holds of `t`: its local shard for a DTensor."""
    if t is None:
        return 0
    if hasattr(t, "to_local"):
        t = t.to_local()
    return t.numel() * t.element_size()


def naive_all_reduce_grads_(params: list[torch.nn.Parameter]) -> None:
    """The hand-written gradient sum p3o used before torch DDP (`git show 5c72636:src/p3o/dist.py`): after the
    whole backward, every gradient (zeros for a parameter without one) is copied into one flat buffer, summed over
    ranks with one `dist.all_reduce`, and copied back — a second copy of all gradients, no overlap, no buckets."""
    import torch.distributed as tdist

    if not tdist.is_initialized() or tdist.get_world_size() == 1:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    tdist.all_reduce(flat, op=tdist.ReduceOp.SUM)
    offset = 0
    for p, g in zip(params, grads):
        n = g.numel()
        p.grad = flat[offset : offset + n].view_as(p).clone()
        offset += n


def _placement(policy: torch.nn.Module, strategy: str, precision: str) -> Any:
    """The placement of a layout: p3o's own (`single`, `ddp`, `fsdp`) or the old all-reduce (`naive`)."""
    from p3o.train.placement import Placement, PlacementSettings

    if strategy in ("single", "naive"):

        class _Unwrapped(PlacementSettings):
            def resolved(self) -> str:  # no DDP at world size 2: the gradients are summed by hand
                return "single"

        class _NaivePlacement(Placement):
            def step(self, optimizer: torch.optim.Optimizer, scheduler: Any, grad_clip: float) -> torch.Tensor:
                naive_all_reduce_grads_(self.trainable())
                return super().step(optimizer, scheduler, grad_clip)

        cls = _NaivePlacement if strategy == "naive" else Placement
        return cls(policy, _Unwrapped("auto", precision))
    return Placement(policy, PlacementSettings(strategy, precision))


def make_batch(n: int, prompt: int, lengths: list[int], vocab: int, seed: int = 0) -> Any:
    """A Rollouts of `n` rows: `prompt` valid prompt tokens each, row i's response `lengths[i]` valid tokens
    (right-padded to the longest), random token ids, rollout log-probs and advantages."""
    from p3o.types import Rollouts

    g = torch.Generator().manual_seed(seed)
    t = max(lengths)
    mask = torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]
    response = torch.randint(5, vocab, (n, t), generator=g) * mask
    return Rollouts(
        prompt_ids=torch.randint(5, vocab, (n, prompt), generator=g),
        prompt_mask=torch.ones(n, prompt, dtype=torch.bool),
        response_ids=response,
        mask=mask,
        rollout_logp=(-3.0 * torch.rand(n, t, generator=g) - 8.0) * mask,
        policy_version=torch.where(mask, 0, -1),
        group_ids=torch.arange(n) // 2,
        rewards=torch.zeros(n),
        truncated=torch.zeros(n, dtype=torch.bool),
        advantages=torch.randn(n, generator=g),
    )


def near_policy(placement: Any, batch: Any, noise: float = 0.05, seed: int = 3) -> None:
    """Set `batch.rollout_logp` to the placed policy's own log-probs plus N(0, noise²) per token (a no-grad forward;
    a collective under ddp / fsdp: every rank calls it): the ratios of a nearly on-policy batch, as a sync loop's."""
    g = torch.Generator().manual_seed(seed)
    rows = types.SimpleNamespace(
        prompt_ids=batch.prompt_ids, prompt_mask=batch.prompt_mask, response_ids=batch.response_ids,
        mask=batch.mask, reads=batch.mask, attn=None,
    )  # fmt: skip  # a micro-batch of every row (its attention mask: the loss mask)
    logp, _ = placement.logprobs(rows, grad=False)
    batch.rollout_logp = (logp + noise * torch.randn(logp.shape, generator=g)) * batch.mask


def _load(model: str) -> torch.nn.Module:
    """The policy in float32 with every parameter trainable; progress bars and library warnings off (a rank's)."""
    import warnings

    from transformers.utils import logging as hf_logging

    from p3o.models import load_policy

    warnings.simplefilter("ignore")  # FSDP's and transformers' per-call notices would bury the tables
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    policy, _ = load_policy(model)
    return policy.float().requires_grad_(True)


def layout_rank(rank: int, world: int, strategy: str, precision: str, args: argparse.Namespace, out: str) -> None:
    """One rank of one layout: load, place, AdamW, `warmup` + `repeats` updates; writes its figures to `out`.rank."""
    import torch.distributed as tdist

    from p3o import dist
    from p3o.objectives import get_objective
    from p3o.train.step import make_optimizer, update

    torch.set_num_threads(1)
    if world > 1 or strategy == "fsdp":
        tdist.init_process_group("gloo", init_method=f"file://{out}.init", rank=rank, world_size=world)
    try:
        policy = _load(args.model)
        placement = _placement(policy, strategy, precision)
        optimizer = make_optimizer(policy, args.lr)
        counts: dict[str, int] = {}

        def before_step(opt: torch.optim.Optimizer, *_: Any) -> None:
            counts["grads"] = sum(_local_bytes(p.grad) for g in opt.param_groups for p in g["params"])

        def after_step(opt: torch.optim.Optimizer, *_: Any) -> None:
            counts["optimizer"] = sum(
                _local_bytes(v) for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)
            )

        optimizer.register_step_pre_hook(before_step)
        optimizer.register_step_post_hook(after_step)
        backward = placement.backward

        def counted_backward(loss: torch.Tensor) -> None:  # the gradients held after each micro-batch
            backward(loss)
            counts["accum"] = max(counts.get("accum", 0), placement.held_gradient_bytes())

        placement.backward = counted_backward
        ref = _load(args.model).requires_grad_(False) if args.ref_kl else None
        vocab = policy.get_output_embeddings().weight.shape[0]
        batch = make_batch(args.rows, args.prompt, [args.response] * args.rows, min(vocab, 8000), seed=1)
        mine = batch.select(list(range(rank, args.rows, world)))
        near_policy(placement, mine, seed=3 + rank)
        tokens = int(batch.prompt_mask.sum() + batch.mask.sum())
        load_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # the reset below clears it
        reset = _reset_peak()
        times, losses = [], []
        for i in range(args.warmup + args.repeats):
            dist.barrier()
            t0 = time.perf_counter()
            stats = update(
                policy,
                optimizer,
                None,
                mine,
                get_objective("p3o"),
                {"ref_kl_coef": args.ref_kl} if args.ref_kl else {},
                micro_batch_size=max(1, len(mine) // args.micro_batches),
                grad_clip=1.0,
                ref_model=ref,
                group=dist.group(),
                placement=placement,
            )
            dist.barrier()
            if i >= args.warmup:
                times.append(time.perf_counter() - t0)
            losses.append(stats["loss"])
        placed_ref = placement.place_reference(ref)  # what update placed (the same module: placing is idempotent)
        result = {
            "params": sum(_local_bytes(p) for p in policy.parameters()),
            "ref": sum(_local_bytes(p) for p in placed_ref.parameters()) if placed_ref is not None else 0,
            "accum": counts.get("accum", 0),
            "grads": counts.get("grads", 0),
            "optimizer": counts.get("optimizer", 0),
            "rss_load_peak": load_peak,
            "rss_peak": max(load_peak, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0),
            "rss_train_peak": _vm("VmHWM") if reset else float("nan"),
            "times": times,
            "tokens": tokens,
            "loss": losses[0],
            "described": placement.describe(),
        }
        Path(f"{out}.{rank}").write_text(json.dumps(result))
    finally:
        if tdist.is_initialized():
            tdist.destroy_process_group()


def skew_rank(rank: int, args: argparse.Namespace, out: str) -> None:
    """The token-budget comparison in one process: plans, padded tokens, alternating timed updates."""
    from p3o.objectives import get_objective
    from p3o.train.placement import Placement
    from p3o.train.step import UpdateSettings, UpdateStep, make_optimizer, resolve_objective

    torch.set_num_threads(1)
    policy = _load(args.model)
    placement = Placement(policy)
    vocab = policy.get_output_embeddings().weight.shape[0]
    lengths = [args.long if i % args.micro == 0 else args.short for i in range(args.skew_rows)]
    batch = make_batch(args.skew_rows, args.prompt, lengths, min(vocab, 8000), seed=2)
    near_policy(placement, batch)
    budget = args.micro * (args.prompt + args.long)
    call = resolve_objective(get_objective("p3o"), {"scope": "step"}, None)
    init = {k: v.detach().clone() for k, v in policy.state_dict().items()}
    sides: dict[str, Any] = {}
    for name, tokens in (("fixed", 0), ("budget", budget)):
        settings = UpdateSettings(micro_batch_size=args.micro, grad_clip=1.0, max_tokens_per_micro_batch=tokens)
        optimizer = make_optimizer(policy, args.lr)
        step = UpdateStep(policy, optimizer, None, call, settings, placement=placement)
        plan = step.plan(batch)
        micros = plan.all_micros
        sides[name] = {
            "step": step,
            "micro_batches": len(micros),
            "padded": sum(mb.prompt_ids.numel() + mb.response_ids.numel() for mb in micros),
            "valid": int(sum(mb.prompt_mask.sum() + mb.mask.sum() for mb in micros)),
            "rows": [len(mb.rows) for mb in micros],
            "times": [],
            "first": None,
        }
    for i in range(args.warmup + args.repeats):
        for side in sides.values():
            with torch.no_grad():
                for k, v in policy.state_dict().items():
                    v.copy_(init[k])
            t0 = time.perf_counter()
            stats = side["step"].run(batch, 0)
            dt = time.perf_counter() - t0
            if i == 0:
                side["first"] = {"loss": stats["loss"], "grad_norm": stats["grad_norm"]}
            if i >= args.warmup:
                side["times"].append(dt)
    result = {name: {k: v for k, v in side.items() if k != "step"} for name, side in sides.items()}
    result["tokens"] = budget
    Path(f"{out}.{rank}").write_text(json.dumps(result))


def _run_layout(label: str, strategy: str, world: int, precision: str, args: argparse.Namespace, tmp: str) -> Any:
    out = os.path.join(tmp, f"{strategy}-{world}-{precision}")
    fn_args = (world, strategy, precision, args, out)
    mp.start_processes(layout_rank, args=fn_args, nprocs=world, join=True, start_method="fork")
    ranks = [json.loads(Path(f"{out}.{r}").read_text()) for r in range(world)]
    return {"label": label, "strategy": strategy, "world": world, "precision": precision, "ranks": ranks}


def _mib(x: float) -> str:
    return f"{x / MIB:.1f}"


def report_memory(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Print the per-rank memory table (largest rank of each layout); returns the FSDP/DDP state ratios at 2 ranks."""
    base = next(r for r in rows if r["strategy"] == "single" and r["precision"] == "no")
    base_states = max(x["params"] + x["grads"] + x["optimizer"] for x in base["ranks"])
    print("\n## Memory per rank (MiB; the largest rank; states counted from the tensors each rank holds)")
    head = (
        f"{'layout':<16}{'ranks':>6}{'precision':>10}{'params':>9}{'grads':>9}{'accum':>9}{'ref':>9}{'AdamW':>9}"
        f"{'p+g+AdamW':>11}{'vs 1 proc':>10}{'load RSS':>10}{'train RSS':>10}{'peak RSS':>10}"
    )
    print(head)
    for r in rows:
        big = max(r["ranks"], key=lambda x: x["params"] + x["grads"] + x["optimizer"])
        states = big["params"] + big["grads"] + big["optimizer"]
        rss = max(x["rss_peak"] for x in r["ranks"])
        load_rss = max(x["rss_load_peak"] for x in r["ranks"])
        train_rss = max(x["rss_train_peak"] for x in r["ranks"])
        print(
            f"{r['label']:<16}{r['world']:>6}{r['precision']:>10}{_mib(big['params']):>9}{_mib(big['grads']):>9}"
            f"{_mib(max(x['accum'] for x in r['ranks'])):>9}{_mib(max(x['ref'] for x in r['ranks'])):>9}"
            f"{_mib(big['optimizer']):>9}{_mib(states):>11}{states / base_states:>9.2f}x"
            f"{load_rss:>10.0f}{train_rss:>10.0f}{rss:>10.0f}"
        )
    ratios = {}
    for precision in ("no", "bf16"):
        pick = {
            r["strategy"]: max(x["params"] + x["optimizer"] for x in r["ranks"])
            for r in rows
            if r["world"] == 2 and r["precision"] == precision and r["strategy"] in ("ddp", "fsdp")
        }
        if len(pick) == 2:
            ratios[precision] = pick["fsdp"] / pick["ddp"]
            verdict = "PASS" if ratios[precision] <= 0.55 else "FAIL"
            print(
                f"fsdp / ddp at 2 ranks, parameters + AdamW states per rank ({precision}): "
                f"{_mib(pick['fsdp'])} / {_mib(pick['ddp'])} MiB = {ratios[precision]:.3f}x  "
                f"(issue 38: <= 0.55x) {verdict}"
            )
        accum = {
            r["strategy"]: max(x["accum"] for x in r["ranks"])
            for r in rows
            if r["world"] == 2 and r["precision"] == precision and r["strategy"] in ("ddp", "fsdp")
        }
        if len(accum) == 2 and accum["ddp"]:
            ratio = accum["fsdp"] / accum["ddp"]
            ratios[f"accum-{precision}"] = ratio
            verdict = "PASS" if ratio <= 0.55 else "FAIL"
            print(
                f"fsdp / ddp at 2 ranks, gradient bytes held during accumulation ({precision}): {_mib(accum['fsdp'])} "
                f"/ {_mib(accum['ddp'])} MiB = {ratio:.3f}x  (issue 45: <= 0.55x) {verdict}"
            )
    return ratios


def report_throughput(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Print update time and tokens/s of every layout, and the 2-rank fp32 ratios against the old all-reduce."""
    print("\n## Update step (median of the timed updates; tokens = the global batch's prompt + response tokens)")
    print(f"{'layout':<16}{'ranks':>6}{'precision':>10}{'s/update':>10}{'tokens/s':>10}{'updates':>9}")
    rate: dict[str, float] = {}
    for r in rows:
        times = r["ranks"][0]["times"]
        med = statistics.median(times)
        tps = r["ranks"][0]["tokens"] / med
        print(f"{r['label']:<16}{r['world']:>6}{r['precision']:>10}{med:>10.2f}{tps:>10.1f}{len(times):>9}")
        if r["world"] == 2 and r["precision"] == "no":
            rate[r["strategy"]] = tps
    if "naive" in rate:
        for s in ("ddp", "fsdp"):
            if s in rate:
                print(f"{s} / old all-reduce at 2 ranks, fp32 (tokens/s): {rate[s] / rate['naive']:.2f}x")
    return rate


def report_skew(res: dict[str, Any]) -> None:
    """Print the token-budget table."""
    fixed, budget = res["fixed"], res["budget"]
    print(f"\n## Length-skewed batch, one process: micro-batches of rows vs a budget of {res['tokens']} tokens")
    head = f"{'micro-batches':<24}{'count':>6}{'rows each':>14}{'padded':>8}{'valid':>7}"
    print(f"{head}{'s/update':>10}{'tokens/s':>10}")
    for name, side in (("fixed rows", fixed), (f"budget {res['tokens']}", budget)):
        med = statistics.median(side["times"])
        rows = ",".join(str(n) for n in side["rows"])
        print(
            f"{name:<24}{side['micro_batches']:>6}{rows:>14}{side['padded']:>8}{side['valid']:>7}{med:>10.2f}"
            f"{side['valid'] / med:>10.1f}"
        )
    t_fixed, t_budget = statistics.median(fixed["times"]), statistics.median(budget["times"])
    print(
        f"budget / fixed: padded tokens {budget['padded'] / fixed['padded']:.2f}x, time per update "
        f"{t_budget / t_fixed:.2f}x (speed-up {t_fixed / t_budget:.2f}x)"
    )
    a, b = fixed["first"], budget["first"]
    print(
        f"first update from the same weights: loss {a['loss']:.6g} vs {b['loss']:.6g}, grad norm "
        f"{a['grad_norm']:.6g} vs {b['grad_norm']:.6g} (relative differences "
        f"{abs(a['loss'] - b['loss']) / max(abs(a['loss']), 1e-12):.1e}, "
        f"{abs(a['grad_norm'] - b['grad_norm']) / max(abs(a['grad_norm']), 1e-12):.1e})"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2", help="p3o.models.load_policy name (SmolLM2-135M-Instruct)")
    ap.add_argument("--parts", default="memory,skew", help="comma-separated: memory (memory and throughput), skew")
    ap.add_argument("--rows", type=int, default=8, help="sequences in the global batch of the layouts")
    ap.add_argument("--micro-batches", type=int, default=4, help="micro-batches per rank (gradient accumulation)")
    ap.add_argument("--ref-kl", type=float, default=0.1, help="P3O's ref_kl_coef (0: no reference model)")
    ap.add_argument("--prompt", type=int, default=8, help="prompt tokens per sequence")
    ap.add_argument("--response", type=int, default=24, help="response tokens per sequence of the layouts")
    ap.add_argument("--long", type=int, default=48, help="response tokens of the long rows of the skewed batch")
    ap.add_argument("--short", type=int, default=4, help="response tokens of the short rows of the skewed batch")
    ap.add_argument("--skew-rows", type=int, default=8, help="rows of the skewed batch")
    ap.add_argument("--micro", type=int, default=4, help="rows per micro-batch of the skewed batch")
    ap.add_argument("--warmup", type=int, default=1, help="untimed updates first")
    ap.add_argument("--repeats", type=int, default=2, help="timed updates")
    ap.add_argument("--lr", type=float, default=1e-6)
    args = ap.parse_args()
    parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    if not parts <= {"memory", "skew"}:
        ap.error(f"--parts: unknown part(s) {sorted(parts - {'memory', 'skew'})}; known: memory, skew")
    _release_freed_memory()
    t_all = time.perf_counter()

    import transformers

    import p3o.objectives
    import p3o.train.step  # noqa: F401  (imported once in the parent: the forked ranks share them)

    print(
        f"model {args.model}; {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch "
        f"{torch.__version__}, transformers {transformers.__version__}; gloo ranks forked, 1 torch thread each; "
        f"layouts: {args.rows} rows x ({args.prompt} + {args.response}) tokens, {args.micro_batches} micro-batches "
        f"per rank, ref_kl_coef {args.ref_kl}, {args.warmup} warm-up + {args.repeats} timed updates"
    )
    with tempfile.TemporaryDirectory(prefix="p3o-scale-") as tmp:
        if "memory" in parts:
            rows = []
            for label, strategy, world, precision in LAYOUTS:
                t0 = time.perf_counter()
                rows.append(_run_layout(label, strategy, world, precision, args, tmp))
                print(f"  {label} x{world} {precision}: {time.perf_counter() - t0:.0f} s", flush=True)
            report_memory(rows)
            report_throughput(rows)
        if "skew" in parts:
            out = os.path.join(tmp, "skew")
            mp.start_processes(skew_rank, args=(args, out), nprocs=1, join=True, start_method="fork")
            report_skew(json.loads(Path(f"{out}.0").read_text()))
    print(f"\n(whole benchmark: {time.perf_counter() - t_all:.0f} s)")


if __name__ == "__main__":
    main()
