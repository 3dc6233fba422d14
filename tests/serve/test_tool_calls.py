"""Tool calls come back structured, in the Qwen3 / Hermes family and in Llama 3.x JSON, from the ids the engine
sampled (a scripted engine writes the calls a tiny model rarely would); the tool's answer extends the same row by
the template's own delta, token-exactly."""

from __future__ import annotations

import copy
import json

import pytest
from serve_fixtures import CALCULATOR, LLAMA3_SPECIALS, LLAMA3_TEMPLATE, MODEL, ScriptedEngine, client, openai

from p3o.errors import ConfigError
from p3o.serve import EndpointServer
from p3o.serve.tools import resolve_tool_format, template_messages

ASK = [{"role": "user", "content": "What is 12 * 7?"}]


def _served(tok, scripts):
    engine = ScriptedEngine(tok, [[*tok.encode(s, add_special_tokens=False), tok.eos_token_id] for s in scripts])
    return EndpointServer(engine, tok, model_name=MODEL, max_model_len=4096).start()


def test_qwen3_tool_calls_are_structured_and_the_answer_extends_the_row(qwen_tokenizer):
    tok = qwen_tokenizer
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12*7"}}\n</tool_call>'
    server = _served(tok, [call, "It is 84."])
    try:
        assert server.tool_format.name == "qwen3"
        c = client(server, "tools-1")
        r1 = c.chat.completions.create(model=MODEL, messages=ASK, tools=[CALCULATOR])
        ch = r1.choices[0]
        assert ch.finish_reason == "tool_calls" and not ch.message.content
        (tc,) = ch.message.tool_calls
        assert tc.type == "function" and tc.function.name == "calculator"
        assert json.loads(tc.function.arguments) == {"expression": "12*7"}
        history = [*ASK, ch.message.model_dump(exclude_none=True),
                   {"role": "tool", "tool_call_id": tc.id, "content": "84"}]  # fmt: skip
        r2 = c.chat.completions.create(model=MODEL, messages=history, tools=[CALCULATOR])
        assert r2.choices[0].finish_reason == "stop" and r2.choices[0].message.content == "It is 84."
        (row,) = server.store.pop("tools-1")
        first = r1.model_dump()["choices"][0]["token_ids"]
        second = r2.model_dump()
        assert row.ids[: len(first)] == first and row.stats["tool_calls"] == 1
        # the whole conversation as the template renders it is exactly the row up to the second turn
        laid_out = template_messages(history)
        full = tok.apply_chat_template(laid_out, tools=[CALCULATOR], add_generation_prompt=True, tokenize=False)
        assert second["prompt_token_ids"] == tok.encode(full, add_special_tokens=False)
        assert (
            row.prompt_ids + row.ids[: len(second["prompt_token_ids"]) - len(row.prompt_ids)]
            == (second["prompt_token_ids"])
        )
        obs = row.ids[len(first) : len(row.ids) - len(second["choices"][0]["token_ids"])]
        assert "<tool_response>\n84\n</tool_response>" in tok.decode(obs)
        assert not any(row.mask[len(first) : len(first) + len(obs)])
    finally:
        server.stop()


def test_tool_choice_none_and_a_malformed_call(qwen_tokenizer):
    tok = qwen_tokenizer
    broken = '<tool_call>\n{"name": "calculator", "arguments": {"expression": \n</tool_call>'
    server = _served(tok, [broken])
    try:
        c = client(server, "tools-2")
        r = c.chat.completions.create(model=MODEL, messages=ASK, tools=[CALCULATOR])
        assert r.choices[0].finish_reason == "stop" and not r.choices[0].message.tool_calls
        assert "calculator" in r.choices[0].message.content and server.counters()["tool_parse_errors"] == 1
        ok = '<tool_call>\n{"name": "calculator", "arguments": {}}\n</tool_call>'
        server.engine.scripts = [[*tok.encode(ok, add_special_tokens=False), tok.eos_token_id]]
        r = c.chat.completions.create(model=MODEL, messages=ASK, tools=[CALCULATOR], tool_choice="none")
        assert r.choices[0].finish_reason == "stop" and not r.choices[0].message.tool_calls
        with pytest.raises(openai.BadRequestError, match="tool_choice"):
            c.chat.completions.create(model=MODEL, messages=ASK, tools=[CALCULATOR], tool_choice="required")
    finally:
        server.stop()


def test_llama3_json_tool_calls(base):
    tok = copy.deepcopy(base[1])
    tok.add_special_tokens({"eos_token": "<|eot_id|>", "additional_special_tokens": LLAMA3_SPECIALS})
    tok.chat_template = LLAMA3_TEMPLATE
    assert resolve_tool_format(tok).name == "llama3"
    server = _served(tok, ['{"name": "calculator", "parameters": {"expression": "12*7"}}', "84"])
    try:
        c = client(server, "llama-1")
        r = c.chat.completions.create(model=MODEL, messages=ASK, tools=[CALCULATOR])
        (tc,) = r.choices[0].message.tool_calls
        assert r.choices[0].finish_reason == "tool_calls" and tc.function.name == "calculator"
        assert json.loads(tc.function.arguments) == {"expression": "12*7"}
        history = [*ASK, r.choices[0].message.model_dump(exclude_none=True),
                   {"role": "tool", "tool_call_id": tc.id, "content": "84"}]  # fmt: skip
        r2 = c.chat.completions.create(model=MODEL, messages=history, tools=[CALCULATOR])
        assert r2.choices[0].message.content == "84"
        (row,) = server.store.pop("llama-1")
        assert row.calls == 2 and row.reason == "start"
    finally:
        server.stop()


def test_a_format_the_tokenizer_cannot_speak_is_one_line(base):
    with pytest.raises(ConfigError, match="must each be one token"):
        resolve_tool_format(base[1], "qwen3")
    with pytest.raises(ConfigError, match="unknown 'hermes2'"):
        resolve_tool_format(base[1], "hermes2")
    assert resolve_tool_format(base[1]).name == "none"
