"""Weights from files into the policy: every tensor of a ``policy/`` directory (:func:`read_weights`, read whole
before the model changes), and the loads into an FSDP2-sharded policy (``train.strategy fsdp``): a ``sharded/``
directory (DCP reads the shards each rank needs, at any world size), or a ``policy/`` one that rank 0 reads and
broadcasts into every rank's shards, with its AdamW state re-keyed by parameter name.

Every function here takes the bare model: :mod:`p3o.train.checkpoint` unwraps DDP / torch.compile wrappers first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
    set_state_dict,
)

from p3o import dist
from p3o.errors import P3OError
from p3o.train.intact import together

__all__ = ["load_full_into_sharded", "load_optimizer_into_sharded", "load_sharded", "read_weights"]


def read_weights(policy_dir: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the ``*.safetensors`` files in ``policy_dir`` (read fully before any model changes)."""
    files = sorted(policy_dir.glob("*.safetensors"))
    if not files:
        raise P3OError(f"{policy_dir}: no *.safetensors weights found")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    return state


def load_sharded(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
    """Load a ``sharded/`` checkpoint into `model` (and `optimizer`) whatever their placement now: FSDP at any
    world size, or one process (DCP reads the shards it needs)."""
    if optimizer is None:
        msd = get_model_state_dict(model)
        dcp.load({"model": msd}, checkpoint_id=str(path))
        set_model_state_dict(model, msd)
        return
    msd, osd = get_state_dict(model, optimizer)
    sd = {"model": msd, "optim": osd}
    dcp.load(sd, checkpoint_id=str(path))
    set_state_dict(model, optimizer, model_state_dict=sd["model"], optim_state_dict=sd["optim"])


def load_full_into_sharded(model: torch.nn.Module, policy_dir: Path) -> None:
    """A ``policy/`` checkpoint (written unsharded) into a sharded model: rank 0 reads its full tensors and checks
    the keys (a missing or unexpected key raises P3OError on every rank), then broadcasts them tensor by tensor into
    every rank's shards (``broadcast_from_rank0``): no other rank reads or holds the whole model."""
    held: dict[str, dict[str, torch.Tensor]] = {}

    def read() -> None:
        if (policy_dir / "adapter_config.json").is_file():
            raise P3OError(
                f"{policy_dir}: LoRA adapters saved without train.strategy fsdp cannot be resumed under fsdp; resume "
                "with the run's strategy"
            )
        held["state"] = _full_state_for(model, read_weights(policy_dir), policy_dir)

    together(read, decide=True)
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=True)
    set_model_state_dict(model, held.get("state", {}), options=options)


def _full_state_for(model: torch.nn.Module, state: dict[str, torch.Tensor], where: Path) -> dict[str, torch.Tensor]:
    """`state` (full tensors by key) checked against `model`'s keys: tied weights dropped by save_pretrained
    (lm_head -> embed_tokens, the same parameter under another name) are filled in; any other missing or unexpected
    key raises P3OError (nothing keeps its initial value silently)."""
    params = model.state_dict(keep_vars=True)
    unexpected = [k for k in state if k not in params]
    loaded = {id(params[k]): k for k in state if k in params}
    for k, v in params.items():
        if k not in state and id(v) in loaded:
            state[k] = state[loaded[id(v)]]
    missing = [k for k in params if k not in state]
    if missing or unexpected:
        what = f"missing {missing[:3]}" if missing else f"unexpected {unexpected[:3]}"
        raise P3OError(f"{where}: weights do not match the model ({what})")
    return state


def load_optimizer_into_sharded(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, saved: dict[str, Any] | None
) -> None:
    """An unsharded AdamW state (keyed by parameter index, as ``optimizer.state_dict()`` writes it; held by rank 0
    alone, None elsewhere) into the optimizer of a sharded model: re-keyed by parameter name, then broadcast from
    rank 0 into every rank's shards."""
    osd: dict[str, Any] = {}
    if saved is not None:
        names = [n for n, p in model.named_parameters() if p.requires_grad]
        osd = {
            "state": {names[int(i)]: st for i, st in saved["state"].items()},
            "param_groups": [{**g, "params": [names[int(i)] for i in g["params"]]} for g in saved["param_groups"]],
        }
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=dist.world_size() > 1)
    set_optimizer_state_dict(model, optimizer, osd, options=options)
