"""Which rows train and which evaluate: a `TaskConfig` (or any object with its fields) -> lists of `Problem`.

    train = load_train_problems(cfg.task, seed=cfg.seed, n=cfg.task.n_train)
    held_out = load_eval_problems(cfg.task, seed=cfg.seed, n=cfg.task.n_eval, train=train)

Rules (docs/tasks.md, "Your own data"):

* `task.name` a single file (or a saved Dataset without splits): training takes the rows whose question is not
  held out, evaluation the held-out rows (`p3o.tasks.loaders.in_test_split`, share `task.test_fraction`).
* `task.name` a folder with `train.jsonl` / `test.jsonl` (or a DatasetDict, or a preset's default location):
  training reads the "train" split, evaluation `task.eval_split`.
* `task.eval_name` set: evaluation reads that file / folder / preset instead; a single file is used whole.
* Evaluation problems whose question also occurs in the training rows are dropped with a warning, unless
  `task.allow_train_eval_overlap` (then a single file is not split at all, and a warning says so).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from p3o.errors import ConfigError
from p3o.tasks.base import Problem
from p3o.tasks.loaders import (
    DEFAULT_TEST_FRACTION,
    default_verifier,
    holdout_key,
    is_single_source,
    load_task,
    resolve_source,
)

BUILTIN = "arithmetic"


def _opt(task: Any, name: str, default: Any = None) -> Any:
    return getattr(task, name, default)


def warn(message: str) -> None:
    """One warning line on stderr (the CLI's convention: `p3o: warning: ...`)."""
    print(f"p3o: warning: {message}", file=sys.stderr, flush=True)


def field_mapping(task: Any) -> dict[str, str]:
    """{"prompt"|"answer"|"solution": column} from `task.question_key`, `task.answer_key`, `task.solution_key`."""
    keys = {"prompt": "question_key", "answer": "answer_key", "solution": "solution_key"}
    return {field: str(_opt(task, key)) for field, key in keys.items() if _opt(task, key)}


def task_options(task: Any, name: str) -> dict[str, Any]:
    """Keyword arguments of `p3o.tasks.load_task(name, ...)` implied by `task` (difficulty, fields, test_fraction).

    The field mapping applies to data files only (the built-in task is generated).
    """
    if name == BUILTIN:
        return {"difficulty": _opt(task, "difficulty", 2)}
    opts: dict[str, Any] = {"test_fraction": float(_opt(task, "test_fraction", DEFAULT_TEST_FRACTION))}
    fields = field_mapping(task)
    if fields:
        opts["fields"] = fields
    return opts


def task_verifier(task: Any, problems: Sequence[Problem] = ()) -> str:
    """The verifier name that scores `task` (a TaskConfig): `task.verifier` when set, else the task's own
    (`p3o.tasks.default_verifier(task.name, problems)`)."""
    return _opt(task, "verifier") or default_verifier(task.name, problems)


def _single(name: str) -> bool:
    """Is the task `name` a single data source (split by hash)? False for the built-in task and split folders."""
    if name == BUILTIN:
        return False
    _, path = resolve_source(name)
    return is_single_source(path)


def train_split(task: Any) -> str:
    """The split training reads: "all" for a single file when `task.allow_train_eval_overlap`, else "train"."""
    return "all" if _opt(task, "allow_train_eval_overlap", False) and _single(task.name) else "train"


def eval_source(task: Any, split: str | None = None) -> tuple[str, str]:
    """(task name, split) evaluation reads: `task.eval_name` or `task.name`, `split` or `task.eval_split`.

    A single file named by `task.eval_name` is used whole ("test" becomes "all"); the training file itself is
    used whole only with `task.allow_train_eval_overlap`.
    """
    split = split or _opt(task, "eval_split", "test") or "test"
    name = _opt(task, "eval_name") or task.name
    separate = name != task.name or _opt(task, "allow_train_eval_overlap", False)
    if split == "test" and separate and _single(name):
        split = "all"
    return name, split


def load_train_problems(task: Any, *, seed: int = 0, n: int | None = None) -> list[Problem]:
    """The training problems of `task` (first `n`; None = all). Raises ConfigError when there are none."""
    fields = field_mapping(task)
    if task.name == BUILTIN and fields:
        key = {"prompt": "question_key", "answer": "answer_key", "solution": "solution_key"}[next(iter(fields))]
        raise ConfigError(f"task.{key}: the built-in 'arithmetic' task has no fields to map (it is generated)")
    split = train_split(task)
    problems = load_task(task.name, split, seed=seed, n=n, **task_options(task, task.name))
    if not problems:
        hint = ""
        if _single(task.name):
            hint = f" (task.test_fraction={_opt(task, 'test_fraction', DEFAULT_TEST_FRACTION)} held out every row)"
        raise ConfigError(f"task.name: task '{task.name}' has no training problems{hint}")
    return problems


def load_eval_problems(
    task: Any,
    *,
    seed: int = 0,
    n: int | None = None,
    train: Sequence[Problem] | None = None,
    split: str | None = None,
) -> list[Problem]:
    """The held-out evaluation problems of `task` (first `n` after removing training overlap; None = all).

    Args:
        task: a TaskConfig (name, eval_name, eval_split, test_fraction, allow_train_eval_overlap, field keys).
        train: the problems training uses; evaluation problems with the same question (`holdout_key`) are dropped
            with a warning, or kept with a warning under `task.allow_train_eval_overlap`.
        split: overrides `task.eval_split`.

    Raises ConfigError when no evaluation problem is left.
    """
    name, split = eval_source(task, split)
    take = n if (train is None or name == BUILTIN == task.name) else None  # filter first, then take n
    problems = load_task(name, split, seed=seed, n=take, **task_options(task, name))
    where = f"{name} (split {split!r})"
    if not problems:
        hint = ""
        if split == "test" and _single(name):
            frac = _opt(task, "test_fraction", DEFAULT_TEST_FRACTION)
            hint = (
                f": task.test_fraction={frac} held out no row; raise it, set task.eval_name to evaluation data, "
                "or task.n_eval=0"
            )
        raise ConfigError(f"task.eval_name: {where} has no evaluation problems{hint}")
    if train is not None:
        seen = {holdout_key(p.prompt) for p in train}
        overlap = [p for p in problems if holdout_key(p.prompt) in seen]
        if overlap and _opt(task, "allow_train_eval_overlap", False):
            warn(
                f"{len(overlap)} of {len(problems)} evaluation problems of {where} are also training problems "
                "(task.allow_train_eval_overlap=true): evaluation scores measure memorisation, not generalisation"
            )
        elif overlap:
            problems = [p for p in problems if holdout_key(p.prompt) not in seen]
            warn(
                f"dropped {len(overlap)} evaluation problems of {where} that also occur in the training data "
                "(set task.allow_train_eval_overlap=true to keep them)"
            )
            if not problems:
                raise ConfigError(
                    f"task.eval_name: every evaluation problem of {where} is also a training problem; evaluate on "
                    "held-out data (task.eval_name / task.eval_split) or set task.allow_train_eval_overlap=true"
                )
    return problems if n is None else problems[: int(n)]
