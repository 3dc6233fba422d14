"""Fixtures of the environment tests: small built-in tokenizers (a few seconds to train, once per session)."""

from __future__ import annotations

import pytest

MARKUP = [
    "<calc>",
    "</calc>",
    "<result>",
    "</result>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
]

# A Qwen3-style template (no reasoning handling): tools listed in the system turn, a tool message rendered inside a
# user turn as <tool_response>...</tool_response>, consecutive tool messages in one user turn, every message closed by
# <|im_end|>\n (the shape of Qwen3's own template, ../shared/AGENTS-REFERENCE.md section 2).
QWEN_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n<tools>' }}{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or message.role == 'assistant' %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or (messages[loop.index0 - 1].role != 'tool') %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or (messages[loop.index0 + 1].role != 'tool') %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def _corpus() -> list[str]:
    from p3o.tasks import load_task

    out = []
    for p in load_task("arithmetic", "train", seed=0, n=200, difficulty=3):
        out.append(f"<|im_start|>user\n{p.prompt}<|im_end|>\n<|im_start|>assistant\n{p.solution}<|im_end|>\n")
    out += ["I am thinking of a number. higher lower Guess again. tool user system assistant error: timeout"] * 5
    return out


@pytest.fixture(scope="session")
def chatml_tok():
    """The built-in tokenizer (ChatML template, EOS <|im_end|>), trained on a small corpus, with the tool markup as
    special tokens (one id each, as the tiny agent base has them)."""
    from p3o.models.tokenizer import train_tokenizer

    tok = train_tokenizer(_corpus(), vocab_size=400)
    tok.add_tokens(MARKUP, special_tokens=True)
    return tok


@pytest.fixture(scope="session")
def qwen_tok(chatml_tok):
    """The same vocabulary with a Qwen3-style chat template (tool messages inside a user turn)."""
    import copy

    tok = copy.deepcopy(chatml_tok)
    tok.chat_template = QWEN_TEMPLATE
    return tok
