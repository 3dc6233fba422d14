"""The objective's section of the config and its keywords: its registry record (:mod:`p3o.objectives`) is the one
resolver.

``objective.<hyper>`` keys (``--objective.clip_eps 0.4``) are collected in :class:`ObjectiveConfig` ``.hyper`` and
typed by the objective's record (``p3o.objectives.OBJECTIVES[name]``), whose ``resolve`` fills in the defaults
(`objective_hyper`). So that ``p3o train --help`` and a mistyped key answer before torch loads, the records'
keywords and ``--help`` rows are also read from snapshots packaged in p3o/configs (`objective_keys`,
`objective_rows`), which a test holds equal to the registry; ``python -m p3o.config --objective-keys`` and
``--objectives`` regenerate them.
"""

from __future__ import annotations

import ast
import difflib
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from p3o import options
from p3o.errors import ConfigError
from p3o.options import config_field, metavar, shown

_f = config_field
#: The folder of the packaged snapshots (p3o/configs).
_SNAPSHOTS = Path(__file__).parent.parent / "configs"


@dataclass
class ObjectiveConfig:
    """The objective ``p3o.objectives.get_objective(name)`` and its keyword hyper-parameters.

    On the command line and in YAML the hyper-parameters are flat: ``--objective.clip_eps 0.4`` or
    ``objective: {name: grpo, clip_eps: 0.4}``; they are stored in ``hyper`` and passed as ``fn(inputs, **hyper)``
    (unset ones keep the objective's own defaults).
    """

    name: str = _f("p3o", "objective name (see p3o.objectives.OBJECTIVES)")
    hyper: dict[str, Any] = field(
        default_factory=dict,
        metadata={"help": "a keyword hyper-parameter of the chosen objective (below)", "extra": True},
    )


def objective_hyper(cfg: ObjectiveConfig) -> dict[str, Any]:
    """Every keyword hyper-parameter of the objective: ``cfg.hyper`` over its defaults (the record's ``resolve``)."""
    from p3o.objectives import get_objective  # heavy: torch, not needed by --help

    return get_objective(cfg.name).resolve(cfg.hyper, key_prefix="objective.")


def _check_objective(cfg: ObjectiveConfig) -> None:
    """Type ``cfg.hyper`` by the record's declared types (pydantic) and keep it under the current spellings.

    The record's ``resolve`` is the one resolver: unknown keywords (one line with the nearest one and the objectives
    it belongs to), deprecated spellings (renamed with a warning) and both spellings at once (refused).
    """
    _check_objective_keys(cfg)  # an option error answers before the registry's torch import
    from p3o.objectives import get_objective  # heavy: torch, not needed by --help

    rec = get_objective(cfg.name)
    cfg.hyper = rec.resolve(cfg.hyper, key_prefix="objective.", check=options.check_value, given_only=True)


#: The objectives' keywords, snapshot from the registry: {name: {"hypers": {keyword: its type, written as
#: `type_text` writes it}, "aliases": {deprecated spelling: keyword}}} (package data: reading it imports no torch).
OBJECTIVE_KEYS = "objectives-keys.json"
_TYPE_NAMES: dict[str, Any] = {"Any": Any, "None": type(None), "bool": bool, "int": int, "float": float, "str": str}


def type_text(tp: Any) -> str:
    """A keyword's type as text that `parse_type` reads back: ``float | None``, ``Literal['k3', 'k2']``."""
    args = typing.get_args(tp)
    if typing.get_origin(tp) is Literal:
        text = f"Literal[{', '.join(repr(a) for a in args)}]"
    elif typing.get_origin(tp) in (typing.Union, types.UnionType):
        text = " | ".join(type_text(a) for a in args)
    else:
        text = next((name for name, known in _TYPE_NAMES.items() if known is tp), repr(tp))
    if parse_type(text) != tp:
        raise TypeError(f"objective keyword type {tp!r}: not one p3o.config.parse_type reads back")
    return text


def parse_type(text: str) -> Any:
    """The type `type_text` wrote: names of `_TYPE_NAMES`, ``Literal[...]`` of Python literals, joined by ``|``."""
    out: Any = None
    for part in text.split(" | "):
        if part.startswith("Literal[") and part.endswith("]"):
            tp: Any = Literal[ast.literal_eval(f"({part[len('Literal[') : -1]},)")]
        elif part in _TYPE_NAMES:
            tp = _TYPE_NAMES[part]
        else:
            return None  # not a type type_text writes
        out = tp if out is None else out | tp
    return out


