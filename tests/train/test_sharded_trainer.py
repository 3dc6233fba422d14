"""The sharded trainer as a GPU engineer reviews it (issue 45), on 2 gloo ranks of the tiny model:

* FSDP reduce-scatters every micro-batch: during accumulation a rank holds its shard of the gradients, not the whole
  model's (no `set_requires_gradient_sync(False)` keeping unsharded float32 gradients until the last micro-batch);
* the frozen reference under FSDP is its own FSDP module with the policy's mixed precision: 1/N of it per rank, and
  at identical weights its log-probs equal the policy's exactly (the KL is 0 when it must be);
* the chunked head's logits are float32 under a bf16 autocast (one process and DDP), as its backward recomputes them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from train_fakes import make_tiny_lm, random_batch


def _spawn(fn, tmp: Path, *args) -> list[dict]:
    """Run `fn(rank, world, init_file, out, *args)` on 2 forked gloo ranks; each rank's JSON result."""
    tmp.mkdir(parents=True, exist_ok=True)
    outs = [tmp / f"rank{r}.json" for r in range(2)]
    mp.start_processes(_rank, args=(fn, str(tmp / "init"), str(tmp), args), nprocs=2, join=True, start_method="fork")
    return [json.loads(o.read_text()) for o in outs]


def _rank(rank: int, fn, init_file: str, tmp: str, args: tuple) -> None:
    import torch.distributed as tdist

    from p3o import dist

    torch.set_num_threads(1)
    tdist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        result = fn(rank, Path(tmp), *args)
        Path(tmp, f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy()


def _step(model, strategy: str, precision: str, micro_batch_size: int, ref=None):
    """An UpdateStep of P3O (with a KL to `ref` when given) over `model` placed by `strategy` / `precision`."""
    from p3o.objectives import get_objective
    from p3o.train.placement import Placement, PlacementSettings
    from p3o.train.step import UpdateSettings, UpdateStep, resolve_objective

    placement = Placement(model, PlacementSettings(strategy, precision))
    call = resolve_objective(get_objective("p3o"), {"ref_kl_coef": 0.1} if ref is not None else {}, None)
    settings = UpdateSettings(micro_batch_size=micro_batch_size)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    return UpdateStep(model, optimizer, None, call, settings, ref_model=ref, placement=placement)


def _accumulation_bytes(rank: int, tmp: Path, strategy: str) -> dict:
    """Gradient bytes this rank holds after the first of two micro-batches, and after the step's last one."""
    model = make_tiny_lm(seed=0)
    whole = sum(p.numel() * p.element_size() for p in model.parameters())
    step = _step(model, strategy, "no", micro_batch_size=1)
    placement = step.placement
    batch = random_batch(make_tiny_lm(seed=0), n=4, seed=1).select([rank, rank + 2])
    batch.advantages = torch.randn(2)
    held = []
    for j, mb in enumerate(step.plan(batch).all_micros):
        with placement.accumulate(last=j == 1):
            logp, _ = placement.logprobs(mb, grad=True)
            placement.backward(logp.sum())
        held.append(placement.held_gradient_bytes())
    return {"whole": whole, "held": held}


def test_fsdp_holds_only_its_gradient_shard_during_accumulation(tmp_path):
    fsdp = _spawn(_accumulation_bytes, tmp_path / "fsdp", "fsdp")
    ddp = _spawn(_accumulation_bytes, tmp_path / "ddp", "ddp")
    for r in range(2):
        whole = fsdp[r]["whole"]
        assert ddp[r]["held"] == [whole, whole]  # DDP: whole gradients on every rank, as expected
        # FSDP: about half the model's gradients on each rank at every micro-batch (before the fix: the whole
        # model's after the first, no-sync, micro-batch)
        assert all(h <= 0.55 * whole for h in fsdp[r]["held"]), (fsdp[r], whole)


def _reference_vs_policy(rank: int, tmp: Path, precision: str) -> dict:
    """Policy and reference log-probs at identical weights under FSDP (bf16 compute), and the reference's bytes."""
    model = make_tiny_lm(seed=0)
    ref = make_tiny_lm(seed=0).requires_grad_(False)
    whole = sum(p.numel() * p.element_size() for p in ref.parameters())
    step = _step(model, "fsdp", precision, micro_batch_size=2, ref=ref)
    batch = random_batch(make_tiny_lm(seed=0), n=8, seed=2).select(list(range(rank, 8, 2)))
    batch.advantages = torch.randn(len(batch))
    plan = step.plan(batch)
    policy = step.snapshot(None, plan)
    reference = step.snapshot(step.ref_model, plan)
    local = sum(
        (p.to_local() if hasattr(p, "to_local") else p).numel() * p.element_size() for p in step.ref_model.parameters()
    )
    return {"max_diff": (policy - reference).abs().max().item(), "ref_bytes": local, "whole": whole}


@pytest.mark.parametrize("precision", ["bf16"])
def test_fsdp_reference_equals_the_policy_at_identical_weights_and_is_sharded(tmp_path, precision):
    for r in _spawn(_reference_vs_policy, tmp_path, precision):
        assert r["max_diff"] == 0.0, r  # before: 1.96e-3 (the reference ran fp32 unsharded, the policy bf16)
        assert r["ref_bytes"] <= 0.55 * r["whole"], r  # before: the whole fp32 copy on every rank


def test_chunked_head_logits_are_float32_under_autocast():
    """Inside a bf16 autocast (one process, DDP) the head's forward runs float32, as its backward recomputes it:
    the log-probs equal those computed outside autocast exactly."""
    from p3o.logprobs import _chunk_logits, chunked_head_logprobs

    g = torch.Generator().manual_seed(0)
    h, w = torch.randn(16, 1024, generator=g), torch.randn(300, 1024, generator=g) / 32
    y = torch.randint(0, 300, (16,), generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        z = _chunk_logits(h, w, None, 1.0)
        lp_cast, _ = chunked_head_logprobs(h, w, y)
    lp, _ = chunked_head_logprobs(h, w, y)
    assert z.dtype == torch.float32  # before: bfloat16
    torch.testing.assert_close(lp_cast, lp, rtol=0, atol=0)


def _grouped_batch(groups: int = 4, size: int = 4, seed: int = 0):
    """`groups` GRPO groups of `size` rows: identical prompts (lengths 6..9) within a group, responses of 2..12
    tokens mixed across groups."""
    from p3o.types import Rollouts

    g = torch.Generator().manual_seed(seed)
    n, p, t = groups * size, 10, 12
    plen = torch.tensor([6 + (i // size) % 4 for i in range(n)])
    prompt_mask = torch.arange(p)[None, :] >= (p - plen)[:, None]
    base = torch.randint(3, 60, (groups, p), generator=g)
    prompt_ids = base.repeat_interleave(size, 0).masked_fill(~prompt_mask, 0)
    tlen = torch.randint(2, t + 1, (n,), generator=g)
    mask = torch.arange(t)[None, :] < tlen[:, None]
    return Rollouts(
        prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=torch.randint(3, 60, (n, t), generator=g) * mask,
        mask=mask, rollout_logp=torch.zeros(n, t), policy_version=torch.where(mask, 0, -1),
        group_ids=torch.arange(n) // size, rewards=torch.zeros(n), truncated=torch.zeros(n, dtype=torch.bool),
        advantages=torch.randn(n, generator=g),
    )  # fmt: skip


def test_token_budget_keeps_prompt_groups_together():
    """The token budget packs GRPO groups whole, so each micro-batch computes few prompts (token_logprobs shares a
    run of identical prompts) and the backbone computes fewer tokens than with rows sorted one by one."""
    from p3o.logprobs import prompt_groups
    from p3o.train.step import token_budget_micros

    batch = _grouped_batch()
    budget = 80
    micros = token_budget_micros(batch, [torch.arange(len(batch))], budget)[0]
    assert sorted(int(r) for m in micros for r in m) == list(range(len(batch)))
    runs = tokens = 0
    for rows in micros:
        first, _ = prompt_groups(batch.prompt_ids[rows], batch.prompt_mask[rows])
        distinct = len({int(g) for g in batch.group_ids[rows]})
        assert first.numel() == distinct, rows  # a group's rows are consecutive in the micro-batch
        u_p = first.numel() * int(batch.prompt_mask[rows].sum(-1).max())
        cost = u_p + len(rows) * int(batch.mask[rows].sum(-1).max())
        assert cost <= budget
        runs, tokens = runs + first.numel(), tokens + cost
    assert runs <= 4 + len(micros) - 1, (runs, len(micros))  # each group cut at most where a micro-batch ends


def _gathers(rank: int, tmp: Path) -> dict:
    """How many all-gathers one engine push of the tied tiny model costs under FSDP, and whether its values are
    the model's."""
    import p3o.train.placement as placement_mod
    from p3o.train.placement import Placement, PlacementSettings

    model = make_tiny_lm(seed=0)
    want = {k: v.clone() for k, v in model.state_dict().items()}
    placement = Placement(model, PlacementSettings("fsdp"))
    calls = []
    full = placement_mod._full
    placement_mod._full = lambda t: calls.append(1) or full(t)
    pushed = {k: v.clone() for k, v in placement.weights().items()}
    same = pushed.keys() == want.keys() and all(torch.equal(pushed[k], want[k]) for k in want)
    params = len({id(p) for p in model.parameters()})
    return {"gathers": len(calls), "params": params, "keys": len(want), "same": same}


def test_tied_embeddings_are_gathered_once_per_push(tmp_path):
    for r in _spawn(_gathers, tmp_path):
        assert r["same"] and r["keys"] == r["params"] + 1  # lm_head.weight is embed_tokens.weight
        assert r["gathers"] == r["params"], r  # before: one all-gather per key, the embedding twice


def test_queued_batches_are_on_the_cpu_before_they_are_gathered():
    """A queued batch on a GPU is moved to the CPU when its state is taken (all_gather_object pickles it; rank 0
    would otherwise unpickle every rank's tensors onto that rank's GPU). Fake CUDA tensors: no GPU needed."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from p3o.train.sources import rollouts_to_state

    batch = random_batch(make_tiny_lm(seed=0), n=2, seed=0)
    with FakeTensorMode(allow_non_fake_inputs=True):
        cuda = {k: torch.zeros(v.shape, dtype=v.dtype, device="cuda") if isinstance(v, torch.Tensor) else v
                for k, v in vars(batch).items()}  # fmt: skip
        on_gpu = type(batch)(**cuda)
        state = rollouts_to_state(on_gpu)
    devices = {v.device.type for v in state.values() if isinstance(v, torch.Tensor)}
    assert devices == {"cpu"}, devices  # before: {"cuda"}


def test_cpu_offload_forms_a_group_with_gloo_for_the_cpu_shards(monkeypatch):
    """Offloaded shards are CPU DTensors whose collectives (startup gathers, clipping's all-reduce, the sharded
    scaler's inf check) need a CPU backend beside NCCL: the group is "cuda:nccl,cpu:gloo" (the GPU run itself:
    scripts/gpu_check.sh, unverified here)."""
    import torch.distributed as tdist

    from p3o import dist

    assert dist.default_backend(cpu_offload=True, cuda=True) == "cuda:nccl,cpu:gloo"
    assert dist.default_backend(cuda=True) == "nccl" and dist.default_backend(cpu_offload=True, cuda=False) == "gloo"
    formed = []
    monkeypatch.setattr(tdist, "is_initialized", lambda: False)
    monkeypatch.setattr(tdist, "init_process_group", lambda backend: formed.append(backend))
    monkeypatch.setattr(tdist, "get_world_size", lambda *a: 2)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: None)
    monkeypatch.setenv("WORLD_SIZE", "2")
    dist.init_from_env(force=True, cpu_offload=True)
    assert formed == ["cuda:nccl,cpu:gloo"]


def test_an_older_torch_imports_the_trainer_and_refuses_fsdp_in_one_line(monkeypatch):
    """pyproject's floor (torch 2.6) holds for one process and DDP: the trainer imports without FSDP2's public API,
    and `train.strategy fsdp` on a torch without the FSDP2 calls it makes is one ConfigError naming the version."""
    import subprocess
    import sys

    from torch.distributed.fsdp import FSDPModule

    from p3o.errors import ConfigError
    from p3o.train.placement import FSDP_TORCH, PlacementSettings, check_placement, fsdp_missing

    script = (
        "import torch.distributed._composable.fsdp, transformers.models.qwen3.modeling_qwen3\n"  # they need FSDP2
        "import torch.distributed.fsdp as f\n"
        "del f.fully_shard, f.FSDPModule\n"  # as torch < 2.6 had it: no public FSDP2
        "import p3o.train.loop, p3o.train.step\n"
        "from p3o.train.placement import fsdp_missing\n"
        "print(fsdp_missing())\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]  # before: ImportError from p3o.train.placement
    assert done.stdout.strip() == "torch.distributed.fsdp.fully_shard"
    assert fsdp_missing() is None  # this torch has everything
    monkeypatch.delattr(FSDPModule, "set_force_sum_reduction_for_comms")
    with pytest.raises(ConfigError, match=rf"has no FSDPModule.set_force_sum_reduction_for_comms; .*>= {FSDP_TORCH}"):
        check_placement(PlacementSettings("fsdp"), torch.device("cpu"))
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert '"torch>=2.6,<3"' in pyproject


def test_the_materialized_plain_model_is_built_on_the_cpu():
    """final/, the evaluation and a new engine get the gathered weights in a model built in host memory, not on the
    trainer's device beside its shard (an accelerator is faked by the meta device here)."""
    from p3o.train.placement import Placement, _meta_skeleton

    model = make_tiny_lm(seed=0)
    placement = Placement(model)
    placement.skeleton, placement.device = _meta_skeleton(model), torch.device("meta")
    plain = placement.materialize(model.state_dict())
    assert {p.device.type for p in plain.parameters()} == {"cpu"}  # before: meta (the trainer's device)
    assert all(torch.equal(plain.state_dict()[k], v) for k, v in model.state_dict().items())


def _read_on_rank0(rank: int, tmp: Path) -> dict:
    """build_trainer_side under fsdp at 2 ranks, then the placement: who read the weights, what each rank held
    before sharding, and whether the shards, the buffers and the log-probs are the one-process model's."""
    from p3o import models
    from p3o.config import load_config
    from p3o.logprobs import token_logprobs
    from p3o.train import wiring
    from p3o.train.placement import Placement, PlacementSettings

    real, calls = models.load_policy, []
    models.load_policy = lambda *a, **k: calls.append(a) or real(*a, **k)
    cfg = load_config(["--model.name", "tiny-random", "--train.strategy", "fsdp", "--model.device", "cpu"])
    try:
        policy, tokenizer, _ = wiring.build_trainer_side(cfg)
    finally:
        models.load_policy = real
    held = sum(p.numel() for p in policy.parameters() if not p.is_meta)  # materialised before sharding
    training = policy.training  # rank 0's mode on every rank (checkpointing and dropout follow it)
    placement = Placement(policy, PlacementSettings("fsdp"))
    local = sum(p.to_local().numel() for p in policy.parameters())
    full = placement.full_state_dict()  # rank 0: every tensor, gathered from the shards
    want, _ = real("tiny-random")  # the one-process model (tiny-random is seeded)
    sd, buffers = want.state_dict(), dict(want.named_buffers())
    batch = random_batch(want, seed=1)
    ours = placement.logprobs(batch, grad=False)[0]
    theirs = token_logprobs(want, batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.mask)[0].detach()
    return {
        "calls": len(calls),
        "held": held,
        "local": local,
        "whole": sum(p.numel() for p in want.parameters()),
        "same": rank != 0 or (full.keys() == sd.keys() and all(torch.equal(full[k], sd[k]) for k in sd)),
        "buffers": all(torch.equal(b, buffers[n]) for n, b in policy.named_buffers()),
        "logprobs": float((ours - theirs).abs().max()),
        "pad": tokenizer.pad_token_id == want.config.pad_token_id,
        "training": training,
    }


def test_under_fsdp_only_rank_0_reads_the_weights_and_its_tensors_fill_every_shard(tmp_path):
    r0, r1 = _spawn(_read_on_rank0, tmp_path)
    assert r0["calls"] == 1 and r1["calls"] == 0  # rank 1 never loads the model
    assert r0["held"] == r0["whole"] and r1["held"] == 0  # rank 1 holds its structure on the meta device only
    assert r1["local"] < r1["whole"] and r0["local"] + r1["local"] >= r0["whole"]  # each rank its shard
    assert r0["same"], "the gathered shards are not the one-process model's weights"
    assert r0["training"] == r1["training"]  # else the ranks' backward passes differ (gradient checkpointing)
    for r in (r0, r1):
        assert r["buffers"] and r["pad"], r  # rotary tables broadcast whole; rank 0's tokenizer
        assert r["logprobs"] < 1e-5, r
