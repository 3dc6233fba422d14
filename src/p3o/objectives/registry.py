"""The objective registry: one :class:`Objective` record per name, the only place that says what an objective is.

A record holds the loss function, the optional inputs it reads (``needs``) and its typed hyper-parameters
(``hypers``, read from the function's keyword-only signature, ``Literal`` where a value is one of a set). The update
step, the config (its ``objective.<hyper>`` keys), the TRL and verl plug-ins and the experiment presets read only
from it::

    rec = get_objective("p3o")
    rec.hypers["scope"].type                  # Literal['micro-batch', 'step', 'sequence']
    full = rec.resolve({"scope": "step"})     # THE resolver: defaults filled in, aliases renamed, keywords checked
    rec.inputs_needed(full)                   # frozenset({'step_ess'})
    loss, stats = rec(inputs, **full)         # a record is callable like the function it wraps (resolves per call)
    bound = rec.bind(full)                    # resolved once: BoundObjective(record, hyper, needs)
    loss, stats = bound(inputs)               # the per-micro-batch path: no re-resolution

A config resolves with ``rec.resolve(given, key_prefix="objective.", check=its_checker)`` (config-style messages,
values coerced to the declared types) and keeps ``rec.resolve(..., given_only=True)`` as what the user set.

The settings every objective shares (rollout correction, aggregation, reference KL, entropy bonus) are declared
once, in :class:`p3o.objectives.shared.SharedSettings`, and applied around each objective's own function by
:func:`p3o.objectives.shared.with_shared`; a record's ``hypers`` are the function's own keywords, then those.

Adding an objective: write its policy term ``@with_shared() def fn(prep, *, hyper=default, ...) -> PolicyTerm``
in the family module it belongs to (``clipped.py``, ``p3o_family.py``, ``recent.py``) and add one
``Objective(...)`` entry to ``_RECORDS`` below; the config, ``p3o train --objective.name``, the plug-ins and
``--help`` pick it up (docs/objectives.md, "Adding an objective"). A record also takes any plain
``fn(inputs, *, hyper, ...) -> (loss, stats)`` (a plug-in's or a test's own loss).
"""

from __future__ import annotations

