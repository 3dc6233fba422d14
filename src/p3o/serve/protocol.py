"""The wire: requests read and checked (OpenAI chat completions and completions, vLLM's token-in-token-out generate),
and responses written in the shapes their clients read.

Every response carries vLLM's extension fields (``prompt_token_ids``; each choice's ``token_ids``) and p3o's own:
each choice's ``p3o`` = {``logprobs``: the recorded log-prob of every sampled id, ``versions``: the policy version
that sampled it, ``episode``: the episode key or null}. OpenAI's ``logprobs`` object is there when asked for
(``logprobs: true`` / ``top_logprobs``); the generate route always has it, with vLLM's ``token_id:<id>`` tokens.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from p3o.serve.batcher import Sampling
from p3o.serve.tools import BadRequest

__all__ = ["Finished", "Request", "chat_response", "completion_response", "generate_response", "read_request"]

MAX_N = 64
MAX_TOP_LOGPROBS = 20


@dataclass
class Request:
    """A request's settings, read and checked (`read_request`)."""

    model: str
    n: int = 1
    sampling: Sampling = field(default_factory=Sampling)
    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    logprobs: bool = False
    top_logprobs: int = 0
    stream: bool = False
    tools: list[dict[str, Any]] | None = None
    tool_choice: str = "auto"


@dataclass
class Finished:
    """One served choice: ids as sampled, their log-probs and versions, the finish reason, the text (content),
    reasoning and tool calls returned, and per-id top alternatives when asked for."""

    ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: str
    text: str
    reasoning: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    top: list[list[tuple[int, float]]] | None = None


def _number(body: dict, key: str, kind: type, lo: float | None, hi: float | None, default: Any) -> Any:
    value = body.get(key, default)
    if value is None:
        return default
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or (kind is int and not float(value).is_integer())
    ):
        raise BadRequest(f"'{key}' must be {'an integer' if kind is int else 'a number'}, got {value!r}", param=key)
    value = kind(value)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise BadRequest(f"'{key}' must be in [{lo}, {hi}], got {value}", param=key)
    return value


def read_request(body: Any, *, chat: bool) -> Request:
    """A chat-completions (`chat`) or completions body as a `Request`; BadRequest naming the field otherwise.

    ``top_k`` (vLLM's extension) −1 or 0 is off; ``max_completion_tokens`` wins over ``max_tokens``; ``stop`` is a
    string or a list of strings; ``stop_token_ids`` (vLLM's extension) are ids that end a choice like EOS.
    """
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("'model' is required", param="model")
    top_k = _number(body, "top_k", int, -1, None, 0)
    sampling = Sampling(
        temperature=_number(body, "temperature", float, 0.0, 100.0, 1.0),
        top_p=_number(body, "top_p", float, 1e-9, 1.0, 1.0),
        top_k=max(top_k, 0),
        seed=_number(body, "seed", int, None, None, None),
    )
    max_tokens = _number(body, "max_completion_tokens", int, 1, None, None)
    if max_tokens is None:
        max_tokens = _number(body, "max_tokens", int, 1, None, None)
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise BadRequest("'stop' must be a non-empty string or a list of them", param="stop")
    stop_ids = body.get("stop_token_ids") or []
    if not isinstance(stop_ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in stop_ids):
        raise BadRequest("'stop_token_ids' must be a list of integers", param="stop_token_ids")
    lp = body.get("logprobs")
    if chat:
        top = _number(body, "top_logprobs", int, 0, MAX_TOP_LOGPROBS, 0)
        want = bool(lp) or top > 0
    else:  # completions: logprobs is the number of alternatives
        top = _number(body, "logprobs", int, 0, MAX_TOP_LOGPROBS, None)
        want, top = top is not None, top or 0
    req = Request(model, _number(body, "n", int, 1, MAX_N, 1), sampling, max_tokens, stop, stop_ids, want, top,
                  bool(body.get("stream", False)))  # fmt: skip
    if chat:
        req.tools, req.tool_choice = _tools(body)
    return req


def _tools(body: dict) -> tuple[list[dict[str, Any]] | None, str]:
    tools = body.get("tools")
    good = isinstance(tools, list) and all(
        isinstance(t, dict) and t.get("type", "function") == "function" and isinstance(t.get("function"), dict)
        and isinstance(t["function"].get("name"), str) for t in tools
    )  # fmt: skip
    if tools is not None and not good:
        raise BadRequest("'tools' must be a list of {type: function, function: {name, parameters}}", param="tools")
    choice = body.get("tool_choice") or "auto"
    if choice not in ("auto", "none"):
        raise BadRequest(
            f"'tool_choice' {json.dumps(choice)}: only 'auto' and 'none' are supported", param="tool_choice"
        )
    return (tools or None), choice


def _logprobs_content(tokenizer: Any, c: Finished, *, token_ids: bool) -> list[dict[str, Any]]:
    """OpenAI's ``logprobs.content``: one entry per id (``token_id:<id>`` tokens for the generate route)."""

    def tok(i: int) -> str:
        return f"token_id:{i}" if token_ids else tokenizer.decode([i])

    out = []
    for k, (i, lp) in enumerate(zip(c.ids, c.logprobs)):
        entry: dict[str, Any] = {"token": tok(i), "logprob": lp, "bytes": list(tok(i).encode("utf-8"))}
        entry["token_id"] = i
        entry["top_logprobs"] = [
            {"token": tok(a), "logprob": alp, "bytes": list(tok(a).encode("utf-8"))} for a, alp in (c.top or [])[k]
        ] if c.top else []  # fmt: skip
        out.append(entry)
    return out


