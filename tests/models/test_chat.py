"""The endpoint testbed's base ``tiny-chat`` (`p3o.models.chat`): Qwen3-style tool calls through its chat template."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from p3o.envs.render import Renderer
from p3o.envs.tools import ToolCall, parse_tool_calls
from p3o.models import load_policy
from p3o.models.bases import shipped_dir, stamp
from p3o.models.chat import (
    CHAT_NAME,
    CHAT_RECIPE,
    CHAT_TEMPLATE,
    CHAT_TOKENS,
    CHAT_WORDS,
    chat_transcript,
    tool_call_text,
)
from p3o.models.chat_eval import run_episodes, tool_output
from p3o.models.hub import builtin_names, check_model_name
from p3o.tasks.calc import load_calc

# What the example harness sends: exactly this schema (the warm start's).
HARNESS_TOOLS = json.loads(
    '[{"type": "function", "function": {"name": "calculator", "description": "Evaluate an arithmetic expression.", '
    '"parameters": {"type": "object", "properties": {"expression": {"type": "string", "description": "e.g. 47 * 6"}}, '
    '"required": ["expression"]}}}]'
)
TOOL_JSON = json.dumps(HARNESS_TOOLS[0])
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "47 * 6"}}\n</tool_call>'


@pytest.fixture(scope="module")
def chat() -> tuple:
    torch.set_num_threads(1)
    return load_policy(CHAT_NAME)


def test_the_markers_are_single_ids_appended_after_the_main_vocabulary(chat: tuple) -> None:
    model, tok = chat
    _, main = load_policy("tiny", with_model=False)
    ids = [tok.encode(m, add_special_tokens=False) for m in CHAT_TOKENS]
    assert ids == [[len(main) + k] for k in range(len(CHAT_TOKENS))]  # 469..472: the main ids are unchanged
    words = [tok.encode(w, add_special_tokens=False) for w in CHAT_WORDS]  # then the words, whole words only
    assert words == [[len(main) + len(CHAT_TOKENS) + k] for k in range(len(CHAT_WORDS))]
    assert len(tok) == model.config.vocab_size == len(main) + len(CHAT_TOKENS) + len(CHAT_WORDS)
    assert words[2][0] == tok.convert_tokens_to_ids("name") not in tok.encode("rename", add_special_tokens=False)
    text = "What is 47 * 6?\n47 * 6 = 282\n#### 282"
    assert tok.encode(text, add_special_tokens=False) == main.encode(text, add_special_tokens=False)
    # Qwen3's kind of added token: one id in a sampled call, and kept by a decode that drops special tokens
    ids = tok.encode(CALL + "<|im_end|>", add_special_tokens=False)
    assert ids.count(ids[0]) == 1 and ids[0] == tok.convert_tokens_to_ids("<tool_call>")
    assert tok.decode(ids, skip_special_tokens=True) == CALL and tok.eos_token == "<|im_end|>"


def test_apply_chat_template_with_tools_renders_the_qwen3_layout(chat: tuple) -> None:
    _, tok = chat
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 47 * 6?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_0",
                    "type": "function",
                    "function": {"name": "calculator", "arguments": '{"expression": "47 * 6"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_0", "content": "282"},
        {"role": "tool", "tool_call_id": "call_1", "content": "error: x"},
        {"role": "assistant", "content": "#### 282"},
        {"role": "user", "content": "And 13 * 3?"},
    ]
    expected = (
        "<|im_start|>system\nBe brief.\n\n# Tools\n\nFunctions:\n<tools>\n"
        + TOOL_JSON
        + '\n</tools>\n\nCall one as:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
        "</tool_call><|im_end|>\n"
        "<|im_start|>user\nWhat is 47 * 6?<|im_end|>\n"
        "<|im_start|>assistant\n" + CALL + "<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n282\n</tool_response>\n<tool_response>\nerror: x\n</tool_response>"
        "<|im_end|>\n"
        "<|im_start|>assistant\n#### 282<|im_end|>\n"
        "<|im_start|>user\nAnd 13 * 3?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    got = tok.apply_chat_template(messages, tools=HARNESS_TOOLS, tokenize=False, add_generation_prompt=True)
    assert got == expected
    assert tok.chat_template == CHAT_TEMPLATE
    plain = [{"role": "system", "content": "S"}, {"role": "user", "content": "u"}]  # no tools: plain ChatML
    assert (
        tok.apply_chat_template(plain, tokenize=False)
        == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nu<|im_end|>\n"
    )
    ids = tok.apply_chat_template(messages, tools=HARNESS_TOOLS, add_generation_prompt=True, return_dict=False)
    assert list(ids) == tok.encode(expected, add_special_tokens=False)


def test_an_assistant_tool_call_turn_round_trips(chat: tuple) -> None:
    """What the model samples is what the template renders back from the parsed ``tool_calls`` (arguments as the
    OpenAI SDK's JSON string, or as an object), and parses to the call."""
    _, tok = chat
    text = tool_call_text("calculator", {"expression": "47 * 6"})
    assert text == CALL
    sampled = [*tok.encode(text, add_special_tokens=False), tok.eos_token_id]
    decoded = tok.decode(sampled, skip_special_tokens=False)
    [call] = parse_tool_calls(decoded, style="qwen")
    assert call == ToolCall("calculator", {"expression": "47 * 6"}) and tool_output(call) == "282"
    head = [{"role": "user", "content": "What is 47 * 6?"}]
    prompt = tok.apply_chat_template(head, tools=HARNESS_TOOLS, tokenize=False, add_generation_prompt=True)
    for arguments in (json.dumps(call.arguments), call.arguments):
        turn = {
            "role": "assistant",
            "tool_calls": [{"type": "function", "function": {"name": call.name, "arguments": arguments}}],
        }
        rendered = tok.apply_chat_template([*head, turn], tools=HARNESS_TOOLS, tokenize=False)
        assert rendered == prompt + decoded + "\n"
        assert tok.encode(rendered, add_special_tokens=False) == tok.encode(
            prompt, add_special_tokens=False
        ) + sampled + tok.encode("\n", add_special_tokens=False)


def test_a_warm_start_transcript_is_the_endpoint_row_of_the_template(chat: tuple) -> None:
    """The warm start's rows (`Renderer.transcript`: served prompt + sampled ids + fixed-base deltas) are the
    template's ids of the whole conversation: what the endpoint serves is what the base was trained on."""
    _, tok = chat
    problem = load_calc("train", n=1, kind="small")[0]
    messages = chat_transcript(problem, use_tool=True)
    renderer = Renderer(tok, mode="chat", tools=HARNESS_TOOLS)
    prompt, ids, mask = renderer.transcript(messages)
    whole = tok.apply_chat_template(messages, tools=HARNESS_TOOLS, tokenize=False)
    assert prompt + ids + tok.encode("\n", add_special_tokens=False) == tok.encode(whole, add_special_tokens=False)
    learned = tok.decode([t for t, m in zip(ids, mask) if m], skip_special_tokens=False)
    assert (
        learned
        == tool_call_text("calculator", {"expression": problem.meta["expression"]})
        + f"<|im_end|>#### {problem.answer}<|im_end|>"
    )
    direct = chat_transcript(problem, use_tool=False)
    assert direct[-1]["content"] == problem.solution and len(direct) == 2


def test_the_shipped_base_loads_offline_and_calls_the_tool_on_some_problems(
    chat: tuple, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model, tok = chat
    assert model.config.p3o_base == stamp(CHAT_NAME) and model.config.name_or_path == str(shipped_dir(CHAT_NAME))
    assert model.config.max_position_embeddings == CHAT_RECIPE["context"] == tok.model_max_length
    assert CHAT_NAME in builtin_names() and check_model_name(CHAT_NAME) is None
    stats = run_episodes(model, tok, load_calc("test", kind="small", n=32), seed=0)
    assert 0 < sum(c > 0 for c in stats.calls) < 32  # calls the tool on some problems, not all
    assert 0 < stats.pass1 < 1 and max(stats.turns) <= 3
