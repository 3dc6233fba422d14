"""Tasks: the built-in arithmetic task, loaders for real math data sets, and prompt templates.

problems = load_task("arithmetic", "train", seed=0, n=512, difficulty=2)
text = format_prompt(problems[0], tokenizer)
"""

from p3o.tasks.base import Problem
from p3o.tasks.loaders import PRESETS, load_task, read_rows
from p3o.tasks.prompts import TEMPLATES, format_prompt

__all__ = ["PRESETS", "TEMPLATES", "Problem", "format_prompt", "load_task", "read_rows"]
