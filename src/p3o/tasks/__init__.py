"""Tasks: the built-in arithmetic task, loaders for local data (presets or your own files), and prompt templates.

problems = load_task("arithmetic", "train", seed=0, n=512, difficulty=2)
held_out = load_task("tests/data/own_task.jsonl", "test", fields={"prompt": "q", "answer": "a"})
text = format_prompt(problems[0], tokenizer, template="hash", system="You are a careful calculator.")
verifier = default_verifier("arithmetic", problems)                   # "exact-int": a task owns its verifier
calc = load_calc("train", seed=0, n=512)                              # the calc task (p3o.envs "calc" episodes)
"""

import importlib
from typing import Any

from p3o.tasks.base import Problem
from p3o.tasks.calc import load_calc
from p3o.tasks.loaders import PRESETS, default_verifier, in_test_split, load_task, read_rows
from p3o.tasks.prompts import TEMPLATES, format_prompt
from p3o.tasks.sources import load_eval_problems, load_train_problems, task_options, task_verifier

_MIXTURE = ("Mixture", "load_mixture")  # p3o.tasks.mixture (torch: its reward), loaded on first use


def __getattr__(name: str) -> Any:
    if name in _MIXTURE:  # importlib, not an import statement: the mixture (torch) loads only when asked for
        return getattr(importlib.import_module("p3o.tasks.mixture"), name)
    raise AttributeError(f"module 'p3o.tasks' has no attribute {name!r}")


__all__ = [
    "PRESETS",
    "TEMPLATES",
    "Mixture",
    "Problem",
    "default_verifier",
    "format_prompt",
    "in_test_split",
    "load_calc",
    "load_eval_problems",
    "load_mixture",
    "load_task",
    "load_train_problems",
    "read_rows",
    "task_options",
    "task_verifier",
]
