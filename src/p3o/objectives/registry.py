"""The objective registry: one :class:`Objective` record per name, the only place that says what an objective is.

A record holds the loss function, the optional inputs it reads (``needs``) and its typed hyper-parameters
(``hypers``, read from the function's keyword-only signature, ``Literal`` where a value is one of a set). The update
step, the config (its ``objective.<hyper>`` keys), the TRL and verl plug-ins and the experiment presets read only
from it::

    rec = get_objective("p3o")
    rec.hypers["scope"].type                  # Literal['micro-batch', 'step', 'sequence']
    full = rec.resolve({"scope": "step"})     # every hyper-parameter, defaults filled in, keywords checked
    rec.inputs_needed(full)                   # frozenset({'step_ess'})
    loss, stats = rec(inputs, **full)         # a record is callable like the function it wraps

Adding an objective: write ``fn(inputs: ObjectiveInputs, *, hyper=default, ...) -> (loss, stats)`` in
``losses.py`` (ending in ``core.finish``) and add one ``Objective(...)`` entry to ``_RECORDS`` below; the config,
``p3o train --objective.name``, the plug-ins and ``--help`` pick it up (docs/objectives.md, "Adding an objective").
"""

from __future__ import annotations

import functools
import inspect
import typing
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from p3o.objectives import losses
from p3o.objectives.core import ObjectiveError

ObjectiveFn = Callable[..., Any]

INPUTS = ("old_logp", "prox_logp", "ref_logp", "entropy", "step_ess", "m2po_threshold")
"""The optional ``ObjectiveInputs`` an update step may have to compute for an objective."""

# Inputs that any objective needs when one of its hyper-parameters takes a value: hyper -> (needed when, input).
# Keyed on the hyper-parameter, never on the objective's name, so a new objective with the keyword gets the input.
_CONDITIONAL: dict[str, tuple[Callable[[Any], bool], str]] = {
    "rollout_correction": (lambda v: v != "none", "old_logp"),
    "ref_kl_coef": (lambda v: float(v or 0.0) != 0.0, "ref_logp"),
    "entropy_coef": (lambda v: float(v or 0.0) != 0.0, "entropy"),
    "scope": (lambda v: v == "step", "step_ess"),
}


@dataclass(frozen=True)
class Hyper:
    """One keyword hyper-parameter: its name, type (a ``Literal`` when it is one of a set) and default."""

    name: str
    type: Any
    default: Any


@dataclass(frozen=True)
class Objective:
    """An objective: ``fn(inputs, **hyper) -> (loss, stats)``, the inputs it always needs and its hyper-parameters.

    Attributes:
        name: the registry name (``objective.name``).
        fn: the loss function; its keyword-only parameters are the hyper-parameters.
        needs: optional inputs read whatever the hyper-parameters (``prox_logp``, ``m2po_threshold``); the
            ones that depend on a hyper-parameter (``rollout_correction`` → ``old_logp``, ...) are added by
            :meth:`inputs_needed`.
        coupling: what ties a token's loss to other rows: ``row`` (nothing: the per-token loss sees its own row),
            ``ess-scope`` (only the ESS, whose set is the ``scope`` hyper-parameter; ``sequence`` makes it
            row-local) or ``batch`` (another batch-level statistic). Batched evaluators (the synthetic
            instrument) use it to pack independent batches into one call exactly.
        aliases: deprecated spelling -> current keyword (accepted with a DeprecationWarning for one release).
        summary: one line for listings (``p3o train --help``, docs).
    """

    name: str
    fn: ObjectiveFn
    needs: frozenset[str] = frozenset()
    coupling: Literal["row", "ess-scope", "batch"] = "row"
    aliases: Mapping[str, str] = field(default_factory=dict)
    summary: str = ""

    def __post_init__(self) -> None:
        unknown = set(self.needs) - set(INPUTS)
        assert not unknown, f"{self.name}: unknown inputs {unknown}; valid: {INPUTS}"
        assert set(self.aliases.values()) <= set(self.hypers), f"{self.name}: alias to an unknown keyword"

    @functools.cached_property
    def hypers(self) -> dict[str, Hyper]:
        """Keyword-only parameters of ``fn`` with their resolved annotations and defaults (declaration order)."""
        hints = typing.get_type_hints(self.fn)
        return {
            p.name: Hyper(p.name, hints.get(p.name, Any), p.default)
            for p in inspect.signature(self.fn).parameters.values()
            if p.kind is inspect.Parameter.KEYWORD_ONLY
        }

    @property
    def __signature__(self) -> inspect.Signature:
        """The wrapped function's signature (``inspect.signature(rec)`` lists the hyper-parameters)."""
        return inspect.signature(self.fn)

    def defaults(self) -> dict[str, Any]:
        """Every hyper-parameter and its default."""
        return {h.name: h.default for h in self.hypers.values()}

    def resolve(self, hyper: Mapping[str, Any] | None = None, *, where: str = "objective") -> dict[str, Any]:
        """Every hyper-parameter: the defaults overridden by ``hyper``, deprecated spellings renamed.

        Raises ObjectiveError (one line naming ``where``, the keyword and the valid ones) for an unknown keyword,
        or when a keyword is given under both its old and its new spelling.
        """
        full = self.defaults()
        given: dict[str, Any] = {}
        for key, value in (hyper or {}).items():
            new = self.aliases.get(key)
            if new is not None:
                if new in (hyper or {}):
                    raise ObjectiveError(f"{where}: {key!r} and {new!r} are the same keyword of {self.name!r}")
                text = f"{where}: {self.name} keyword {key!r} is deprecated; use {new!r}"
                warnings.warn(text, DeprecationWarning, stacklevel=3)
                key = new
            if key not in full:
                valid = ", ".join(full)
                raise ObjectiveError(f"{where}: unknown keyword {key!r} for objective {self.name!r}; valid: {valid}")
            given[key] = value
        full.update(given)
        return full

    def inputs_needed(self, hyper: Mapping[str, Any] | None = None) -> frozenset[str]:
        """The optional ``ObjectiveInputs`` fields this objective reads with ``hyper`` (defaults filled in)."""
        full = self.resolve(hyper)
        need = set(self.needs)
        for key, (when, what) in _CONDITIONAL.items():
            if key in full and when(full[key]):
                need.add(what)
        return frozenset(need)

    def __call__(self, inputs: Any, **hyper: Any) -> Any:
        """``fn(inputs, **hyper)`` with the keywords checked (and deprecated spellings renamed)."""
        return self.fn(inputs, **self.resolve(hyper))


