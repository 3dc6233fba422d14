"""The endpoint on the shipped chat base (Qwen3-style template, `<tool_call>` markers single tokens): the example
harness's episode — a calculator call, its answer, the final turn — is one row whose ids are the served prompt, the
sampled ids and the rendered tool answer, the second call's prompt is the template's own rendering of the whole
conversation, and every recorded log-prob is the fp32 trainer's."""

from __future__ import annotations

import json

import pytest
import torch
from serve_fixtures import client

from p3o.examples.agent_openai import TOOLS, calculator
from p3o.logprobs import token_logprobs
from p3o.models import load_policy
from p3o.models.bases import shipped_dir
from p3o.rollout import HFEngine
from p3o.serve import EndpointServer
from p3o.serve.tools import template_messages
from p3o.tasks.calc import load_calc

pytestmark = pytest.mark.skipif(shipped_dir("tiny-chat") is None, reason="tiny-chat is not shipped yet")


@pytest.fixture(scope="module")
def chat():
    model, tok = load_policy("tiny-chat")
    server = EndpointServer(HFEngine(model, tok, precision="fp32"), tok, model_name="tiny-chat").start()
    yield model, tok, server
    server.stop()


def test_a_tool_episode_on_the_chat_base_is_one_exact_row(chat):
    model, tok, server = chat
    assert server.tool_format.name == "qwen3"
    c = client(server, "chat-1")
    for problem in load_calc("test", n=8, kind="small"):
        msgs = [{"role": "user", "content": problem.prompt}]
        r1 = c.chat.completions.create(model="tiny-chat", messages=msgs, tools=TOOLS, max_tokens=64, seed=0)
        if r1.choices[0].message.tool_calls:
            break
        server.store.pop("chat-1")
    msg = r1.choices[0].message
    assert r1.choices[0].finish_reason == "tool_calls" and msg.tool_calls[0].function.name == "calculator"
    msgs.append(msg.model_dump(exclude_none=True))
    for call in msg.tool_calls:
        answer = calculator(json.loads(call.function.arguments)["expression"])
        msgs.append({"role": "tool", "tool_call_id": call.id, "content": answer})
    r2 = c.chat.completions.create(model="tiny-chat", messages=msgs, tools=TOOLS, max_tokens=64, seed=0).model_dump()
    text = tok.apply_chat_template(template_messages(msgs), tools=TOOLS, add_generation_prompt=True, tokenize=False)
    assert r2["prompt_token_ids"] == tok.encode(text, add_special_tokens=False)
    (row,) = server.store.pop("chat-1")
    first, last = r1.model_dump()["choices"][0]["token_ids"], r2["choices"][0]["token_ids"]
    assert row.prompt_ids + row.ids == r2["prompt_token_ids"] + last and row.ids[: len(first)] == first
    assert sum(row.mask) == len(first) + len(last) and row.stats["tool_calls"] == len(msg.tool_calls)
    p, r = torch.tensor([row.prompt_ids]), torch.tensor([row.ids])
    mask = torch.tensor([row.mask])
    with torch.no_grad():
        trainer, _ = token_logprobs(model, p, torch.ones_like(p, dtype=torch.bool), r,
                                    torch.ones_like(r, dtype=torch.bool), loss_mask=mask)  # fmt: skip
    recorded = torch.tensor([row.logprobs])
    assert torch.allclose(recorded[mask], trainer[mask], atol=1e-4)
