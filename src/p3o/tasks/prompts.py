"""Prompt templates: the user message built from a `Problem`, wrapped in the tokenizer's chat template when it has one.

text = format_prompt(problem, tokenizer)               # "<|im_start|>user\\n...<|im_end|>\\n<|im_start|>assistant\\n"
text = format_prompt(problem, None, template="boxed")  # plain text, no chat markup
"""

from __future__ import annotations

from typing import Any

from p3o.errors import ConfigError
from p3o.tasks.base import Problem

# Instructions appended to the question. "default" picks by the problem's answer format.
TEMPLATES: dict[str, str] = {
    "plain": "{question}",
    "hash": "{question}\nSolve step by step. Write the final answer as '#### <number>'.",
    "boxed": "{question}\nSolve step by step. Put the final answer in \\boxed{{}}.",
    "short": "{question}\nAnswer with '#### <number>'.",
}


def user_message(problem: Problem, template: str = "default") -> str:
    """The user turn text for `problem` under `template` ("default" = "hash" or "boxed" from meta["answer_format"])."""
    if template == "default":
        template = "boxed" if problem.meta.get("answer_format") == "boxed" else "hash"
    if template not in TEMPLATES:
        raise ConfigError(f"prompt template: unknown template {template!r}; known: default, {', '.join(TEMPLATES)}")
    return TEMPLATES[template].format(question=problem.prompt.strip())


def format_prompt(
    problem: Problem, tokenizer: Any = None, template: str = "default", system: str | None = None
) -> str:
    """The full prompt string for generation.

    With a tokenizer that has a chat template: `apply_chat_template([system?, user], add_generation_prompt=True)`,
    so the text ends where the assistant's answer starts. Otherwise the user message followed by a newline.
    """
    text = user_message(problem, template)
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return (f"{system}\n" if system else "") + text + "\n"
