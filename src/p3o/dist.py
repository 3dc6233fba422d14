"""torch.distributed helpers that are no-ops at world size 1, and the one device resolver (`resolve_device`).

Data-parallel training is plain torch.distributed: `torchrun --nproc_per_node 2 -m p3o train ...`
sets RANK / WORLD_SIZE / MASTER_ADDR, `init_from_env()` joins the group (gloo on CPU, nccl on GPU),
and the trainer all-reduces the step's token count and the ESS sums through these helpers (gradients meet in torch's
DDP or FSDP2: `p3o.train.placement`).
With a single process every helper returns its input unchanged, so the same code runs everywhere.

    p3o.dist.init_from_env(); total = p3o.dist.all_reduce_sum(torch.tensor(local_tokens))

Groups of their own: the rollout workers' weight-sync group (`p3o.cluster.weights`) is a process group apart from
the data-parallel one, formed over a TCP store by `new_group` and used through helpers that take it explicitly:

    group = p3o.dist.new_group(store, rank=0, size=3, backend="gloo", host="10.0.0.1")
    p3o.dist.broadcast_(bucket, group, src=0)          # every member calls it with a tensor of the same shape
"""

from __future__ import annotations

import datetime
import gc
import os
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor


def resolve_device(device: str = "auto") -> torch.device:
    """ "auto" -> cuda when available, else cpu; any other name ("cpu", "cuda:1", ...) as `torch.device(device)`.

    The one meaning of a device option (`model.device`, `p3o eval --device`); `str(resolve_device(d))` is its name.
    """
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def is_initialized() -> bool:
    """True when a torch.distributed process group is up."""
    return dist.is_available() and dist.is_initialized()


def default_backend(*, cpu_offload: bool = False, cuda: bool | None = None) -> str:
    """The data-parallel group's backend: nccl with CUDA (`cuda`: None = whether this machine has it), gloo
    without; with `cpu_offload` (FSDP shards and their gradients in host memory, as CPU DTensors whose collectives
    at startup, in gradient clipping and in the sharded scaler's inf check run on the CPU) "cuda:nccl,cpu:gloo": one
    group, NCCL for GPU tensors and gloo for CPU ones (as NeMo-RL / Automodel and torchtitan do)."""
    cuda = torch.cuda.is_available() if cuda is None else cuda
    if not cuda:
        return "gloo"
    return "cuda:nccl,cpu:gloo" if cpu_offload else "nccl"


def init_from_env(backend: str | None = None, *, force: bool = False, cpu_offload: bool = False) -> bool:
    """Join the process group described by torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR/PORT).

    Returns True when running with world size > 1 (and the group is initialised), False for a single
    process. The backend defaults to `default_backend(cpu_offload=...)`: nccl when CUDA is available, gloo
    otherwise, "cuda:nccl,cpu:gloo" under `train.cpu_offload`. `force`: form the group under torchrun at world size 1
    too (FSDP2 shards over a device mesh, even one of one rank).
    """
    if is_initialized():
        return dist.get_world_size() > 1
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1 and not (force and "MASTER_ADDR" in os.environ and "RANK" in os.environ):
        return False
    backend = backend or default_backend(cpu_offload=cpu_offload)
    dist.init_process_group(backend=backend)
    if "nccl" in backend:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    return dist.get_world_size() > 1


def destroy() -> None:
    """Leave the process group (no-op when none is up). Unreachable DDP / FSDP state is collected first, while the
    group is still up: a DDP reducer released after ``destroy_process_group`` (a reference cycle freed later, at
    exit) can hang in gloo's destructor, joining its worker threads."""
    if is_initialized():
        gc.collect()
        dist.destroy_process_group()


def rank() -> int:
    """This process's rank (0 without torch.distributed)."""
    return dist.get_rank() if is_initialized() else 0


def world_size() -> int:
    """Number of data-parallel processes (1 without torch.distributed)."""
    return dist.get_world_size() if is_initialized() else 1


def is_main() -> bool:
    """True on rank 0, the rank that logs and writes checkpoints."""
    return rank() == 0


def group() -> Any | None:
    """The data-parallel group to hand to objectives for the ESS reduction; None at world size 1."""
    return dist.group.WORLD if is_initialized() and dist.get_world_size() > 1 else None


