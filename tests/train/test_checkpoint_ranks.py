"""Checkpoints at 2 gloo ranks (issue 45): the ranks decide together, hash in parallel, and read on rank 0.

* a checkpoint one rank cannot read is skipped by every rank (rank 0 picks the candidates, a failure anywhere
  fails that candidate everywhere): the ranks never resume from different steps;
* a sharded save hashes each shard on the rank that wrote it; a load hashes every file once, split over the ranks;
* a one-process checkpoint loads into a sharded model from rank 0's read alone (weights and AdamW state broadcast
  into the shards), and a weight file missing a key is refused on every rank (no silent initial values).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.multiprocessing as mp
from train_fakes import make_tiny_lm


def _spawn(fn, tmp: Path) -> list:
    tmp.mkdir(parents=True, exist_ok=True)
    mp.start_processes(_rank, args=(fn, str(tmp)), nprocs=2, join=True, start_method="fork")
    return [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(2)]


def _rank(rank: int, fn, tmp: str) -> None:
    import warnings

    import torch.distributed as tdist

    from p3o import dist

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    tdist.init_process_group("gloo", init_method=f"file://{tmp}/init", rank=rank, world_size=2)
    try:
        Path(tmp, f"rank{rank}.json").write_text(json.dumps(fn(rank, Path(tmp))))
    finally:
        dist.destroy()


def _one_rank_cannot_read(rank: int, tmp: Path) -> dict:
    from p3o import dist
    from p3o.errors import P3OError
    from p3o.train import checkpoint

    run = tmp / "run"
    if rank == 0:
        for step in (1, 2):
            checkpoint.save_checkpoint(run, step, model=make_tiny_lm(seed=step))
    dist.barrier()
    read = checkpoint._read_state

    def flaky(path, map_location):  # rank 1 cannot read step 2's trainer state (a node's disk, a stale mount)
        if rank == 1 and "step_000002" in str(path):
            raise OSError("Input/output error")
        return read(path, map_location)

    checkpoint._read_state = flaky
    model = make_tiny_lm(seed=0)
    found = checkpoint.load_checkpoint(run, model=model)
    weight = model.model.norm.weight.sum().item() + model.model.embed_tokens.weight.sum().item()
    try:
        checkpoint.load_checkpoint(run / "checkpoints" / "step_000002", model=make_tiny_lm(seed=0))
        alone = "loaded"
    except P3OError as err:
        alone = str(err)
    return {"step": found["step"], "weight": weight, "alone": alone}


def test_one_rank_failing_a_read_sends_every_rank_to_the_same_checkpoint(tmp_path):
    r0, r1 = _spawn(_one_rank_cannot_read, tmp_path)
    assert r0["step"] == r1["step"] == 1, (r0, r1)  # before: rank 0 resumed at step 2, rank 1 at step 1
    assert r0["weight"] == r1["weight"]
    assert "rank 1" in r0["alone"] and "Input/output error" in r1["alone"]  # an explicit checkpoint: fail together


def _hashes(rank: int, tmp: Path) -> dict:
    """The files each rank hashes while saving a sharded checkpoint, and while loading it."""
    import p3o.models.checkpoints as mc
    from p3o.train import checkpoint, intact
    from p3o.train.placement import Placement, PlacementSettings

    seen: list[str] = []
    digest = mc.file_digest

    def logged(path, *a):
        seen.append(Path(path).name)
        return digest(path, *a)

    mc.file_digest = checkpoint.file_digest = intact.file_digest = logged  # the save's hashes, then the load's
    model = make_tiny_lm(seed=0)
    Placement(model, PlacementSettings("fsdp"))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    checkpoint.save_sharded_checkpoint(tmp / "run", 1, model=model, optimizer=opt)
    saved, seen[:] = list(seen), []
    intact._VERDICTS.clear()  # rank 0's memory of its own save's check
    checkpoint.load_checkpoint(tmp / "run", model=model, optimizer=opt)
    return {"save": saved, "load": list(seen)}


def test_shards_are_hashed_on_their_own_rank_and_each_file_once_on_load(tmp_path):
    r0, r1 = _spawn(_hashes, tmp_path)
    assert "__1_0.distcp" in r1["save"] and "__1_0.distcp" not in r0["save"], (r0, r1)  # before: rank 0 hashed all
    assert "__0_0.distcp" in r0["save"]
    loaded = r0["load"] + r1["load"]
    meta = json.loads((tmp_path / "run" / "checkpoints" / "step_000001" / "meta.json").read_text())
    assert sorted(loaded) == sorted(Path(k).name for k in meta["files"]), (r0, r1)  # before: every rank, every file


def _rank0_reads(rank: int, tmp: Path) -> dict:
    """A one-process checkpoint (policy/ + whole AdamW state) into an FSDP model at 2 ranks."""
    from safetensors.torch import save_file

    from p3o import dist
    from p3o.errors import P3OError
    from p3o.train import checkpoint, weights
    from p3o.train.placement import Placement, PlacementSettings

    src = make_tiny_lm(seed=1)
    opt = torch.optim.AdamW(src.parameters(), lr=1e-2)
    src(torch.tensor([[3, 4, 5]])).logits.sum().backward()
    opt.step()
    if rank == 0:
        checkpoint.save_checkpoint(tmp / "run", 1, model=src, optimizer=opt)
        bad = tmp / "bad"
        bad.mkdir()
        drop = ("model.norm.weight", "lm_head.weight")  # the head is tied: save_pretrained leaves it out too
        save_file({k: v.clone() for k, v in src.state_dict().items() if k not in drop}, str(bad / "model.safetensors"))
    dist.barrier()
    reads: list[str] = []
    rw, rs = weights.read_weights, checkpoint._read_state
    weights.read_weights = lambda p: reads.append("weights") or rw(p)
    checkpoint._read_state = lambda p, m: reads.append("state") or rs(p, m)
    model = make_tiny_lm(seed=0)
    Placement(model, PlacementSettings("fsdp"))
    opt2 = torch.optim.AdamW(model.parameters(), lr=1e-2)
    checkpoint.load_checkpoint(tmp / "run", model=model, optimizer=opt2)
    done = list(reads)
    full = {k: v.full_tensor() for k, v in model.state_dict().items()}
    same = all(torch.equal(full[k], v) for k, v in src.state_dict().items())
    avg = [s["exp_avg"] for s in opt2.state.values()]
    moments = sum(float(a.full_tensor().abs().sum()) for a in avg)
    want = sum(float(s["exp_avg"].abs().sum()) for s in opt.state.values())
    try:
        weights.load_full_into_sharded(model, tmp / "bad")
        missing = "loaded"
    except P3OError as err:
        missing = str(err)
    return {"reads": done, "same": same, "moments": [moments, want], "missing": missing}


def test_a_one_process_checkpoint_is_read_on_rank_0_only_and_checked_strictly(tmp_path):
    r0, r1 = _spawn(_rank0_reads, tmp_path)
    assert r0["reads"] == ["state", "weights"] and r1["reads"] == [], (r0, r1)  # before: every rank read both
    for r in (r0, r1):
        assert r["same"]
        assert abs(r["moments"][0] - r["moments"][1]) <= 1e-6 * r["moments"][1], r["moments"]
        assert "missing ['model.norm.weight']" in r["missing"], r["missing"]  # before: loaded, the norm left as is
