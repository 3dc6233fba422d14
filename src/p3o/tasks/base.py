"""The `Problem` record every task loader returns.

Problem(prompt="What is 3 + 4?", answer="7", solution="3 + 4 = 7\\n#### 7", meta={"verifier": "exact-int"})
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Problem:
    """One task instance.

    Attributes:
        prompt: the question as plain text (no chat markup; `format_prompt` adds the template).
        answer: the reference final answer as a string (an integer for the built-in task, LaTeX for MATH-style sets).
        solution: a worked solution ending in the answer marker (may be empty for evaluation sets).
        meta: free-form extras. Keys set by the built-in loaders: `verifier` (the name `p3o.rewards.get_verifier`
            takes), `answer_format` ("####" or "boxed"), `source` (task or file), `index` (row / problem number),
            and for the arithmetic task `difficulty`, `kind` ("word" | "expr"), `expression`.
    """

    prompt: str
    answer: str
    solution: str = ""
    meta: dict[str, Any] = field(default_factory=dict)
