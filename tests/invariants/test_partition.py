"""Partition invariance: the optimizer step's gradient does not depend on how the step's tokens are cut.

One fixed global batch of 8 rows (lengths skewed), one update of 1 mini-batch, for P3O with its ESS over the step
(`objective.scope step`), GRPO and MinPRO. The gradient (read off one SGD step with lr 1 and no clipping) must be the
same, within float32 noise, for

    1 rank × 1 micro-batch (the reference)   1 rank × 4 micro-batches   1 rank × token-budget micro-batches
    2 ranks, torch DDP                        2 ranks, FSDP2 (fully_shard per decoder layer + root)

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
ROWS = {1: [list(range(8))], 2: [[0, 2, 4, 6], [1, 3, 5, 7]]}


def _skewed_batch() -> object:
    batch = random_batch(make_tiny_lm(seed=0), n=8, seed=5, noise=0.3)
    batch.mask[1:, 6:] = False  # one long response, seven short ones: token budgets cut unevenly
    batch.mask[3, 3:] = False
    return batch


def _one_update(name: str, hyper: dict, batch: object, strategy: str, micro: int, budget: int) -> dict:
    """The gradient of one update of objective `name` on `batch`: {param: grad} (full tensors under FSDP). Its DDP /
    FSDP wrapper is released when this returns, while the process group is still up (a DDP reducer freed after
    ``destroy_process_group`` can hang in gloo's destructor)."""
    from p3o import dist

    model = make_tiny_lm(seed=0)
    init = {k: v.detach().clone() for k, v in model.state_dict().items()}
    placement = Placement(model, PlacementSettings(strategy if strategy != "single" else "auto"))
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    rec = get_objective(name)
    update(
        model,
        opt,
        None,
        batch,
        rec,
        hyper,
        needs=rec.inputs_needed(hyper),
        micro_batch_size=micro,
        max_tokens_per_micro_batch=budget,
        grad_clip=0.0,
        group=dist.group(),
        placement=placement,
    )
    full = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach() for k, v in model.state_dict().items()}
    return {k: init[k] - full[k] for k in init}


def gradients(rank: int, world: int, strategy: str, micro: int, budget: int, init_file: str, out: str) -> None:
    """One rank: for each objective, the gradient of one update on its rows; rank 0 saves {name: {param: grad}}."""
    import torch.distributed as tdist

    from p3o import dist

    torch.set_num_threads(1)
    if world > 1 or strategy == "fsdp":
        tdist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        batch = _skewed_batch().select(ROWS[world][rank])
        result = {name: _one_update(name, hyper, batch, strategy, micro, budget) for name, hyper in CASES.items()}
        if rank == 0:
            torch.save(result, out)
    finally:
        dist.destroy()


def _run(tmp: Path, tag: str, world: int, strategy: str, micro: int, budget: int = 0) -> dict:
    out = str(tmp / f"{tag}.pt")
    args = (world, strategy, micro, budget, str(tmp / f"init-{tag}"), out)
    if world == 1 and strategy != "fsdp":
        gradients(0, *args)
    else:  # fork: the children inherit the imported torch / transformers
        mp.start_processes(gradients, args=args, nprocs=world, join=True, start_method="fork")
    return torch.load(out)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    return _run(tmp_path_factory.mktemp("ref"), "ref", 1, "single", 8)


@pytest.mark.parametrize(
    "tag, world, strategy, micro, budget",
    [
        ("micro4", 1, "single", 2, 0),
        ("budget", 1, "single", 8, 40),
        ("ddp2", 2, "ddp", 4, 0),
        ("fsdp2", 2, "fsdp", 4, 0),
        ("fsdp2-budget", 2, "fsdp", 4, 40),
    ],
)
def test_gradient_is_partition_invariant(reference, tmp_path, tag, world, strategy, micro, budget):
    got = _run(tmp_path, tag, world, strategy, micro, budget)
    for name in CASES:
        scale = max(g.abs().max().item() for g in reference[name].values())
        assert scale > 0, f"{name}: the reference gradient is zero (the test would not bite)"
        for k, g in reference[name].items():
            torch.testing.assert_close(got[name][k], g, rtol=0, atol=1e-5 * scale, msg=f"{tag} {name}: {k}")


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
