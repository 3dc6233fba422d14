"""Run configuration: the schema of a training run, one dataclass per component.

The root :class:`TrainConfig` holds one sub-config per component (each component receives only its own
sub-config). Every field is a :func:`config_field`: its help text for ``--help`` and its bounds, which pydantic
checks with the field's type. Reading text into it (dotted command-line overrides, YAML files and presets, nearest-
name errors) is :mod:`p3o.options`; the functions below are those with ``TrainConfig`` as the default root.

    cfg = load_config(["--config", "quick", "--optim.lr", "3e-4", "--objective.name=grpo", "--objective.clip_eps=0.4"])

``objective.<hyper>`` keys (``--objective.clip_eps 0.4``) are collected in ``ObjectiveConfig.hyper`` and typed by
the objective's registry record (``p3o.objectives.OBJECTIVES[name]``), whose ``resolve`` fills in the defaults.

Where each part lives (every name is imported from here, ``from p3o.config import X``):

- `p3o.config.schema`: the schema, one dataclass per component (``ModelConfig`` ... ``RayConfig``, then
  ``AgentConfig``) and the root ``TrainConfig`` with the checks between sections;
- `p3o.config.objective`: the objective's section ``ObjectiveConfig`` and its keywords, from its registry record or
  the packaged snapshots;
- `p3o.config.text`: the config as text: command lines, YAML files and presets in, YAML out, ``--help``;
- ``python -m p3o.config`` (`p3o.config.__main__`): regenerates the default preset and the snapshots.
"""

from __future__ import annotations

from p3o.config.objective import OBJECTIVE_KEYS as OBJECTIVE_KEYS
from p3o.config.objective import OBJECTIVE_ROWS as OBJECTIVE_ROWS
from p3o.config.objective import (
    ObjectiveConfig,
    objective_hyper,
    objective_keys,
    objective_rows,
    parse_type,
    type_text,
)
from p3o.config.objective import _check_objective as _check_objective
from p3o.config.objective import _check_objective_keys as _check_objective_keys
from p3o.config.schema import (
    AdvantageConfig,
    AgentConfig,
    CkptConfig,
    LogConfig,
    LoopConfig,
    LoraConfig,
    ModelConfig,
    OptimConfig,
    RayConfig,
    RolloutConfig,
    TaskConfig,
    TaskMixture,
    TrainConfig,
    TrainerConfig,
    UpdateConfig,
    parse_mixture,
)
from p3o.config.text import _leaf_fields as _leaf_fields
from p3o.config.text import config_help, default_preset_text, from_dict, load_config, save_config, to_dict
from p3o.options import apply_overrides, config_field, list_presets, preset_path, validate

__all__ = [
    "AdvantageConfig",
    "AgentConfig",
    "CkptConfig",
    "LogConfig",
    "LoopConfig",
    "LoraConfig",
    "ModelConfig",
    "ObjectiveConfig",
    "OptimConfig",
    "RayConfig",
    "RolloutConfig",
    "TaskConfig",
    "TaskMixture",
    "TrainConfig",
    "TrainerConfig",
    "UpdateConfig",
    "apply_overrides",
    "config_field",
    "config_help",
    "default_preset_text",
    "from_dict",
    "list_presets",
    "load_config",
    "objective_hyper",
    "objective_keys",
    "objective_rows",
    "parse_mixture",
    "parse_type",
    "preset_path",
    "save_config",
    "to_dict",
    "type_text",
    "validate",
]
