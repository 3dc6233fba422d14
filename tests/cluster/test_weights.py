"""The weight channel's pieces without Ray: buckets, a real gloo group of its own between processes (the default
torch.distributed group never exists), the dist helpers on an explicit group, and the one-line refusals."""

from __future__ import annotations

import datetime
import multiprocessing as mp
from types import SimpleNamespace

import pytest
import torch

from p3o import dist
from p3o.cluster.runtime import check_resources, check_weight_sync, check_worker_python
from p3o.cluster.weights import HeldVersions, broadcast_state, plan_buckets, snapshot, specs_of, unique_bytes
from p3o.errors import ConfigError


def _state(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    emb = torch.randn(50, 8, generator=g)
    return {
        "embed.weight": emb,
        "layer.weight": torch.randn(8, 8, generator=g),
        "layer.bias": torch.randn(8, generator=g),
        "norm.weight": torch.randn(8, generator=g).to(torch.bfloat16),
        "head.weight": emb,  # tied: one storage
    }


def test_buckets_group_one_dtype_up_to_the_size():
    specs = specs_of(_state(0))
    buckets = plan_buckets(specs, bucket_bytes=1700)  # room for 425 float32 values
    assert sorted(i for b in buckets for i in b) == list(range(len(specs) - 1))  # every tensor once, in order
    for b in buckets:
        assert len({specs[i].dtype for i in b}) == 1
        assert b == list(range(b[0], b[-1] + 1))
    # the 400-value embedding fills a bucket alone; the bf16 norm sits apart from the float32 neighbours; the tied
    # head is an alias of the embedding, never sent
    assert [[specs[i].name for i in b] for b in buckets] == [
        ["embed.weight"],
        ["layer.weight", "layer.bias"],
        ["norm.weight"],
    ]
    assert [s.alias_of for s in specs] == [None, None, None, None, "embed.weight"]
    assert unique_bytes(_state(0)) == (50 * 8 + 64 + 8) * 4 + 8 * 2  # the tied head counted once


def _member(rank: int, port: int, out: mp.Queue) -> None:
    torch.set_num_threads(1)
    held = HeldVersions()
    held.join("127.0.0.1", port, 0, rank, 3, "gloo")
    specs = specs_of(_state(0))
    assert not held.receive(6, specs, keep=[6], bucket_bytes=1024, generation=1)  # a late call: nothing received
    assert held.receive(7, specs, keep=[7], bucket_bytes=1024, generation=0)
    assert held.receive(8, specs, keep=[8], bucket_bytes=1024, generation=0)
    total = dist.all_reduce_sum(torch.tensor([float(rank)]), group=held.group)
    got = held.get(8)
    tied = got["head.weight"] is got["embed.weight"]  # tied on arrival too
    values = {k: (v.float().tolist(), str(v.dtype)) for k, v in got.items()}  # plain data: no shared memory
    out.put((rank, sorted(held.versions), values, float(total), tied))


def test_a_gloo_group_of_its_own_broadcasts_a_version_in_buckets():
    store = torch.distributed.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=60)
    )
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_member, args=(r, store.port, out)) for r in (1, 2)]
    for p in procs:
        p.start()
    try:
        prefixed = torch.distributed.PrefixStore("p3o-weights/0", store)
        group = dist.new_group(prefixed, rank=0, size=3, backend="gloo", host="127.0.0.1", timeout_s=60)
        assert not torch.distributed.is_initialized()  # apart from the (absent) data-parallel group
        specs = specs_of(_state(0))
        broadcast_state(group, specs, _state(1), device=torch.device("cpu"), bucket_bytes=1024)
        broadcast_state(group, specs, _state(2), device=torch.device("cpu"), bucket_bytes=1024)
        assert float(dist.all_reduce_sum(torch.tensor([0.0]), group=group)) == 3.0
        results = sorted(out.get(timeout=120) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=60)
    want = _state(2)
    for rank, versions, got, total, tied in results:
        assert versions == [8]  # version 7 dropped: not in `keep`
        assert total == 3.0 and tied
        assert got.keys() == want.keys(), rank
        for k, v in want.items():
            assert got[k][1] == str(v.dtype) and torch.equal(torch.tensor(got[k][0]).to(v.dtype), v), (rank, k)


def test_a_kept_version_does_not_follow_the_live_tensors():
    live = _state(0)
    kept = snapshot(live)
    assert kept["head.weight"] is kept["embed.weight"]  # tied tensors stay one
    with torch.no_grad():
        live["layer.weight"].add_(1.0)  # the trainer's next update
    assert not torch.equal(kept["layer.weight"], live["layer.weight"])


def test_collective_without_a_backend_is_one_line():
    with pytest.raises(ConfigError, match=r"^rollout\.weight_sync: collective needs a torch.distributed") as err:
        check_weight_sync("collective", "nccl" if not torch.cuda.is_available() else "no-such-backend")
    assert "\n" not in str(err.value)
    check_weight_sync("collective", "gloo")
    check_weight_sync("object_store", "no-such-backend")


@pytest.mark.parametrize(
    ("printed", "engine", "message"),
    [
        ('{"ray": "2.0.0", "vllm": true}', "vllm", "has Ray 2.0.0 but this driver has Ray"),
        ('{"ray": null, "vllm": true}', "hf", "has no Ray"),
        ('{"ray": "DRIVER", "vllm": false}', "vllm", "has no vLLM"),
    ],
)
def test_a_workers_interpreter_is_checked_before_any_model_loads(tmp_path, printed, engine, message):
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\necho '{printed.replace('DRIVER', '9.9.9')}'\n")
    python.chmod(0o755)
    with pytest.raises(ConfigError, match=r"^ray\.worker_python: ") as err:
        check_worker_python(str(python), engine=engine, driver_ray="9.9.9")
    assert message in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="does not exist"):
        check_worker_python(str(tmp_path / "nope"), engine="hf", driver_ray="9.9.9")


def test_workers_asking_for_more_than_the_cluster_has_are_refused():
    ray = SimpleNamespace(cluster_resources=lambda: {"CPU": 4.0, "GPU": 1.0, "rollout": 1.0})
    check_resources(ray, gpus_per_worker=0.5, workers=2, resource=None)
    with pytest.raises(ConfigError, match=r"^rollout\.workers: 2 workers ask for 2 GPUs but the Ray cluster has 1"):
        check_resources(ray, gpus_per_worker=1.0, workers=2, resource=None)
    with pytest.raises(ConfigError, match=r"^ray\.worker_resource: the Ray cluster declares 1 units of 'rollout'"):
        check_resources(ray, gpus_per_worker=0.0, workers=2, resource="rollout")
