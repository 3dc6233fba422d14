"""The objective registry: one dict from name to function, with keyword checking.

Usage: ``loss, stats = get_objective("p3o")(inputs, scope="micro-batch")``;
``objective_defaults("grpo") -> {"clip_eps": 0.2, ...}``.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from p3o.objectives import losses
from p3o.objectives.core import ObjectiveError

ObjectiveFn = Callable[..., Any]


def _checked(name: str, fn: ObjectiveFn) -> ObjectiveFn:
    """Wrap ``fn`` so an unknown keyword fails naming it and the valid ones (signature kept via __wrapped__)."""
    valid = [p.name for p in inspect.signature(fn).parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY]

    @functools.wraps(fn)
    def wrapper(inputs: Any, **hyper: Any) -> Any:
        unknown = [k for k in hyper if k not in valid]
        if unknown:
            raise ObjectiveError(f"objective {name!r}: unknown keyword {unknown[0]!r}; valid: {', '.join(valid)}")
        return fn(inputs, **hyper)

    return wrapper


OBJECTIVES: dict[str, ObjectiveFn] = {
    name: _checked(name, fn)
    for name, fn in {
        "p3o": losses.p3o,
        "p3o_two_anchor": losses.p3o_two_anchor,
        "grpo": losses.grpo,
        "dapo": losses.dapo,
        "gspo": losses.gspo,
        "cispo": losses.cispo,
        "decoupled_ppo": losses.decoupled_ppo,
        "m2po": losses.m2po,
        "minpro": losses.minpro,
    }.items()
}
"""name -> objective ``fn(inputs, **hyper) -> (loss, stats)``; hyper-parameters are keyword-only."""


def get_objective(name: str) -> ObjectiveFn:
    """The objective registered as ``name``; an unknown name raises ObjectiveError (a ValueError) listing them."""
    try:
        return OBJECTIVES[name]
    except KeyError:
        raise ObjectiveError(f"objective.name: unknown objective {name!r}; known: {', '.join(OBJECTIVES)}") from None


def objective_defaults(name: str) -> dict[str, Any]:
    """Keyword-only hyper-parameters of objective ``name`` and their defaults."""
    sig = inspect.signature(get_objective(name))
    return {p.name: p.default for p in sig.parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY}
