"""The settings every objective shares, declared once, and the wrapper that applies them around an objective.

An objective's own function computes only its policy term from the prepared micro-batch and takes only its own
hyper-parameters; :func:`with_shared` turns it into the loss function the registry records::

    @with_shared(agg="seq-mean-token-mean")          # this objective's default aggregation
    def grpo(prep: Prepared, *, clip_eps: float = 0.2) -> PolicyTerm: ...

    grpo(inputs, clip_eps=0.3, rollout_correction="token-tis", ref_kl_coef=0.01)   # -> (loss, stats)

Around the term, the wrapper applies the :class:`SharedSettings` (N sequences, T tokens):

    prep = prepare(inputs, Correction(rollout_correction, rollout_correction_cap, rollout_correction_low))
    ℓ^policy, stats = term(prep, **own)                               (N, T); prep.inputs is the raw batch
    ℓ_t = w^rc_t · u_t · ℓ^policy_t + η · k3(π_θ ‖ π_ref)_t − β · H_t   (η = ref_kl_coef, β = entropy_coef)
    loss = agg(ℓ)                                                    0-d

(:func:`p3o.objectives.core.prepare` and :func:`p3o.objectives.core.finish`). The wrapped function's signature
is ``(inputs, *, <own hyper-parameters>, <shared settings>)``, in that order, so the registry record reads every
keyword, its type and its default from it.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from p3o.objectives.core import Agg, Correction, ObjectiveInputs, PolicyTerm, RolloutCorrection, finish, prepare

Stats = dict[str, torch.Tensor]


@dataclass(frozen=True)
class SharedSettings:
    """The keywords every objective takes, with their defaults (``agg``'s default is set per objective).

    Attributes:
        agg: the token aggregation (:func:`p3o.objectives.core.reduce_tokens`).
        ref_kl_coef: η of the k3 KL to the frozen reference policy (needs ``inputs.ref_logp`` when != 0).
        entropy_coef: β of the entropy bonus −β·H_t (needs ``inputs.entropy`` when != 0).
        rollout_correction: the engine-mismatch correction (:func:`p3o.objectives.core.rollout_correction_weights`);
            any value but ``none`` anchors the objective's ratio at π_θold (``inputs.old_logp``).
        rollout_correction_cap: its C; rollout_correction_low: its L.
    """

    agg: Agg = "token-mean"
    ref_kl_coef: float = 0.0
    entropy_coef: float = 0.0
    rollout_correction: RolloutCorrection = "none"
    rollout_correction_cap: float = 2.0
    rollout_correction_low: float = 0.5

    @property
    def correction(self) -> Correction:
        """The rollout correction these settings select (applied by :func:`p3o.objectives.core.prepare`)."""
        return Correction(self.rollout_correction, self.rollout_correction_cap, self.rollout_correction_low)


SHARED: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(SharedSettings))
"""The shared keywords, in the order every objective's signature lists them (after its own)."""


TermFn = Callable[..., PolicyTerm]
"""``term(prep, *, own hyper-parameters) -> PolicyTerm`` (``prep.inputs``: the raw micro-batch)."""
ObjectiveFn = Callable[..., tuple[torch.Tensor, Stats]]
"""``fn(inputs, *, own hyper-parameters, shared settings) -> (loss, stats)``."""


def with_shared(*, agg: Agg = "token-mean") -> Callable[[TermFn], ObjectiveFn]:
    """Decorator: the objective ``fn(inputs, **own, **shared) -> (loss, stats)`` around the policy term ``term``.

    ``agg`` is this objective's default aggregation; the other shared defaults are those of
    :class:`SharedSettings`. The term's keyword-only parameters are its own hyper-parameters; it must not declare
    a shared one. The returned function keeps the term's name and docstring, has the full signature (own keywords,
    then :data:`SHARED`) and its resolved annotations, and exposes ``.term`` and ``.shared_defaults``.
    """
    defaults = SharedSettings(agg=agg)

    def wrap(term: TermFn) -> ObjectiveFn:
        params = list(inspect.signature(term).parameters.values())
        own = [p for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY]
        clash = {p.name for p in own} & set(SHARED)
        assert not clash, f"{term.__name__}: {sorted(clash)} are shared settings, applied by with_shared"
        hints = typing.get_type_hints(term)
        shared_hints = typing.get_type_hints(SharedSettings)

        @functools.wraps(term)
        def objective(inputs: ObjectiveInputs, **hyper: Any) -> tuple[torch.Tensor, Stats]:
            s = dataclasses.replace(defaults, **{k: hyper.pop(k) for k in SHARED if k in hyper})
            prep = prepare(inputs, s.correction)
            return finish(term(prep, **hyper), prep, agg=s.agg, ref_kl_coef=s.ref_kl_coef, entropy_coef=s.entropy_coef)

        keyword = inspect.Parameter.KEYWORD_ONLY
        shared = [
            inspect.Parameter(k, keyword, default=getattr(defaults, k), annotation=shared_hints[k]) for k in SHARED
        ]
        first = inspect.Parameter("inputs", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=ObjectiveInputs)
        own_typed = [p.replace(annotation=hints.get(p.name, Any)) for p in own]
        objective.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [first, *own_typed, *shared], return_annotation=tuple[torch.Tensor, Stats]
        )
        objective.__annotations__ = {
            "inputs": ObjectiveInputs,
            **{p.name: p.annotation for p in own_typed},
            **{k: shared_hints[k] for k in SHARED},
            "return": tuple[torch.Tensor, Stats],
        }
        objective.term = term  # type: ignore[attr-defined]
        objective.shared_defaults = defaults  # type: ignore[attr-defined]
        return objective

    return wrap


__all__ = ["SHARED", "ObjectiveFn", "SharedSettings", "Stats", "TermFn", "with_shared"]