def _comm_device() -> torch.device:
    """Where a collective's tensors must live: the current CUDA device under nccl, the CPU under gloo."""
    if "nccl" in str(dist.get_backend()):  # "nccl", or "cuda:nccl,cpu:gloo" (its GPU side)
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _size(group: Any | None) -> int:
    """Members of `group` (None: the data-parallel group; 1 without torch.distributed)."""
    if group is None:
        return world_size()
    return group.size() if hasattr(group, "size") else dist.get_world_size(group)


def _all_reduce(x: Tensor, op: Any, group: Any | None = None) -> Tensor:
    """``op`` over `group`'s members (None: the data-parallel group) into a new tensor on ``x``'s device (the input
    is not modified; it may live on any device: it is moved to the backend's device for the collective). Identity for
    a group of one."""
    if _size(group) == 1:
        return x
    if group is None:
        y = x.to(_comm_device(), copy=True)
        dist.all_reduce(y, op=op)
        return y.to(x.device)
    y = x.clone()
    opts = dist.AllreduceOptions()
    opts.reduceOp = op
    group.allreduce([y], opts).wait()  # a group of its own (`new_group`) need not be registered with torch.distributed
    return y


def all_reduce_sum(x: Tensor, group: Any | None = None) -> Tensor:
    """Σ over `group` (None: the data-parallel ranks; a new tensor, the input is not modified). Identity at size 1."""
    return _all_reduce(x, dist.ReduceOp.SUM, group)


def all_reduce_max(x: Tensor, group: Any | None = None) -> Tensor:
    """max over `group` (None: the data-parallel ranks; a new tensor). Identity at size 1."""
    return _all_reduce(x, dist.ReduceOp.MAX, group)


def all_reduce_min(x: Tensor, group: Any | None = None) -> Tensor:
    """min over `group` (None: the data-parallel ranks; a new tensor). Identity at size 1."""
    return _all_reduce(x, dist.ReduceOp.MIN, group)


def all_reduce_mean(x: Tensor, group: Any | None = None) -> Tensor:
    """Mean over `group` (None: the data-parallel ranks; a new float tensor). Identity at size 1."""
    n = _size(group)
    if n == 1:
        return x
    return all_reduce_sum(x.float(), group) / n


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank `src`'s `obj` on every rank (pickled). Identity at world size 1."""
    if world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def all_gather_object(obj: Any) -> list[Any]:
    """[obj of rank 0, obj of rank 1, ...] on every rank. [obj] at world size 1."""
    if world_size() == 1:
        return [obj]
    out: list[Any] = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    """Wait for every rank (no-op at world size 1)."""
    if world_size() > 1:
        dist.barrier()


def group_backend() -> str:
    """The backend a group of its own uses here: nccl when CUDA is available (tensors on the GPU), else gloo."""
    return "nccl" if torch.cuda.is_available() else "gloo"


def backend_available(backend: str) -> bool:
    """Whether this torch build can form a `backend` group ("gloo" or "nccl"; False for any other name)."""
    if not dist.is_available():
        return False
    if backend == "gloo":
        return dist.is_gloo_available()
    if backend == "nccl":
        return dist.is_nccl_available() and torch.cuda.is_available()
    return False


def new_group(
    store: Any, *, rank: int, size: int, backend: str, host: str | None = None, timeout_s: float = 300.0
) -> Any:
    """A process group of its own (not torch.distributed's default group, which may not even exist in this process):
    `size` members meeting through `store` (a `torch.distributed.Store`, e.g. a PrefixStore over a TCPStore), this
    one as `rank`. gloo binds to `host` (this member's address, so members on other nodes can reach it); nccl uses
    the current CUDA device (unverified on GPUs here). Blocks until every member has joined."""
    timeout = datetime.timedelta(seconds=timeout_s)
    if backend == "gloo":
        opts = dist.ProcessGroupGloo._Options()
        opts._timeout = timeout
        if host:
            opts._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
        else:
            opts._devices = [dist.ProcessGroupGloo.create_default_device()]
        return dist.ProcessGroupGloo(store, rank, size, opts)
    if backend == "nccl":
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, size, opts)
    raise ValueError(f"new_group: unknown backend {backend!r} (gloo or nccl)")


def broadcast_(x: Tensor, group: Any, src: int = 0) -> Tensor:
    """Rank `src`'s `x` into every member's `x` (in place, same shape and dtype everywhere) over `group`, a group
    from `new_group`; returns `x`."""
    group.broadcast(x, src).wait()
    return x
