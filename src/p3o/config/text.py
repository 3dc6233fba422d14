"""The config as text, with :class:`~p3o.config.schema.TrainConfig` as the default root of :mod:`p3o.options`:
reading a command line, YAML files and presets into a validated config, writing it back as YAML, the default
preset, and ``--help``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from p3o import options
from p3o.config.objective import objective_hyper, objective_rows
from p3o.config.schema import TrainConfig
from p3o.options import list_presets


def _leaf_fields(cls: type = TrainConfig) -> list[tuple[str, Any, Any]]:
    """(dotted key, field, type) of every leaf field of ``cls``."""
    return options.leaf_fields(cls)


def load_config(argv: list[str] | None = None, *, base: Any = None, cls: type | None = None) -> Any:
    """Parse ``--config PATH_OR_PRESET``, dotted overrides and ``--resume`` into a validated config.

    The one command-line mechanism of ``p3o train`` (root ``TrainConfig``), ``p3o sft`` (``SFTConfig``) and
    ``p3o compare`` (its options): ``cls`` is the root dataclass (default: ``type(base)``, else TrainConfig).
    ``argv`` None or [] gives ``base`` (default: ``cls()``, the embedded defaults); forms and order:
    :func:`p3o.options.load_config`.
    """
    return options.load_config(argv, cls or (type(base) if base is not None else TrainConfig), base=base)


def from_dict(d: Mapping[str, Any], *, base: Any = None, source: str | None = None, cls: type | None = None) -> Any:
    """A validated config of root ``cls`` (default: ``type(base)``, else TrainConfig) from a (nested or dotted)
    dict laid over ``base`` (default: ``cls()``). ``source`` (a file name, or ``file: section``) prefixes errors."""
    return options.from_dict(d, cls or (type(base) if base is not None else TrainConfig), base=base, source=source)


def to_dict(cfg: Any, *, resolve_objective: bool = False) -> dict[str, Any]:
    """Plain nested dict of ``cfg`` (tuples as lists; objective hyper-parameters flat next to ``name``).

    ``resolve_objective=True`` writes every hyper-parameter of the objective, its defaults filled in.
    """
    out = options.to_dict(cfg)
    if resolve_objective:
        out["objective"] = options.to_dict({"name": cfg.objective.name, **objective_hyper(cfg.objective)})
    return out


def save_config(cfg: TrainConfig, path: str | Path, *, resolve_objective: bool = True) -> Path:
    """Write ``cfg`` as YAML (the resolved config of a run); returns the path.

    The file reloads with ``load_config(["--config", path])`` to an equal config.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "# resolved p3o config; rerun with: p3o train --config " + str(path) + "\n"
    text += yaml.safe_dump(
        to_dict(cfg, resolve_objective=resolve_objective), sort_keys=False, default_flow_style=False
    )
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return path


def config_help(cls: type | None = None, extra: Sequence[tuple[str, str]] | None = None) -> str:
    """Every option of root ``cls`` (default TrainConfig) grouped by section, with its type, default and help.

    The ``--help`` of ``p3o train``, ``p3o sft`` and ``p3o compare``; ``extra`` adds (option, help) rows that are
    not config fields (``p3o sft --out``). For TrainConfig the objectives and their typed ``objective.<hyper>``
    keys are listed from the registry records.
    """
    if cls not in (None, TrainConfig):
        default_row = ("--config PATH", "YAML file of these keys (applied before the command-line options)")
        return options.config_help(cls, [default_row, *(extra or [])])
    general = [
        ("--config PATH_OR_PRESET", "YAML file or preset: " + ", ".join(list_presets())),
        ("--resume", "continue the run in run_dir from its newest intact checkpoint, with the run's own settings"),
        ("--allow-changes", "with --resume: let given values change the experiment (in config_history.jsonl)"),
        *(extra or []),
    ]
    tail = objective_rows()
    return options.config_help(TrainConfig, general, tail)


def default_preset_text() -> str:
    """The text of the preset p3o/configs/default.yaml: every key of the embedded defaults under the preset header.

    Regenerate it after changing a default: ``python -m p3o.config > src/p3o/configs/default.yaml``
    """
    header = (
        "# p3o train --config default\n"
        "# The embedded default job (= `p3o train` with no arguments): P3O on the built-in arithmetic task with the\n"
        "# built-in tiny model. Every key is listed; a preset only needs the keys it changes.\n"
        "# Off-policy source: lag (loop.mode async, max_lag 2: a batch is up to 2 policy versions old).\n"
    )
    return header + yaml.safe_dump(to_dict(TrainConfig()), sort_keys=False, default_flow_style=False)
