"""World size 2 (gloo, CPU) ≡ world size 1: the ESS all-reduce and the P3O loss/gradient over two processes."""

from __future__ import annotations

import socket
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from p3o.objectives import ObjectiveInputs, effective_sample_size, ess_from_parts, ess_parts, get_objective


def _data() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    rollout = -torch.rand(6, 5, generator=g) - 0.5
    logp = rollout + torch.randn(6, 5, generator=g) * 0.7
    logp[4:] += 30.0  # rank 1's tokens hold the global max: the MAX reduction matters
    mask = torch.rand(6, 5, generator=g) > 0.3
    mask[:, 0] = True
    return {"logp": logp, "rollout": rollout, "mask": mask, "adv": torch.randn(6, generator=g)}


def _objective(d: dict[str, torch.Tensor], num_tokens: torch.Tensor, name: str) -> tuple[torch.Tensor, ...]:
    logp = d["logp"].clone().requires_grad_()
    inp = ObjectiveInputs(logp, d["rollout"], d["mask"], d["adv"], num_tokens=num_tokens)
    loss, stats = get_objective(name)(inp)
    (grad,) = torch.autograd.grad(loss, logp)
    return loss.detach(), grad, stats["ess"]


def _worker(rank: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        d = {k: v[:3] if rank == 0 else v[3:] for k, v in _data().items()}
        num_tokens = d["mask"].sum().float()
        dist.all_reduce(num_tokens)  # the step's global count, as the training loop passes it
        ess = effective_sample_size(d["logp"] - d["rollout"], d["mask"])
        loss, grad, p3o_ess = _objective(d, num_tokens, "p3o")
        total = loss.clone()
        dist.all_reduce(total)  # DDP sums the rank losses' gradients; the loss sum is the one-batch loss
        step_ess = ess_from_parts([ess_parts(d["logp"] - d["rollout"], d["mask"])])
        torch.save(
            {"ess": ess, "p3o_ess": p3o_ess, "loss_sum": total, "grad": grad, "step_ess": step_ess},
            Path(out_dir) / f"rank{rank}.pt",
        )
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_world_size_two_equals_one(tmp_path: Path) -> None:
    mp.spawn(_worker, args=(_free_port(), str(tmp_path)), nprocs=2, join=True)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    d = _data()
    whole_ess = effective_sample_size(d["logp"] - d["rollout"], d["mask"])
    loss, grad, p3o_ess = _objective(d, d["mask"].sum(), "p3o")
    for r in (r0, r1):
        torch.testing.assert_close(r["ess"], whole_ess)
        torch.testing.assert_close(r["p3o_ess"], p3o_ess)
        torch.testing.assert_close(r["step_ess"], whole_ess)
        torch.testing.assert_close(r["loss_sum"], loss)
    torch.testing.assert_close(torch.cat([r0["grad"], r1["grad"]]), grad)
    # and the local (un-reduced) ESS of one half differs, so the all-reduce really happened
    half = effective_sample_size(d["logp"][:3] - d["rollout"][:3], d["mask"][:3])
    assert abs(half.item() - whole_ess.item()) > 1e-3