def objective_keys(*, fresh: bool = False) -> dict[str, dict[str, dict[str, str]]]:
    """Each objective's keywords and deprecated spellings (`OBJECTIVE_KEYS`), from the packaged snapshot
    p3o/configs/objectives-keys.json or (``fresh``, or no snapshot) from the registry, which imports torch. A test
    keeps the snapshot equal to the registry; regenerate it with
    ``python -m p3o.config --objective-keys > src/p3o/configs/objectives-keys.json``."""
    if not fresh:
        snap = _SNAPSHOTS / OBJECTIVE_KEYS
        if snap.is_file():
            return dict(json.loads(snap.read_text(encoding="utf-8")))
    from p3o.objectives import OBJECTIVES  # heavy: torch

    return {
        name: {"hypers": {h.name: type_text(h.type) for h in rec.hypers.values()}, "aliases": dict(rec.aliases)}
        for name, rec in OBJECTIVES.items()
    }


def _check_objective_keys(cfg: ObjectiveConfig) -> None:
    """The registry's errors for the objective's name and keywords (`Objective.resolve`: an unknown name or
    keyword, both spellings of one, a value of the wrong type), read from the `objective_keys` snapshot: one line
    before torch loads. A test holds each message equal to the registry's."""
    table = objective_keys()
    if cfg.name not in table:
        near = difflib.get_close_matches(str(cfg.name), list(table), n=1)
        hint = f" (did you mean '{near[0]}'?)" if near else ""
        raise ConfigError(f"objective.name: unknown objective '{cfg.name}'{hint}; known: {', '.join(table)}")
    hypers, aliases = table[cfg.name]["hypers"], table[cfg.name]["aliases"]
    for key, value in cfg.hyper.items():
        new = aliases.get(key)
        if new is not None:
            if new in cfg.hyper:
                raise ConfigError(f"objective.{key}: old spelling of objective.{new}, which is also set; keep one")
            key = new
        if key not in hypers:
            near = difflib.get_close_matches(key, list(hypers), n=1, cutoff=0.6)
            others = [name for name, rec in table.items() if key in rec["hypers"]]
            belongs = f"; '{key}' belongs to {', '.join(others)}" if others else ""
            hint = f" (did you mean 'objective.{near[0]}'?)" if near else ""
            raise ConfigError(
                f"unknown key 'objective.{key}' for objective '{cfg.name}'{hint}{belongs}; its hyper-parameters: "
                + (", ".join(hypers) or "none")
            )
        options.check_value(f"objective.{key}", value, parse_type(hypers[key]))


#: The objectives' rows of ``p3o train --help``, snapshot from the registry (package data: reading it imports no torch)
OBJECTIVE_ROWS = "objectives-help.json"


def objective_rows(*, fresh: bool = False) -> list[Any]:
    """The objectives and their typed ``objective.<hyper>`` keys as ``--help`` rows (a heading string or an
    (option, help) pair), from the packaged snapshot p3o/configs/objectives-help.json, or from the registry
    (``fresh``, or no snapshot; the registry imports torch). A test keeps the snapshot equal to the registry;
    regenerate it with ``python -m p3o.config --objectives > src/p3o/configs/objectives-help.json``.
    """
    if not fresh:
        snap = _SNAPSHOTS / OBJECTIVE_ROWS
        if snap.is_file():
            return [r if isinstance(r, str) else tuple(r) for r in json.loads(snap.read_text(encoding="utf-8"))]
    from p3o.objectives import OBJECTIVES  # heavy: torch, not needed by --help

    records = list(OBJECTIVES.values())
    common = set.intersection(*(set(r.hypers) for r in records))
    tail: list[Any] = []
    for i, rec in enumerate(records):
        tail.append(f"objective.name {rec.name}: {rec.summary}")
        for h in rec.hypers.values():
            if h.name not in common or i == len(records) - 1:
                tail.append((f"--objective.{h.name} {metavar(h.type)}", f"[default: {shown(h.default)}]"))
    tail.append(f"(every objective also takes {', '.join(sorted(common))}; defaults as for {records[-1].name})")
    return tail