import difflib
import functools
import inspect
import typing
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from p3o.objectives import clipped, p3o_family, recent
from p3o.objectives.core import ROW_REJECTIONS, ObjectiveError

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
    "kl_anchor": (lambda v: v == "proximal", "prox_logp"),
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
        required: hyper-parameters with no usable default (``dro``'s ``beta``): :meth:`resolve` refuses to fill
            them in.
    """

    name: str
    fn: ObjectiveFn
    needs: frozenset[str] = frozenset()
    coupling: Literal["row", "ess-scope", "batch"] = "row"
    aliases: Mapping[str, str] = field(default_factory=dict)
    summary: str = ""
    required: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        unknown = set(self.needs) - set(INPUTS)
        assert not unknown, f"{self.name}: unknown inputs {unknown}; valid: {INPUTS}"
        assert set(self.aliases.values()) <= set(self.hypers), f"{self.name}: alias to an unknown keyword"
        assert set(self.required) <= set(self.hypers), f"{self.name}: required keyword not in the signature"

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

    def resolve(
        self,
        hyper: Mapping[str, Any] | None = None,
        *,
        where: str = "objective",
        key_prefix: str | None = None,
        check: Callable[[str, Any, Any], Any] | None = None,
        given_only: bool = False,
    ) -> dict[str, Any]:
        """The one resolver of an objective's keywords: defaults filled in, deprecated spellings renamed, checked.

        Args:
            hyper: the keywords given (any subset of :attr:`hypers`, or a deprecated spelling from ``aliases``).
            where: the place named in errors and warnings (``objective``, ``objective_kwargs``, an env variable).
            key_prefix: set by a config (e.g. ``"objective."``): keys are then named ``objective.<hyper>`` in the
                messages, config-style ("unknown key 'objective.x' for objective 'p3o' ...").
            check: ``check(key, value, type) -> value`` coerces / validates each given value against the type
                the record declares (the config passes its pydantic checker); None: values are taken as given.
            given_only: return only the given keywords (renamed and checked), not the defaults.
        Returns:
            every hyper-parameter -> value (or only the given ones with ``given_only``).
        Raises:
            ObjectiveError (one line): an unknown keyword (with the nearest valid one and the objectives that do
            accept it), a keyword given under both its old and its new spelling, or a ``required`` one missing.
        A deprecated spelling warns (DeprecationWarning) and is renamed.
        """
        hyper = dict(hyper or {})
        hypers = self.hypers

        def show(key: str) -> str:
            return f"{key_prefix}{key}" if key_prefix is not None else key

        given: dict[str, Any] = {}
        for key, value in hyper.items():
            new = self.aliases.get(key)
            if new is not None:
                if new in hyper:
                    if key_prefix is not None:
                        text = f"{show(key)}: old spelling of {show(new)}, which is also set; keep one"
                    else:
                        text = f"{where}: {key!r} and {new!r} are the same keyword of {self.name!r}"
                    raise ObjectiveError(text)
                if key_prefix is not None:
                    text = f"{show(key)} is deprecated for {self.name}; use {show(new)}"
                else:
                    text = f"{where}: {self.name} keyword {key!r} is deprecated; use {new!r}"
                warnings.warn(text, DeprecationWarning, stacklevel=3)
                key = new
            if key not in hypers:
                raise ObjectiveError(self._unknown(key, where, key_prefix))
            given[key] = value if check is None else check(show(key), value, hypers[key].type)
        if given_only:
            return given
        missing = [k for k in self.required if given.get(k) is None]
        if missing:
            raise ObjectiveError(
                f"{show(missing[0]) if key_prefix is not None else f'{where}: {missing[0]!r}'} must be set for "
                f"objective {self.name!r} (it has no default)"
            )
        return {**self.defaults(), **given}

    def _unknown(self, key: str, where: str, key_prefix: str | None) -> str:
        """One line for an unknown keyword: the nearest valid one, who accepts it, and the valid ones."""
        valid = list(self.hypers)
        near = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
        others = [rec.name for rec in OBJECTIVES.values() if key in rec.hypers]
        belongs = f"; '{key}' belongs to {', '.join(others)}" if others else ""
        if key_prefix is not None:
            hint = f" (did you mean '{key_prefix}{near[0]}'?)" if near else ""
            known = ", ".join(valid) or "none"
            text = f"unknown key '{key_prefix}{key}' for objective '{self.name}'{hint}{belongs}"
            return f"{text}; its hyper-parameters: {known}"
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        return (
            f"{where}: unknown keyword {key!r} for objective {self.name!r}{hint}{belongs}; valid: {', '.join(valid)}"
        )

    def bind(self, hyper: Mapping[str, Any] | None = None, /, **more: Any) -> BoundObjective:
        """This objective with its keywords resolved once: ``bound = rec.bind(clip_eps=0.3)``; ``bound(inputs)``.

        ``hyper`` (a mapping, e.g. already resolved) and ``more`` are merged and go through :meth:`resolve` once;
        the returned :class:`BoundObjective` calls ``fn(inputs, **hyper)`` with no per-call resolution.
        """
        full = self.resolve({**(hyper or {}), **more})
        return BoundObjective(self, full, self.inputs_needed(full))

    def coupling_for(self, hyper: Mapping[str, Any] | None = None) -> str:
        """:attr:`coupling` under ``hyper``: a row-rejecting rollout correction (``geo-rs``, ``seq-max-k2/k3``)
        makes the denominators depend on the other rows, so it is ``batch`` then."""
        full = self.resolve(hyper)
        if full.get("rollout_correction") in ROW_REJECTIONS:
            return "batch"
        return self.coupling

    def inputs_needed(self, hyper: Mapping[str, Any] | None = None) -> frozenset[str]:
        """The optional ``ObjectiveInputs`` fields this objective reads with ``hyper`` (defaults filled in)."""
        full = self.resolve(hyper)
        need = set(self.needs)
        for key, (when, what) in _CONDITIONAL.items():
            if key in full and when(full[key]):
                need.add(what)
        return frozenset(need)

    def __call__(self, inputs: Any, **hyper: Any) -> Any:
        """``fn(inputs, **hyper)`` with the keywords checked (and deprecated spellings renamed) on every call;
        :meth:`bind` resolves them once instead."""
        return self.fn(inputs, **self.resolve(hyper))


@dataclass(frozen=True)
class BoundObjective:
    """An objective with its hyper-parameters resolved once (:meth:`Objective.bind`): ``bound(inputs) -> (loss,
    stats)``, the cheap per-micro-batch call path.

    Attributes:
        record: the :class:`Objective`.
        hyper: every hyper-parameter, resolved (defaults filled in, deprecated spellings renamed).
        needs: the optional ``ObjectiveInputs`` it reads with these hyper-parameters (``record.inputs_needed``).
    """

    record: Objective
    hyper: Mapping[str, Any]
    needs: frozenset[str]

    @property
    def name(self) -> str:
        """The registry name."""
        return self.record.name

    def __call__(self, inputs: Any, **hyper: Any) -> Any:
        """``fn(inputs, **self.hyper)``; keywords here are an error (they were fixed at :meth:`Objective.bind`)."""
        if hyper:
            raise ObjectiveError(
                f"objective {self.name!r} is bound: its hyper-parameters were fixed at bind(), got {sorted(hyper)}"
            )
        return self.record.fn(inputs, **self.hyper)


_TRUNC_ALIASES = {"clip_eps_low": "trunc_eps_low", "clip_eps_high": "trunc_eps_high"}

_RECORDS = (
    Objective(
        "p3o",
        p3o_family.p3o,
        coupling="ess-scope",
        summary="ESS-capped weights + ESS-weighted KL to the behaviour policy (no clip)",
    ),
    Objective(
        "p3o_two_anchor",
        p3o_family.p3o_two_anchor,
        needs=frozenset({"prox_logp"}),
        coupling="batch",
        summary="P3O anchored on both the behaviour and the proximal policy",
    ),
    Objective("grpo", clipped.grpo, summary="PPO clip on the token ratio (GRPO)"),
    Objective("dapo", clipped.dapo, summary="decoupled clip ε_low/ε_high, token-mean (DAPO)"),
    Objective("gspo", clipped.gspo, summary="PPO clip on the sequence ratio (GSPO)"),
    Objective("cispo", clipped.cispo, aliases=_TRUNC_ALIASES, summary="truncated stop-gradient IS weights (CISPO)"),
    Objective(
        "decoupled_ppo",
        clipped.decoupled_ppo,
        needs=frozenset({"prox_logp"}),
        summary="clip against π_prox, π_prox/π_b reweighting (decoupled PPO, AReaL)",
    ),
    Objective(
        "m2po",
        p3o_family.m2po,
        needs=frozenset({"m2po_threshold"}),
        coupling="batch",
        summary="mask the largest second-moment tokens (M2PO)",
    ),
    Objective(
        "m2po_clip",
        p3o_family.m2po_clip,
        coupling="batch",
        summary="M2PO's second-moment budget as one PPO clip range per call (its public code)",
    ),
    Objective(
        "minpro",
        p3o_family.minpro,
        aliases=_TRUNC_ALIASES,
        summary="token ratio × the minimum earlier ratio, truncated (MinPRO)",
    ),
)

_RECORDS += (
    Objective("gmpo", recent.gmpo, summary="geometric mean of sign-clipped token ratios per sequence (GMPO)"),
    Objective("sapo", recent.sapo, summary="sigmoid soft gate on the token ratio instead of a clip (SAPO)"),
    Objective(
        "dppo",
        recent.dppo,
        summary="probability-difference mask + squared log-ratio term (DPPO-Binary-TV, prime-rl default)",
    ),
    Objective("topr", recent.topr, summary="REINFORCE, negatives tapered by the truncated sequence ratio (TOPR)"),
    Objective(
        "dro",
        recent.dro,
        required=("beta",),
        summary="REINFORCE − ½β·lr² (DRO / Kimi-1.5, token level; beta required)",
    ),
    Objective("gpg", recent.gpg, summary="plain REINFORCE −A·logp, no ratio (GPG)"),
    Objective(
        "kl_cov",
        recent.kl_cov,
        coupling="batch",
        summary="−A·ρ plus β·|lr| on the top-covariance tokens (KL-Cov)",
    ),
    Objective(
        "clip_cov",
        recent.clip_cov,
        coupling="batch",
        summary="PPO clip; random tokens in a covariance band lose their gradient (Clip-Cov)",
    ),
)

OBJECTIVES: dict[str, Objective] = {rec.name: rec for rec in _RECORDS}
"""name -> :class:`Objective` record; a record is callable as ``rec(inputs, **hyper) -> (loss, stats)``."""


def get_objective(name: str) -> Objective:
    """The objective registered as ``name``; an unknown name raises ObjectiveError (a ValueError) naming the nearest
    one and listing them."""
    try:
        return OBJECTIVES[name]
    except KeyError:
        near = difflib.get_close_matches(str(name), list(OBJECTIVES), n=1)
        hint = f" (did you mean '{near[0]}'?)" if near else ""
        known = ", ".join(OBJECTIVES)
        raise ObjectiveError(f"objective.name: unknown objective '{name}'{hint}; known: {known}") from None


def objective_defaults(name: str) -> dict[str, Any]:
    """Keyword-only hyper-parameters of objective ``name`` and their defaults."""
    return get_objective(name).defaults()
