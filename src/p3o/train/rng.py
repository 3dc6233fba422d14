"""A process's random generators (Python, NumPy, torch CPU and CUDA) as plain values, and back.

A checkpoint keeps every rank's (:func:`gather_rng_states`, ``trainer_state.pt``'s ``rng``), so a resumed run draws
the same numbers as one that never stopped:

    state = rng_state()        # {"python", "numpy", "torch"[, "cuda"]}: tensors and plain values only
    set_rng_state(state)       # this process's generators as they were
"""

from __future__ import annotations

import random
import warnings
from typing import Any

import numpy as np
import torch

from p3o import dist

__all__ = ["gather_rng_states", "rng_state", "set_rng_state"]


def rng_state() -> dict[str, Any]:
    """This process's Python, NumPy, torch CPU (and CUDA when available) generator states.

    Plain values and tensors only (``torch.load(weights_only=True)`` reads them): NumPy's MT19937 state is kept as
    ``(name, keys (624,) int64 tensor, pos, has_gauss, cached_gaussian)``.
    """
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": (str(name), torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(gauss)),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def gather_rng_states() -> dict[int, dict[str, Any]]:
    """``{rank: rng_state() of that rank}`` on every rank (a collective: all ranks call it); ``{0: ...}`` alone."""
    return dict(enumerate(dist.all_gather_object(rng_state())))


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore the generator states captured by :func:`rng_state` (CUDA only when present on both sides)."""
    random.setstate(state["python"])
    name, keys, *rest = state["numpy"]
    keys = keys.numpy() if isinstance(keys, torch.Tensor) else keys
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), *rest))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        cuda = state["cuda"]
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)
        else:
            warnings.warn(
                f"checkpoint has CUDA RNG states for {len(cuda)} devices, this machine has "
                f"{torch.cuda.device_count()}; CUDA RNG not restored",
                stacklevel=2,
            )
