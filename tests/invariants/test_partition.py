"""Partition invariance: the optimizer step's gradient does not depend on how the step's tokens are cut.

One fixed global batch of 8 rows (lengths skewed), one update of 1 mini-batch, for P3O with its ESS over the step
(`objective.scope step`), GRPO and MinPRO. The update (one SGD step with lr 1, the global gradient norm clipped to
`CLIP`, which every case reaches: a wrong norm changes the step) must be the same, within float32 noise, for

    1 rank × 1 micro-batch (the reference)   1 rank × 4 micro-batches   1 rank × token-budget micro-batches
    2 ranks × 2 micro-batches, torch DDP      2 ranks × 2 micro-batches, FSDP2 (fully_shard per decoder layer + root)
    2 ranks × token-budget micro-batches, FSDP2

Every compared layout runs at least 2 micro-batches per rank (gradient accumulation: DDP's no_sync, FSDP's
reduce-scatter per micro-batch). In bf16 mixed precision FSDP2 (its MixedPrecisionPolicy: bf16 parameters in the
forward) and DDP (autocast) compute differently, so they are compared with each other at bf16's tolerance
(`test_fsdp_and_ddp_agree_in_bf16`).

The ranks hold interleaved halves of the rows; each loss is normalised by the step's global token count and the
ranks' gradients are summed (DDP's communication hook, FSDP's divide factor 1), so every layout computes
∇ Σ_tokens ℓ / N_tokens of the whole batch. Tolerance: 1e-5 relative to the largest gradient entry (float32 sums
of a few hundred terms in another order differ by ~1e-7 of it; a wrong normaliser or an averaging reduction is off by
a factor of 2 or more).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from train_fakes import make_tiny_lm, random_batch

from p3o.objectives import get_objective
from p3o.train.placement import Placement, PlacementSettings
from p3o.train.step import update

CASES = {"p3o": {"scope": "step"}, "grpo": {}, "minpro": {}}
CLIP = 0.05  # below every case's gradient norm: clipping is on in every layout
BF16_TOL = 0.03  # of the largest step entry (measured: 0.008 at most; ddp-bf16 vs fp32: 0.004)
ROWS = {1: [list(range(8))], 2: [[0, 2, 4, 6], [1, 3, 5, 7]]}


def _skewed_batch() -> object:
    batch = random_batch(make_tiny_lm(seed=0), n=8, seed=5, noise=0.3)
    batch.mask[1:, 6:] = False  # one long response, seven short ones: token budgets cut unevenly
    batch.mask[3, 3:] = False
    return batch


def _one_update(name: str, hyper: dict, batch: object, strategy: str, micro: int, budget: int, precision: str) -> dict:
    """The step of one update of objective `name` on `batch`: {param: init − new} (full tensors under FSDP), and
    "micro-batches": how many micro-batches this rank ran, "grad_norm" the norm before clipping. Its DDP / FSDP
    wrapper is released when this returns, while the process group is still up (a DDP reducer freed after
    ``destroy_process_group`` can hang in gloo's destructor)."""
    from p3o import dist

    model = make_tiny_lm(seed=0)
    init = {k: v.detach().clone() for k, v in model.state_dict().items()}
    placement = Placement(model, PlacementSettings(strategy if strategy != "single" else "auto", precision))
    micros = []
    accumulate = placement.accumulate
    placement.accumulate = lambda last: micros.append(last) or accumulate(last)  # type: ignore[method-assign]
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    rec = get_objective(name)
    stats = update(
        model,
        opt,
        None,
        batch,
        rec,
        hyper,
        needs=rec.inputs_needed(hyper),
        micro_batch_size=micro,
        max_tokens_per_micro_batch=budget,
        grad_clip=CLIP,
        group=dist.group(),
        placement=placement,
    )
    full = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach() for k, v in model.state_dict().items()}
    step = {k: init[k] - full[k] for k in init}
    return {"step": step, "micro-batches": len(micros), "grad_norm": stats["grad_norm"]}


def gradients(
    rank: int, world: int, strategy: str, micro: int, budget: int, precision: str, init_file: str, out: str
) -> None:
    """One rank: for each objective, the step of one update on its rows; rank 0 saves {name: result}, each rank its
    micro-batch counts."""
    import torch.distributed as tdist

    from p3o import dist

    torch.set_num_threads(1)
    if world > 1 or strategy == "fsdp":
        tdist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        batch = _skewed_batch().select(ROWS[world][rank])
        result = {
            name: _one_update(name, hyper, batch, strategy, micro, budget, precision) for name, hyper in CASES.items()
        }
        if rank == 0:
            torch.save(result, out)
        torch.save({name: r["micro-batches"] for name, r in result.items()}, f"{out}.micros{rank}")
    finally:
        dist.destroy()


