"""Tool calls: which format a model speaks, its calls parsed back into OpenAI ``tool_calls``, and the request's
messages checked and laid out for its chat template.

Rendering is the model's own chat template (transformers' ``apply_chat_template`` with ``tools=``, through
`p3o.envs.render.Renderer`), so the prompt is laid out exactly as the model was trained to read it. Parsing is the
`renderers` library's per-family parser (PyPI ``renderers``, the one verifiers and prime-rl use), reading the sampled
ids themselves, not re-tokenised text:

* ``qwen3`` — Qwen3 / Hermes: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` blocks; both markers
  must be single tokens of the tokenizer (`renderers.parsing.parse_qwen3`; a ``</think>`` token, when single,
  separates the reasoning);
* ``llama3`` — Llama 3.x JSON: the assistant body is one ``{"name": ..., "parameters": {...}}`` object
  (`renderers.parsing.parse_llama_3`);
* ``none`` — no tool calls: a request with ``tools`` is refused (400);
* ``auto`` — ``qwen3`` when the tokenizer has both markers as single tokens, else ``llama3`` when it has Llama 3's
  ``<|start_header_id|>``, else ``none``.

A malformed call (invalid JSON, no name, no closing marker) is not returned as a tool call: the text stays the
content and the call is counted (``tool_parse_errors``).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from renderers.base import ToolCallParseStatus
from renderers.parsing import parse_llama_3, parse_qwen3

from p3o.errors import ConfigError, P3OError

__all__ = ["ROLES", "TOOL_FORMATS", "BadRequest", "Parsed", "ToolFormat", "resolve_tool_format", "template_messages"]

TOOL_FORMATS = ("auto", "qwen3", "llama3", "none")
ROLES = ("system", "developer", "user", "assistant", "tool")


class BadRequest(P3OError):
    """A request the endpoint refuses with an OpenAI-style error (``status`` 400 unless said otherwise)."""

    def __init__(self, message: str, *, status: int = 400, code: str = "invalid_request", param: str | None = None):
        super().__init__(message)
        self.status, self.code, self.param = status, code, param


@dataclass
class Parsed:
    """A completion read as an assistant message: its text, reasoning (or None), well-formed tool calls (OpenAI
    wire form) and how many calls were malformed."""

    content: str
    reasoning: str | None
    tool_calls: list[dict[str, Any]]
    malformed: int = 0


def _single_id(tokenizer: Any, text: str) -> int | None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    return int(ids[0]) if len(ids) == 1 else None


@dataclass
class ToolFormat:
    """A resolved tool-call format of one tokenizer (see the module docstring)."""

    name: str
    tokenizer: Any
    call_id: int | None = None
    call_end_id: int | None = None
    think_end_id: int | None = None

    def parse(self, ids: Sequence[int], stop_ids: set[int]) -> Parsed:
        """The completion `ids` (its stop id, if any, included) as content, reasoning and tool calls."""
        if self.name == "none":
            raise P3OError("tool format 'none' parses no tool calls")
        ids = [int(t) for t in ids]
        if self.name == "qwen3":
            out = parse_qwen3(self.tokenizer, ids, stop_ids=stop_ids, tool_call_id=self.call_id,
                              tool_call_end_id=self.call_end_id, reasoning_end_id=self.think_end_id)  # fmt: skip
        else:
            out = parse_llama_3(self.tokenizer, ids, stop_ids=stop_ids)
        good = [c for c in out.tool_calls if c.status == ToolCallParseStatus.OK]
        calls = [
            {"id": f"call_{secrets.token_hex(8)}", "type": "function",
             "function": {"name": c.name, "arguments": json.dumps(c.arguments or {}, ensure_ascii=False)}}
            for c in good
        ]  # fmt: skip
        content = out.content
        if len(good) < len(out.tool_calls):  # a malformed call: the text is the model's answer as it wrote it
            content = self.tokenizer.decode([t for t in ids if t not in stop_ids], skip_special_tokens=True)
            calls = []
        return Parsed(content, out.reasoning_content, calls, len(out.tool_calls) - len(good))


def resolve_tool_format(tokenizer: Any, name: str = "auto") -> ToolFormat:
    """The tool format `name` (``TOOL_FORMATS``) for `tokenizer`; ConfigError (``--tool_format``) when it is
    unknown or the tokenizer cannot speak it (qwen3 with markers that are not single tokens)."""
    if name not in TOOL_FORMATS:
        raise ConfigError(f"--tool_format: unknown {name!r}; choose from {', '.join(TOOL_FORMATS)}")
    call, end = _single_id(tokenizer, "<tool_call>"), _single_id(tokenizer, "</tool_call>")
    qwen = call is not None and end is not None
    if name == "qwen3" and not qwen:
        raise ConfigError(
            "--tool_format qwen3: '<tool_call>' and '</tool_call>' must each be one token of this tokenizer "
            "(add them as tokens); or choose llama3 / none"
        )
    if name == "auto":
        llama = _single_id(tokenizer, "<|start_header_id|>") is not None
        name = "qwen3" if qwen else ("llama3" if llama else "none")
    if name == "qwen3":
        return ToolFormat("qwen3", tokenizer, call, end, _single_id(tokenizer, "</think>"))
    return ToolFormat(name, tokenizer)


def template_messages(messages: Any) -> list[dict[str, Any]]:
    """The request's ``messages`` checked (BadRequest naming the message) and laid out as chat templates read
    them: content parts joined into text, tool-call arguments parsed from their JSON string into an object."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list of messages", param="messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise BadRequest(f"messages[{i}]: a message is an object with 'role' and 'content'", param="messages")
        role = m.get("role")
        if role not in ROLES:
            raise BadRequest(f"messages[{i}].role: {role!r} is not one of {', '.join(ROLES)}", param="messages")
        content = m.get("content")
        if isinstance(content, list):
            if any(not isinstance(p, dict) or p.get("type") != "text" for p in content):
                raise BadRequest(f"messages[{i}].content: only text parts are supported", param="messages")
            content = "".join(str(p.get("text", "")) for p in content)
        elif content is not None and not isinstance(content, str):
            raise BadRequest(f"messages[{i}].content: a string, a list of text parts or null", param="messages")
        msg: dict[str, Any] = {"role": "system" if role == "developer" else role, "content": content or ""}
        if role == "assistant" and m.get("tool_calls"):
            msg["tool_calls"] = [_template_call(i, c) for c in m["tool_calls"]]
        if role == "tool" and m.get("tool_call_id") is not None:
            msg["tool_call_id"] = str(m["tool_call_id"])
        if m.get("name") is not None:
            msg["name"] = str(m["name"])
        out.append(msg)
    return out


def _template_call(i: int, call: Any) -> dict[str, Any]:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise BadRequest(f"messages[{i}].tool_calls: each call needs function.name", param="messages")
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError as err:
            raise BadRequest(f"messages[{i}].tool_calls: arguments are not JSON ({err})", param="messages") from err
    return {"type": "function", "id": call.get("id"), "function": {"name": fn["name"], "arguments": args}}
