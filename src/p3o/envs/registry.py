"""Environments by name: the built-ins (``calc``, ``guess``) and your own ``package.module:Name``.

    env = make_env("calc")                                   # a fresh environment for one episode
    env = make_env("my_envs:Maze", size=5)                    # your class (or factory), with its own options
    problems = env_problems("guess", "train", seed=0, n=64)  # a built-in environment's own problems

A name that is unknown, a module that does not import, options the constructor does not take, or an object that is
not an `Environment` (reset / step / close and ``stop_strings``) is a one-line ConfigError naming it.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from p3o.envs.base import Environment, EnvLimits
from p3o.envs.builtin import CalcEnv, GuessEnv, guess_problems
from p3o.envs.tools import resolve_spec
from p3o.errors import ConfigError
from p3o.tasks.base import Problem
from p3o.tasks.calc import load_calc

__all__ = ["ENVS", "ENV_NAMES", "env_problems", "env_splits", "make_env"]

ENVS: dict[str, Callable[..., Any]] = {"calc": CalcEnv, "calc-small": CalcEnv, "guess": GuessEnv}
ENV_NAMES = tuple(ENVS)
_PROBLEMS: dict[str, Callable[..., list[Problem]]] = {
    "calc": load_calc,
    "calc-small": functools.partial(load_calc, kind="small"),  # the tiny model's agent testbed (2 digit × 1 digit)
    "guess": guess_problems,
}


def _factory(name: str) -> Callable[..., Any]:
    if name in ENVS:
        return ENVS[name]
    if ":" not in name:
        raise ConfigError(
            f"environment {name!r}: unknown; known: {', '.join(ENV_NAMES)}, or your own 'package.module:Name'"
        )
    obj = resolve_spec(name, what="environment")
    if not callable(obj):
        raise ConfigError(f"environment {name!r}: not a class or a function that makes an environment")
    return obj


def make_env(name: str, limits: EnvLimits | None = None, **options: Any) -> Environment:
    """A fresh environment `name` made with `options` (``limits`` is passed only to constructors that take it).

    ConfigError (one line) for an unknown name, an import failure, an option the constructor does not take, a
    constructor that raises, or an object without reset / step / close and a ``stop_strings`` tuple of strings.
    """
    factory = _factory(str(name).strip())
    kwargs = dict(options)
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # no signature: pass what was given
        params = {}
    if limits is not None and (
        "limits" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    ):
        kwargs["limits"] = limits
    if params:
        try:
            inspect.signature(factory).bind(**kwargs)
        except TypeError as err:
            raise ConfigError(f"environment {name!r}: {err} (options given: {sorted(options) or 'none'})") from None
    try:
        env = factory(**kwargs)
    except ConfigError:
        raise
    except Exception as err:
        raise ConfigError(f"environment {name!r}: making it raised {type(err).__name__}: {err}") from None
    missing = [m for m in ("reset", "step", "close") if not callable(getattr(env, m, None))]
    stops = getattr(env, "stop_strings", None)
    if missing:
        raise ConfigError(f"environment {name!r}: not an environment (no {', '.join(missing)} method)")
    if not isinstance(stops, tuple | list) or not all(isinstance(s, str) and s for s in stops):
        raise ConfigError(
            f"environment {name!r}: stop_strings must be a tuple of non-empty strings (may be empty), got {stops!r}"
        )
    return env  # type: ignore[return-value]


def env_problems(name: str, split: str = "train", *, seed: int = 0, n: int | None = None) -> list[Problem] | None:
    """A built-in environment's own problems (calc: `p3o.tasks.calc.load_calc`, guess: `guess_problems`); None for
    your own environment (its problems come from ``task.name``)."""
    loader = _PROBLEMS.get(str(name).strip())
    return None if loader is None else loader(split, seed=seed, n=n)


def env_splits(
    name: str, *, seed: int, n_train: int | None, n_eval: int
) -> tuple[list[Problem], list[Problem]] | None:
    """A built-in environment's (training, held-out) problems (`env_problems`' train and test splits, no held-out
    ones when ``n_eval`` is 0); None for your own environment (its problems come from ``task.name``)."""
    train = env_problems(name, "train", seed=seed, n=n_train)
    if train is None:
        return None
    held_out = env_problems(name, "test", seed=seed, n=n_eval) if n_eval > 0 else []
    return train, held_out or []