def _run(tmp: Path, tag: str, world: int, strategy: str, micro: int, budget: int = 0, precision: str = "no") -> dict:
    """{objective: {"step", "micro-batches", "grad_norm"}} of rank 0, plus "micros": the fewest micro-batches any
    rank ran."""
    out = str(tmp / f"{tag}.pt")
    args = (world, strategy, micro, budget, precision, str(tmp / f"init-{tag}"), out)
    if world == 1 and strategy != "fsdp":
        gradients(0, *args)
    else:  # fork: the children inherit the imported torch / transformers
        mp.start_processes(gradients, args=args, nprocs=world, join=True, start_method="fork")
    result = torch.load(out)
    result["micros"] = min(n for r in range(world) for n in torch.load(f"{out}.micros{r}").values())
    return result


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    return _run(tmp_path_factory.mktemp("ref"), "ref", 1, "single", 8)


def _assert_same(got: dict, want: dict, rel: float, tag: str) -> None:
    for name in CASES:
        assert want[name]["grad_norm"] > CLIP and got[name]["grad_norm"] > CLIP, f"{tag} {name}: clipping is off"
        scale = max(g.abs().max().item() for g in want[name]["step"].values())
        assert scale > 0, f"{name}: the reference step is zero (the test would not bite)"
        for k, g in want[name]["step"].items():
            torch.testing.assert_close(got[name]["step"][k], g, rtol=0, atol=rel * scale, msg=f"{tag} {name}: {k}")


@pytest.mark.parametrize(
    "tag, world, strategy, micro, budget",
    [
        ("micro4", 1, "single", 2, 0),
        ("budget", 1, "single", 8, 40),
        ("ddp2", 2, "ddp", 2, 0),
        ("fsdp2", 2, "fsdp", 2, 0),
        ("fsdp2-budget", 2, "fsdp", 4, 24),
    ],
)
def test_gradient_is_partition_invariant(reference, tmp_path, tag, world, strategy, micro, budget):
    got = _run(tmp_path, tag, world, strategy, micro, budget)
    assert got["micros"] >= 2, f"{tag}: {got['micros']} micro-batch(es) on a rank: no accumulation tested"
    _assert_same(got, reference, 1e-5, tag)


def test_fsdp_and_ddp_agree_in_bf16(tmp_path):
    """bf16 compute at 2 ranks × 2 micro-batches, clipping on: FSDP2's mixed-precision policy and DDP's autocast
    give the same step within bf16 noise (a normaliser or reduction off by the world size is off by 2×)."""
    ddp = _run(tmp_path, "ddp2-bf16", 2, "ddp", 2, precision="bf16")
    fsdp = _run(tmp_path, "fsdp2-bf16", 2, "fsdp", 2, precision="bf16")
    assert ddp["micros"] >= 2 and fsdp["micros"] >= 2
    _assert_same(fsdp, ddp, BF16_TOL, "fsdp2-bf16 vs ddp2-bf16")


def test_token_budget_changes_the_micro_batches():
    """The budget really cuts: 40 tokens give more micro-batches than 1, longest row alone first."""
    from p3o.train.step import token_budget_micros

    batch = _skewed_batch()
    cuts = token_budget_micros(batch, [torch.arange(8)], 40)[0]
    assert len(cuts) > 1 and sorted(int(r) for c in cuts for r in c) == list(range(8))
    lengths = batch.prompt_mask.sum(-1) + batch.mask.sum(-1)
    assert int(cuts[0][0]) == int(lengths.argmax())
    for c in cuts:
        width = int(batch.prompt_mask[c].sum(-1).max() + batch.mask[c].sum(-1).max())
        assert len(c) * width <= 40


def test_token_budget_below_the_longest_sequence_is_one_line():
    from p3o.errors import ConfigError
    from p3o.train.step import token_budget_micros

    batch = _skewed_batch()
    with pytest.raises(ConfigError, match="max_tokens_per_micro_batch 5 is smaller than the longest sequence"):
        token_budget_micros(batch, [torch.arange(8)], 5)
