"""`--resume` continues a run with the run's own settings: what the command line may change, and the record of it.

    cfg, changes = resume_config(argv, given, allow_changes=False)   # the run's config; refuses experiment changes
    record_changes(run_dir, step, changes, allowed=False)           # one line of run_dir/config_history.jsonl

A run's settings are ``run_dir/config.yaml`` (its first config, never rewritten by a resume) with every line of
``run_dir/config_history.jsonl`` applied in order. Only the keys the command line sets (:func:`p3o.options.given_keys`;
a ``--config`` naming the run's own config.yaml sets none) are compared with them:

* operational keys (``log.*``, ``ckpt.*``, ``ray.*``, ``rollout.workers``, ``rollout.colocate``,
  ``model.cache_dir``, ``train.strategy``, ``train.cpu_offload``) may change; each change is printed and recorded
  (the world size is torchrun's, never a key: a run resumes at any world size);
* ``steps`` may change where the learning-rate schedule does not depend on it (``optim.schedule constant``); under
  ``cosine`` every later learning rate would change, so it is an experiment change;
* every other key changes the experiment (model, task, rollout, trainer, update, optim, loop, advantage,
  objective, seed): refused with one line listing each difference (``loop.max_lag: 4 in the run, 2 given``), unless
  ``allow_changes``, which applies and records them.

A history line: ``{"step": 4, "time": "2026-12-01T15:04:20Z", "allowed": false, "changes": {"ckpt.every":
[2, 5]}}`` (the run's value, the new one; ``step``: the checkpoint the resumed run continued from).
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import Any

from p3o import options
from p3o.config import TrainConfig, load_config, to_dict
from p3o.errors import ConfigError

__all__ = [
    "CONFIG_FILE",
    "HISTORY_FILE",
    "change_kind",
    "describe_changes",
    "read_history",
    "record_changes",
    "resume_config",
    "run_config",
]

CONFIG_FILE = "config.yaml"
HISTORY_FILE = "config_history.jsonl"

# keys that never belong to the comparison: where the run is and what this invocation does with it
_ACTIONS = {"run_dir", "overwrite", "ckpt.resume"}
_OPERATIONAL_SECTIONS = ("log.", "ckpt.", "ray.")
# where the trainer runs: the world size is not a key at all, and the strategy (ddp / fsdp) places the same computation
_OPERATIONAL_KEYS = {"rollout.workers", "rollout.colocate", "model.cache_dir", "train.strategy", "train.cpu_offload"}


def change_kind(key: str, run_cfg: Any) -> str:
    """A dotted key's kind: "operational" (may change on resume, recorded) or "experiment" (``--allow-changes``).

    ``steps`` is operational under a constant learning-rate schedule, an experiment key under cosine (the schedule's
    horizon is ``steps``).
    """
    if key == "steps":
        return "operational" if run_cfg.optim.schedule == "constant" else "experiment"
    if key in _OPERATIONAL_KEYS or key.startswith(_OPERATIONAL_SECTIONS):
        return "operational"
    return "experiment"


def _flat(cfg: Any) -> dict[str, Any]:
    """Dotted key -> value of a TrainConfig (objective hyper-parameters resolved, lists as leaves)."""
    return dict(options._flatten(to_dict(cfg, resolve_objective=True)))


def read_history(run_dir: str | Path) -> list[dict[str, Any]]:
    """The lines of ``run_dir/config_history.jsonl`` (oldest first; [] without the file). A line that is not a
    JSON object with a ``changes`` mapping raises ConfigError naming the file and line."""
    path = Path(run_dir) / HISTORY_FILE
    if not path.is_file():
        return []
    out = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            entry = None
        if not isinstance(entry, dict) or not isinstance(entry.get("changes"), dict):
            raise ConfigError(f"{path}: line {i} is not a config change record")
        out.append(entry)
    return out


def _apply(cfg: Any, changes: dict[str, Any]) -> Any:
    """``cfg`` with ``changes`` (dotted key -> new value) applied and validated. A new objective name starts from
    that objective's defaults (the old one's hyper-parameters may not exist for it) plus the ``objective.*`` keys
    among the changes."""
    new = copy.deepcopy(cfg)
    if "objective.name" in changes:
        new.objective.hyper = {}
    return options.apply_overrides(new, changes)


def run_config(run_dir: str | Path) -> Any | None:
    """The run's current settings: its ``config.yaml`` with the history applied; None without a config.yaml."""
    path = Path(run_dir) / CONFIG_FILE
    if not path.is_file():
        return None
    cfg = load_config(["--config", str(path)])
    for entry in read_history(run_dir):
        cfg = _apply(cfg, {k: v[1] for k, v in entry["changes"].items()})
    return cfg


def _shown(value: Any) -> str:
    return options.shown(tuple(value) if isinstance(value, list) else value)


def resume_config(argv: list[str], given: Any, *, allow_changes: bool = False) -> tuple[Any, dict[str, list[Any]]]:
    """(the config a resumed run continues with, {key: [the run's value, the new one]} of what changes).

    ``argv``: the command line (``p3o train`` options); ``given``: ``load_config(argv)``. Without a config.yaml in
    the run directory the given config is used as it is (nothing to compare with). Experiment changes raise one
    ConfigError line naming each, unless ``allow_changes``.
    """
    run_dir = Path(given.run_dir)
    run_cfg = run_config(run_dir)
    if run_cfg is None:
        return given, {}
    keys = options.given_keys(argv, TrainConfig, skip_files=[run_dir / CONFIG_FILE])
    old, new = _flat(run_cfg), _flat(given)
    changes = {k: [old.get(k), new[k]] for k in keys if k not in _ACTIONS and k in new and old.get(k) != new[k]}
    if "objective.name" in changes:  # a new objective keeps every hyper-parameter given for it, equal or not
        changes.update({k: [old.get(k), new[k]] for k in keys if k.startswith("objective.") and k in new})
    refused = {k: v for k, v in changes.items() if change_kind(k, run_cfg) == "experiment"}
    if refused and not allow_changes:
        listed = "; ".join(f"{k}: {_shown(a)} in the run, {_shown(b)} given" for k, a, b in _rows(refused))
        why = " (under optim.schedule cosine every later learning rate depends on steps)" if "steps" in refused else ""
        raise ConfigError(
            f"--resume continues {run_dir} with the run's own settings, and these would change the experiment: "
            f"{listed}{why}; drop them, or pass --allow-changes to change the run and record it in {HISTORY_FILE}"
        )
    cfg = _apply(run_cfg, {k: v[1] for k, v in changes.items()})
    # where the run is now and what this invocation does come from the command line (_ACTIONS)
    cfg.run_dir, cfg.overwrite, cfg.ckpt.resume = given.run_dir, given.overwrite, given.ckpt.resume
    return options.validate(cfg), changes


def _rows(changes: dict[str, list[Any]]) -> list[tuple[str, Any, Any]]:
    return [(k, a, b) for k, (a, b) in changes.items()]


def describe_changes(changes: dict[str, list[Any]]) -> str:
    """``ckpt.every 2 -> 5, log.every 1 -> 2`` (for the console line)."""
    return ", ".join(f"{k} {_shown(a)} -> {_shown(b)}" for k, a, b in _rows(changes))


def record_changes(run_dir: str | Path, step: int, changes: dict[str, list[Any]], *, allowed: bool) -> Path:
    """Append one line to ``run_dir/config_history.jsonl``: the changes and the step they took effect at."""
    path = Path(run_dir) / HISTORY_FILE
    entry = {
        "step": int(step),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "allowed": bool(allowed),
        "changes": changes,
    }
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(entry) + "\n")
    return path