_TRUNC_ALIASES = {"clip_eps_low": "trunc_eps_low", "clip_eps_high": "trunc_eps_high"}

_RECORDS = (
    Objective(
        "p3o",
        losses.p3o,
        coupling="ess-scope",
        summary="ESS-capped weights + ESS-weighted KL to the behaviour policy (no clip)",
    ),
    Objective(
        "p3o_two_anchor",
        losses.p3o_two_anchor,
        needs=frozenset({"prox_logp"}),
        coupling="batch",
        summary="P3O anchored on both the behaviour and the proximal policy",
    ),
    Objective("grpo", losses.grpo, summary="PPO clip on the token ratio (GRPO)"),
    Objective("dapo", losses.dapo, summary="decoupled clip ε_low/ε_high, token-mean (DAPO)"),
    Objective("gspo", losses.gspo, summary="PPO clip on the sequence ratio (GSPO)"),
    Objective("cispo", losses.cispo, aliases=_TRUNC_ALIASES, summary="truncated stop-gradient IS weights (CISPO)"),
    Objective(
        "decoupled_ppo",
        losses.decoupled_ppo,
        needs=frozenset({"prox_logp"}),
        summary="clip against π_prox, π_prox/π_b reweighting (decoupled PPO, AReaL)",
    ),
    Objective(
        "m2po",
        losses.m2po,
        needs=frozenset({"m2po_threshold"}),
        coupling="batch",
        summary="mask the largest second-moment tokens (M2PO)",
    ),
    Objective(
        "minpro",
        losses.minpro,
        aliases=_TRUNC_ALIASES,
        summary="token ratio × the minimum earlier ratio, truncated (MinPRO)",
    ),
)

OBJECTIVES: dict[str, Objective] = {rec.name: rec for rec in _RECORDS}
"""name -> :class:`Objective` record; a record is callable as ``rec(inputs, **hyper) -> (loss, stats)``."""


def get_objective(name: str) -> Objective:
    """The objective registered as ``name``; an unknown name raises ObjectiveError (a ValueError) listing them."""
    try:
        return OBJECTIVES[name]
    except KeyError:
        raise ObjectiveError(f"objective.name: unknown objective {name!r}; known: {', '.join(OBJECTIVES)}") from None


def objective_defaults(name: str) -> dict[str, Any]:
    """Keyword-only hyper-parameters of objective ``name`` and their defaults."""
    return get_objective(name).defaults()
