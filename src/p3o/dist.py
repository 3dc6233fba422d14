"""torch.distributed helpers that are no-ops at world size 1, and the one device resolver (`resolve_device`).

Data-parallel training is plain torch.distributed: `torchrun --nproc_per_node 2 -m p3o train ...`
sets RANK / WORLD_SIZE / MASTER_ADDR, `init_from_env()` joins the group (gloo on CPU, nccl on GPU),
and the trainer all-reduces gradients, the step's token count and the ESS sums through these helpers.
With a single process every helper returns its input unchanged, so the same code runs everywhere.

    p3o.dist.init_from_env(); total = p3o.dist.all_reduce_sum(torch.tensor(local_tokens))
"""

from __future__ import annotations

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


def init_from_env(backend: str | None = None) -> bool:
    """Join the process group described by torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR/PORT).

    Returns True when running with world size > 1 (and the group is initialised), False for a single
    process. The backend defaults to nccl when CUDA is available, gloo otherwise.
    """
    if is_initialized():
        return dist.get_world_size() > 1
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return False
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    dist.init_process_group(backend=backend)
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    return dist.get_world_size() > 1


def destroy() -> None:
    """Leave the process group (no-op when none is up)."""
    if is_initialized():
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
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _all_reduce(x: Tensor, op: Any) -> Tensor:
    """``op`` over ranks into a new tensor on ``x``'s device (the input is not modified; it may live on any device:
    it is moved to the backend's device for the collective). Identity at world size 1."""
    if world_size() == 1:
        return x
    y = x.to(_comm_device(), copy=True)
    dist.all_reduce(y, op=op)
    return y.to(x.device)


def all_reduce_sum(x: Tensor) -> Tensor:
    """Σ over ranks (a new tensor; the input is not modified). Identity at world size 1."""
    return _all_reduce(x, dist.ReduceOp.SUM)


def all_reduce_max(x: Tensor) -> Tensor:
    """max over ranks (a new tensor). Identity at world size 1."""
    return _all_reduce(x, dist.ReduceOp.MAX)


def all_reduce_min(x: Tensor) -> Tensor:
    """min over ranks (a new tensor). Identity at world size 1."""
    return _all_reduce(x, dist.ReduceOp.MIN)


def all_reduce_mean(x: Tensor) -> Tensor:
    """Mean over ranks (a new float tensor). Identity at world size 1."""
    if world_size() == 1:
        return x
    return all_reduce_sum(x.float()) / world_size()


def all_reduce_grads_(params: list[torch.nn.Parameter]) -> None:
    """Sum the gradients of `params` over ranks in place, through one flat buffer.

    The trainer normalises every rank's loss by the step's GLOBAL token count, so the sum of the
    per-rank gradients is exactly the gradient of the global loss (no division by the world size).
    Parameters without a gradient contribute zeros so every rank sends the same buffer layout.
    """
    if world_size() == 1:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    offset = 0
    for p, g in zip(params, grads):
        n = g.numel()
        p.grad = flat[offset : offset + n].view_as(p).clone()
        offset += n


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