def _p3o(c: Finished, episode: str | None) -> dict[str, Any]:
    return {"logprobs": c.logprobs, "versions": c.versions, "episode": episode}


def _usage(prompt_ids: Sequence[int], choices: Sequence[Finished]) -> dict[str, int]:
    done = sum(len(c.ids) for c in choices)
    return {"prompt_tokens": len(prompt_ids), "completion_tokens": done, "total_tokens": len(prompt_ids) + done}


def _message(c: Finished) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": c.text if (c.text or not c.tool_calls) else None}
    if c.reasoning is not None:
        msg["reasoning_content"] = c.reasoning
    if c.tool_calls:
        msg["tool_calls"] = c.tool_calls
    return msg


def chat_response(model: str, prompt_ids: list[int], choices: list[Finished], tokenizer: Any, *,
                  logprobs: bool, episode: str | None) -> dict[str, Any]:  # fmt: skip
    """A ``chat.completion`` object with the extension fields."""
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": k,
                "message": _message(c),
                "logprobs": {"content": _logprobs_content(tokenizer, c, token_ids=False)} if logprobs else None,
                "finish_reason": c.finish_reason,
                "token_ids": c.ids,
                "p3o": _p3o(c, episode),
            }
            for k, c in enumerate(choices)
        ],
        "usage": _usage(prompt_ids, choices),
        "prompt_token_ids": prompt_ids,
    }


def chat_chunks(response: dict[str, Any]) -> list[dict[str, Any]]:
    """A chat completion as the ``chat.completion.chunk`` objects of its stream: per choice the role, the content,
    the tool calls (whole, one delta each), then a finish chunk with the choice's ``token_ids``, ``logprobs`` and
    ``p3o``; last a chunk with no choices carrying ``usage`` and ``prompt_token_ids``."""
    head = {"id": response["id"], "object": "chat.completion.chunk", "created": response["created"],
            "model": response["model"]}  # fmt: skip
    out = []
    for ch in response["choices"]:
        msg, k = ch["message"], ch["index"]
        out.append({**head, "choices": [{"index": k, "delta": {"role": "assistant", "content": ""}}]})
        if msg.get("reasoning_content"):
            out.append({**head, "choices": [{"index": k, "delta": {"reasoning_content": msg["reasoning_content"]}}]})
        if msg.get("content"):
            out.append({**head, "choices": [{"index": k, "delta": {"content": msg["content"]}}]})
        for i, call in enumerate(msg.get("tool_calls") or []):
            out.append({**head, "choices": [{"index": k, "delta": {"tool_calls": [{"index": i, **call}]}}]})
        last = {"index": k, "delta": {}, "finish_reason": ch["finish_reason"], "logprobs": ch["logprobs"],
                "token_ids": ch["token_ids"], "p3o": ch["p3o"]}  # fmt: skip
        out.append({**head, "choices": [last]})
    out.append({**head, "choices": [], "usage": response["usage"], "prompt_token_ids": response["prompt_token_ids"]})
    return out


def completion_response(model: str, prompts: list[list[int]], choices: list[list[Finished]], tokenizer: Any, *,
                        logprobs: bool, episode: str | None) -> dict[str, Any]:  # fmt: skip
    """A ``text_completion`` object: choices prompt by prompt (n each), with the extension fields per choice (a
    choice's ``prompt_token_ids`` is its prompt's)."""
    out, k = [], 0
    for p, cs in zip(prompts, choices):
        for c in cs:
            lp = None
            if logprobs:
                toks = [tokenizer.decode([i]) for i in c.ids]
                lp = {"tokens": toks, "token_logprobs": c.logprobs,
                      "top_logprobs": [{tokenizer.decode([a]): v for a, v in t} for t in c.top] if c.top else None,
                      "text_offset": []}  # fmt: skip
            out.append({"index": k, "text": c.text, "logprobs": lp, "finish_reason": c.finish_reason,
                        "token_ids": c.ids, "prompt_token_ids": p, "p3o": _p3o(c, episode)})  # fmt: skip
            k += 1
    flat = [c for cs in choices for c in cs]
    usage = _usage([t for p in prompts for t in p], flat)
    return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": model, "choices": out, "usage": usage, "prompt_token_ids": prompts[0] if len(prompts) == 1
            else None}  # fmt: skip


def generate_response(prompt_ids: list[int], choices: list[Finished], tokenizer: Any, *,
                      episode: str | None, kept: list[list[list[int]] | None]) -> dict[str, Any]:  # fmt: skip
    """vLLM's ``/inference/v1/generate`` answer: per choice ``token_ids``, ``logprobs.content[i].{token, token_id,
    logprob}`` (``token_id:<id>`` tokens), ``finish_reason``, ``sampling_mask`` (each id's kept set, where
    recorded), ``weight_versions`` (runs of one version: [{start, end, version}], end exclusive) and ``p3o``."""
    out = []
    for k, (c, sets) in enumerate(zip(choices, kept)):
        spans: list[dict[str, int]] = []
        for t, v in enumerate(c.versions):
            if spans and spans[-1]["version"] == v:
                spans[-1]["end"] = t + 1
            else:
                spans.append({"start": t, "end": t + 1, "version": v})
        out.append({"index": k, "token_ids": c.ids, "finish_reason": c.finish_reason,
                    "logprobs": {"content": _logprobs_content(tokenizer, c, token_ids=True)},
                    "sampling_mask": sets, "weight_versions": spans, "p3o": _p3o(c, episode)})  # fmt: skip
    return {"request_id": f"gen-{uuid.uuid4().hex}", "prompt_token_ids": prompt_ids, "choices": out,
            "usage": _usage(prompt_ids, choices)}  # fmt: skip
