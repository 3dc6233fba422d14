"""Pieces shared by the framework plug-ins: the objective record with the user's hyper-parameters checked against
it, the check that a framework can supply the inputs the record needs, the data-parallel group for the ESS
all-reduce, and one-sync conversion of an objective's stats to Python floats.

    obj = resolve_objective("minpro", {"trunc_eps_high": 2.0}, where="objective_kwargs")
    require_inputs(obj, supplied={"prox_logp"}, framework="verl", where="objective_kwargs")
    loss, stats = obj.rec(inputs, **obj.hyper)

Everything an objective *is* — its function, hyper-parameters, defaults, deprecated spellings and the optional
inputs it reads — comes from its record (``p3o.objectives.get_objective``); the plug-ins hold no list of keywords
or objective names of their own.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from p3o.errors import ConfigError
from p3o.objectives import Objective, get_objective

PER_MICRO_BATCH_INPUTS = frozenset({"m2po_threshold"})
"""Optional inputs an objective computes on the micro-batch itself when they are None (``ObjectiveInputs``): a
plug-in, called once per micro-batch, supplies none of them, so there the statistic is the micro-batch's."""


@dataclass(frozen=True)
class PluginObjective:
    """An objective record and the hyper-parameters a plug-in's user set, checked against it.

    Attributes:
        rec: the record (``rec(inputs, **hyper) -> (loss, stats)``).
        hyper: every hyper-parameter, defaults filled in (``rec.resolve(given)``).
        given: only the keywords the user set, deprecated spellings renamed to the current ones.
    """

    rec: Objective
    hyper: dict[str, Any]
    given: dict[str, Any]

    @property
    def name(self) -> str:
        """The objective's registry name."""
        return self.rec.name

    def with_hyper(self, extra: Mapping[str, Any], *, where: str) -> PluginObjective:
        """This objective with ``extra`` keywords (checked against the record as ``where``) over the given ones."""
        more = resolve_objective(self.rec.name, extra, where=where)
        return PluginObjective(self.rec, self.rec.resolve({**self.given, **more.given}), {**self.given, **more.given})


def resolve_objective(
    name: str, kwargs: Mapping[str, Any] | None, *, where: str = "objective_kwargs"
) -> PluginObjective:
    """The record of objective ``name`` and the user's hyper-parameters ``kwargs`` checked by it.

    Raises ``ObjectiveError`` (a ConfigError, one line) for an unknown objective (listing the known ones) or an
    unknown keyword (naming ``where``, the option the user set, and the valid keywords). A deprecated spelling
    (e.g. minpro's ``clip_eps_high`` for ``trunc_eps_high``) is renamed with a DeprecationWarning.
    """
    rec = get_objective(name)
    given_raw = dict(kwargs or {})
    hyper = rec.resolve(given_raw, where=where)
    given = {rec.aliases.get(k, k): hyper[rec.aliases.get(k, k)] for k in given_raw}
    return PluginObjective(rec, hyper, given)


def require_inputs(
    obj: PluginObjective,
    *,
    supplied: Collection[str],
    framework: str,
    where: str,
    hints: Mapping[str, str] | None = None,
) -> None:
    """Raise ConfigError (one line) when the record needs an optional input the framework cannot supply.

    needed = ``obj.rec.inputs_needed(obj.hyper)`` minus ``supplied`` minus :data:`PER_MICRO_BATCH_INPUTS`;
    ``where`` names the option the user set; ``hints`` maps an input to what the user should do instead (e.g.
    ``ref_logp`` -> "set GRPOConfig.beta").
    """
    missing = sorted(obj.rec.inputs_needed(obj.hyper) - set(supplied) - PER_MICRO_BATCH_INPUTS)
    if missing:
        first = missing[0]
        hint = (hints or {}).get(first, f"{framework} does not hand it to a loss")
        raise ConfigError(
            f"{where}: objective {obj.name!r} with {obj.given or 'its defaults'} needs ObjectiveInputs.{first}: {hint}"
        )


def clip_statistic(values: Mapping[str, float]) -> float:
    """The one number a framework's "clip fraction" column shows for any objective.

    ``clipfrac`` (share of valid tokens where a PPO clip zeroes the gradient: grpo, dapo, gspo, decoupled_ppo) when
    the objective reports it, else ``band_frac`` (share of valid tokens with |ρ − 1| > 0.2, reported by every
    objective), else 0.
    """
    if "clipfrac" in values:
        return float(values["clipfrac"])
    return float(values.get("band_frac", 0.0))


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
