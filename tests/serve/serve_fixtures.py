"""Helpers of the endpoint tests: the shipped agent base served by an fp32 HF engine (one server per module), a
scripted engine that samples given ids (to test parsing of what a tiny model would rarely write), and a tokenizer
with a Qwen3-layout chat template whose tool markers are single tokens."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch

openai = pytest.importorskip("openai", reason="the serve extra (pip install -e '.[serve]')")
pytest.importorskip("fastapi", reason="the serve extra (pip install -e '.[serve]')")

from p3o.rollout.base import Draws, SamplingEngine, stop_and_pad_ids  # noqa: E402
from p3o.rollout.settings import EngineSettings  # noqa: E402
from p3o.serve import EndpointServer  # noqa: E402

MODEL = "tiny-agent"

# Qwen3's published chat-template layout (without the reasoning handling): tools listed in the system turn as JSON
# lines inside <tools></tools> with the <tool_call> instruction, an assistant's calls as <tool_call> JSON blocks, tool
# messages inside one user turn as <tool_response> blocks, every message closed by <|im_end|>\n.
QWEN3_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with "
    "function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": <function-name>, "arguments": '
    "<args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}{{- '<|im_start|>assistant\\n' + message.content }}"
    "{%- for tool_call in message.tool_calls or [] %}"
    "{%- if (loop.first and message.content) or (not loop.first) %}{{- '\\n' }}{%- endif %}"
    "{%- if tool_call.function %}{%- set tool_call = tool_call.function %}{%- endif %}"
    '{{- \'<tool_call>\\n{"name": "\' }}{{- tool_call.name }}{{- \'", "arguments": \' }}'
    "{%- if tool_call.arguments is string %}{{- tool_call.arguments }}{%- else %}{{- tool_call.arguments | tojson }}"
    "{%- endif %}{{- '}\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or (messages[loop.index0 - 1].role != 'tool') %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}"
    "{%- if loop.last or (messages[loop.index0 + 1].role != 'tool') %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
MARKERS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]


def client(server: EndpointServer, episode: str | None = None, key: str | None = None) -> Any:
    url = server.episode_url(episode) if episode is not None else server.base_url
    return openai.OpenAI(base_url=url, api_key=key or server.api_key, max_retries=0)


class ScriptedEngine(SamplingEngine):
    """A `SamplingEngine` whose draws are given ids (each row the next script, cycling), log-prob −0.5 each: the
    endpoint's parsing and recording, tested on what a tiny model would rarely write."""

    def __init__(self, tokenizer: Any, scripts: list[list[int]]) -> None:
        self.settings = EngineSettings()
        self.device = torch.device("cpu")
        self.tokenizer = tokenizer
        self.version = 0
        self._lock = threading.RLock()
        self._group_offset = 0
        self.stop_token_ids, self.pad_token_id = stop_and_pad_ids((tokenizer,), None, None)
        self.scripts = scripts
        self.calls = 0
        self.max_model_len = 4096

    def load_weights(self, state_dict: dict, version: int) -> None:
        with self._lock:
            self.version = int(version)

    def _draw(self, prompt_ids, ids, pmask, n, seed, t_max) -> Draws:
        rows = []
        for _ in range(len(prompt_ids) * n):
            rows.append(self.scripts[self.calls % len(self.scripts)][:t_max])
            self.calls += 1
        width = max(len(r) for r in rows)
        out = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.bool)
        for i, r in enumerate(rows):
            out[i, : len(r)] = torch.tensor(r)
            mask[i, : len(r)] = True
        stops = torch.tensor([bool(r) and r[-1] in self.stop_token_ids for r in rows])
        return Draws(out, torch.where(mask, -0.5, 0.0), mask, torch.where(mask, self.version, -1), ~stops)


# Llama 3.1's chat-template layout with JSON tool calls (shortened instruction): the tools as JSON in the first
# user turn, an assistant's call as one {"name", "parameters"} object, a tool result as an ipython turn; every
# turn closed by <|eot_id|>.
LLAMA3_TEMPLATE = (
    "{{- '<|begin_of_text|>' }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + ('ipython' if message.role == 'tool' else message.role) }}"
    "{{- '<|end_header_id|>\\n\\n' }}"
    "{{- '<|end_header_id|>\\n\\n' }}"
    "{%- if tools and loop.first and message.role == 'user' %}"
    '{{- \'Respond with a JSON function call {"name": function name, "parameters": arguments}.\\n\\n\' }}'
    "{%- for t in tools %}{{- t | tojson }}{{- '\\n\\n' }}{%- endfor %}{%- endif %}"
    "{%- if message.tool_calls %}{%- for c in message.tool_calls %}"
    "{{- '{\"name\": \"' + c.function.name + '\", \"parameters\": ' }}{{- c.function.arguments | tojson }}{{- '}' }}"
    "{%- endfor %}{%- else %}{{- message.content }}{%- endif %}{{- '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}
