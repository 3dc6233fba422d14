"""Pieces shared by the framework plug-ins: objective look-up with checked hyper-parameters, the data-parallel
group for the ESS all-reduce, and one-sync conversion of an objective's stats to Python floats.

    fn, hyper = resolve_objective("minpro", {"clip_eps_high": 2.0}, where="objective_kwargs")
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist

from p3o.errors import ConfigError
from p3o.objectives import get_objective, objective_defaults


def resolve_objective(
    name: str, kwargs: Mapping[str, Any] | None, *, where: str = "objective_kwargs"
) -> tuple[Callable[..., Any], dict[str, Any]]:
    """The registered objective ``name`` and a checked copy of its hyper-parameters.

    Raises ConfigError (one line) for an unknown objective (listing the known ones) or an unknown keyword
    (naming ``where``, the option the user set, and the valid keywords).
    """
    try:
        fn = get_objective(name)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    hyper = dict(kwargs or {})
    valid = objective_defaults(name)
    unknown = [k for k in hyper if k not in valid]
    if unknown:
        raise ConfigError(f"{where}: unknown keyword {unknown[0]!r} for objective {name!r}; valid: {', '.join(valid)}")
    return fn, hyper


def effective_agg(name: str, hyper: Mapping[str, Any]) -> str:
    """The token-aggregation mode objective ``name`` will use with ``hyper`` (its ``agg`` keyword or default)."""
    return str(hyper.get("agg", objective_defaults(name)["agg"]))


def default_group() -> Any:
    """The default torch.distributed process group when one is initialised, else None (single process)."""
    if dist.is_available() and dist.is_initialized():
        return dist.group.WORLD
    return None


def stats_to_floats(stats: Mapping[str, torch.Tensor]) -> dict[str, float]:
    """0-d stat tensors -> Python floats with a single device sync (one stack, one ``tolist``)."""
    if not stats:
        return {}
    keys = list(stats)
    values = torch.stack([stats[k].detach().float().reshape(()) for k in keys]).cpu().tolist()
    return dict(zip(keys, values))
