"""The endpoint end to end on the shipped agent base (fp32 HF engine): what it answers is what it records, and what
it records is what the trainer computes; weights, rewrites, keys, limits, streaming and vLLM's generate route."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import json
import shutil
import subprocess

import httpx
import pytest
import torch
from serve_fixtures import MODEL, client, openai

from p3o.errors import P3OError
from p3o.logprobs import token_logprobs
from p3o.serve import EndpointServer
from p3o.serve.server import bind

USER = [{"role": "user", "content": "What is 12 * 7?"}]


def _trainer_logprobs(model, row) -> torch.Tensor:
    """The fp32 trainer's log π(y_t) of the row's response ids (every id read, the sampled ones scored)."""
    p, r = torch.tensor([row.prompt_ids]), torch.tensor([row.ids])
    every = torch.ones_like
    with torch.no_grad():
        logp, _ = token_logprobs(model, p, every(p, dtype=torch.bool), r, every(r, dtype=torch.bool),
                                 loss_mask=torch.tensor([row.mask]))  # fmt: skip
    return logp[0]


def test_served_ids_are_recorded_and_logprobs_are_the_trainers(served, base):
    c = client(served, "ids-1")
    first = c.chat.completions.create(model=MODEL, messages=USER, max_tokens=24, seed=3).model_dump()
    ch = first["choices"][0]
    assert ch["token_ids"] and len(ch["p3o"]["logprobs"]) == len(ch["token_ids"]) == len(ch["p3o"]["versions"])
    history = [*USER, {"role": "assistant", "content": ch["message"]["content"]}, {"role": "user", "content": "ok?"}]
    second = c.chat.completions.create(model=MODEL, messages=history, max_tokens=16, seed=4).model_dump()
    (row,) = served.store.pop("ids-1")
    assert row.reason == "start" and row.calls == 2
    assert row.prompt_ids == first["prompt_token_ids"]
    n1 = len(ch["token_ids"])
    assert row.ids[:n1] == ch["token_ids"] and all(row.mask[:n1])  # the served turn, as sampled
    # the second call's prompt is the first call's ids + the sampled ids + the rendered new message (mask 0)
    assert (
        second["prompt_token_ids"] == row.prompt_ids + row.ids[: len(second["prompt_token_ids"]) - len(row.prompt_ids)]
    )
    assert row.ids[len(second["prompt_token_ids"]) - len(row.prompt_ids) :] == second["choices"][0]["token_ids"]
    obs = [i for i, m in enumerate(row.mask) if not m]
    assert obs and all(row.logprobs[i] == 0.0 and row.versions[i] == -1 for i in obs)
    recorded = torch.tensor(row.logprobs)
    trainer = _trainer_logprobs(base[0], row)
    mask = torch.tensor(row.mask)
    assert torch.allclose(recorded[mask], trainer[mask], atol=1e-4), (recorded[mask] - trainer[mask]).abs().max()


def test_a_weight_push_between_two_calls_gives_two_versions_in_one_row(served):
    c = client(served, "push-1")
    r1 = c.chat.completions.create(model=MODEL, messages=USER, max_tokens=8, seed=0)
    v0 = served.version
    served.load_weights({}, v0 + 1)
    history = [*USER, r1.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "and?"}]
    r2 = c.chat.completions.create(model=MODEL, messages=history, max_tokens=8, seed=0).model_dump()
    assert set(r2["choices"][0]["p3o"]["versions"]) == {v0 + 1}
    (row,) = served.store.pop("push-1")
    sampled = [v for v, m in zip(row.versions, row.mask) if m]
    assert set(sampled) == {v0, v0 + 1} and row.stats["versions"] == 2


def test_a_rewritten_history_splits_the_row(served):
    c = client(served, "rewrite-1")
    r1 = c.chat.completions.create(model=MODEL, messages=USER, max_tokens=8, seed=0)
    edited = {"role": "assistant", "content": r1.choices[0].message.content + " (edited)"}
    before = served.counters()["split_rewrite"]
    c.chat.completions.create(
        model=MODEL, messages=[*USER, edited, {"role": "user", "content": "go on"}], max_tokens=8
    )
    rows = served.store.pop("rewrite-1")
    assert [r.reason for r in rows] == ["start", "rewrite"]
    assert served.counters()["split_rewrite"] == before + 1
    assert rows[0].calls == rows[1].calls == 1  # nothing silently merged: each row holds its own call


def test_without_the_key_401_and_nothing_recorded(served):
    before = served.counters()
    with pytest.raises(openai.AuthenticationError):
        client(served, "nokey-1", key="wrong").chat.completions.create(model=MODEL, messages=USER, max_tokens=4)
    plain = httpx.post(served.episode_url("nokey-1") + "/chat/completions", json={"model": MODEL, "messages": USER})
    assert plain.status_code == 401 and plain.json()["error"]["code"] == "invalid_api_key"
    after = served.counters()
    assert after["unauthorized"] == before["unauthorized"] + 2
    assert after["sampled_tokens"] == before["sampled_tokens"] and served.store.pop("nokey-1") == []


def test_overlong_bad_input_and_another_model_are_openai_errors(served):
    c = client(served, "bad-1")
    before = served.counters()
    with pytest.raises(openai.BadRequestError) as err:
        c.chat.completions.create(model=MODEL, messages=USER, max_tokens=served.max_model_len)
    assert "maximum context length" in str(err.value) and err.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as err:
        c.chat.completions.create(model=MODEL, messages=[{"role": "robot", "content": "x"}])
    assert "messages[0].role" in str(err.value)
    with pytest.raises(openai.NotFoundError):
        c.chat.completions.create(model="gpt-4o", messages=USER, max_tokens=4)
    with pytest.raises(openai.BadRequestError) as err:  # no tool format in the agent base's tokenizer
        c.chat.completions.create(model=MODEL, messages=USER, max_tokens=4, tools=[{"type": "function",
                                  "function": {"name": "f", "parameters": {"type": "object"}}}])  # fmt: skip
    assert err.value.code == "unknown_tool_format"
    after = served.counters()
    assert after["unknown_tool_format"] == before["unknown_tool_format"] + 1
    assert after["overlong"] == before["overlong"] + 1 and after["bad_request"] == before["bad_request"] + 3
    assert after["wrong_model"] == before["wrong_model"] + 1 and served.store.pop("bad-1") == []


def test_streaming_with_the_openai_sdk(served):
    c = client(served, "stream-1")
    chunks = list(c.chat.completions.create(model=MODEL, messages=USER, max_tokens=12, seed=5, stream=True))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    last = chunks[-1].model_dump()
    finish = next(ch.model_dump()["choices"][0] for ch in chunks if ch.choices and ch.choices[0].finish_reason)
    assert last["usage"]["completion_tokens"] == len(finish["token_ids"]) and last["prompt_token_ids"]
    (row,) = served.store.pop("stream-1")
    assert row.ids == finish["token_ids"] and row.logprobs == finish["p3o"]["logprobs"]
    plain = c.chat.completions.create(model=MODEL, messages=USER, max_tokens=12, seed=5)
    assert plain.choices[0].message.content == text  # the same draw, streamed or not


def test_the_generate_route_answers_a_train_client_request(served):
    """The body renderers.client.generate (verifiers' TrainClient) posts, and the fields it reads back."""
    tok = served.tokenizer
    ids = tok.apply_chat_template(USER, add_generation_prompt=True, tokenize=False)
    ids = tok.encode(ids, add_special_tokens=False)
    body = {"model": MODEL, "token_ids": ids, "sampling_params": {"temperature": 1.0, "max_tokens": 10, "seed": 1,
            "stop_token_ids": [tok.eos_token_id], "logprobs": 1, "skip_special_tokens": False}}  # fmt: skip
    url = served.episode_url("gen-1").removesuffix("/v1") + "/inference/v1/generate"
    r = httpx.post(url, json=body, headers={"Authorization": f"Bearer {served.api_key}"}, timeout=60)
    assert r.status_code == 200, r.text
    data = r.json()
    choice = data["choices"][0]
    assert data["prompt_token_ids"] == ids and choice["finish_reason"] in ("stop", "length")
    content = choice["logprobs"]["content"]
    assert [e["token"] for e in content] == [f"token_id:{i}" for i in choice["token_ids"]]
    assert sum(s["end"] - s["start"] for s in choice["weight_versions"]) == len(choice["token_ids"])
    # the next turn, bridged client-side: previous prompt + completion + new ids extends the same row
    tail = tok.encode("\n<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    done = (
        choice["token_ids"]
        if choice["token_ids"][-1] == tok.eos_token_id
        else [*choice["token_ids"], tok.eos_token_id]
    )
    body2 = {**body, "token_ids": ids + choice["token_ids"] + done[len(choice["token_ids"]) :] + tail}
    r2 = httpx.post(url, json=body2, headers={"Authorization": f"Bearer {served.api_key}"}, timeout=60)
    assert r2.status_code == 200, r2.text
    (row,) = served.store.pop("gen-1")
    assert row.calls == 2 and row.ids[: len(choice["token_ids"])] == choice["token_ids"]
    assert sum(row.mask) == len(choice["token_ids"]) + len(r2.json()["choices"][0]["token_ids"])


def test_models_route_and_curl(served):
    models = client(served).models.list().model_dump()
    assert models["data"][0]["id"] == MODEL and models["data"][0]["max_model_len"] == served.max_model_len
    curl = shutil.which("curl")
    if curl is None:
        pytest.skip("no curl on this machine")
    body = json.dumps({"model": MODEL, "messages": USER, "max_tokens": 6, "seed": 2})
    url = served.episode_url("curl-1") + "/chat/completions"
    out = subprocess.run([curl, "-s", "-H", f"Authorization: Bearer {served.api_key}", "-H",
                          "Content-Type: application/json", "-d", body, url],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    data = json.loads(out.stdout)
    assert data["choices"][0]["token_ids"] and data["prompt_token_ids"] and "p3o" in data["choices"][0]
    no_key = subprocess.run([curl, "-s", "-o", "/dev/null", "-w", "%{http_code}", served.base_url + "/models"],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert no_key.stdout == "401"
    assert len(served.store.pop("curl-1")) == 1


def test_concurrent_requests_share_engine_calls(served):
    before = served.counters()
    c = client(served)
    with cf.ThreadPoolExecutor(6) as pool:
        outs = list(pool.map(lambda i: c.chat.completions.create(model=MODEL, messages=USER, max_tokens=6), range(6)))
    after = served.counters()
    assert all(o.choices[0].model_dump()["token_ids"] for o in outs)
    assert after["engine_calls"] - before["engine_calls"] < 6 and after["batched_jobs"] > before["batched_jobs"]
    assert after["unrecorded"] == before["unrecorded"] + 6  # keyless calls without an episode header


def test_a_port_in_use_is_one_line(served):
    with pytest.raises(P3OError, match=f"port {served.port} on 127.0.0.1 is already in use"):
        bind("127.0.0.1", served.port)
    with pytest.raises(P3OError, match="already in use"):
        EndpointServer(served.engine, served.tokenizer, model_name=MODEL, port=served.port).start()


def test_the_renderers_generate_client_reads_the_generate_route(served):
    """verifiers' TrainClient calls `renderers.client.generate`: run that client itself against the endpoint (it
    checks every log-prob entry's `token_id:<id>` token, reads max_model_len from /v1/models), then bridge the next
    turn by ids as the Qwen3 renderer does: the same row goes on."""
    renderers = pytest.importorskip("renderers")
    from renderers.client import generate
    from renderers.configs import DefaultRendererConfig

    tok = served.tokenizer
    renderer = renderers.create_renderer(tok, DefaultRendererConfig())
    params = {"max_tokens": 12, "temperature": 1.0, "seed": 1}
    fix = [tok.eos_token_id]
    tail = tok.encode("\n<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)

    async def two_turns() -> tuple[dict, dict]:
        c = openai.AsyncOpenAI(base_url=served.episode_url("rv-1"), api_key=served.api_key, max_retries=0)
        first = await generate(client=c, renderer=renderer, messages=USER, model=MODEL, sampling_params=params)
        ended = first["completion_ids"][-1] == tok.eos_token_id
        bridged = first["prompt_ids"] + first["completion_ids"] + ([] if ended else fix) + tail
        second = await generate(client=c, renderer=renderer, messages=USER, model=MODEL, prompt_ids=bridged,
                                sampling_params=params)  # fmt: skip
        return first, second

    out, out2 = asyncio.run(two_turns())
    assert out["prompt_ids"] == tok.encode(tok.apply_chat_template(USER, tokenize=False, add_generation_prompt=True),
                                           add_special_tokens=False)  # fmt: skip
    assert out["completion_ids"] and len(out["completion_logprobs"]) == len(out["completion_ids"])
    if out["completion_ids"][-1] != tok.eos_token_id:
        tail = fix + tail
    (row,) = served.store.pop("rv-1")
    assert row.calls == 2 and row.ids == out["completion_ids"] + tail + out2["completion_ids"]
    assert row.logprobs[: len(out["completion_ids"])] == pytest.approx(out["completion_logprobs"])


BAD_BODIES = {
    "/chat/completions": [
        [], {"messages": USER}, {"model": MODEL}, {"model": MODEL, "messages": []},
        {"model": MODEL, "messages": "hi"}, {"model": MODEL, "messages": [{"role": "user", "content": 5}]},
        {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
        {"model": MODEL, "messages": [{"role": "assistant", "content": "", "tool_calls": [{"function": {}}]}]},
        {"model": MODEL, "messages": [{"role": "assistant", "content": "", "tool_calls": "x"}]},
        {"model": MODEL, "messages": [{"role": "assistant", "content": "",
                                       "tool_calls": [{"function": {"name": "f", "arguments": "{"}}]}]},
        {"model": MODEL, "messages": USER, "n": 0}, {"model": MODEL, "messages": USER, "n": 1.5},
        {"model": MODEL, "messages": USER, "temperature": -1}, {"model": MODEL, "messages": USER, "top_p": 0},
        {"model": MODEL, "messages": USER, "max_tokens": 0}, {"model": MODEL, "messages": USER, "stop": [""]},
        {"model": MODEL, "messages": USER, "stop": 5}, {"model": MODEL, "messages": USER, "top_logprobs": 99},
        {"model": MODEL, "messages": USER, "logit_bias": {"1": 5}}, {"model": MODEL, "messages": USER, "seed": "x"},
        {"model": MODEL, "messages": USER, "tools": "x"}, {"model": MODEL, "messages": USER, "tools": [{"x": 1}]},
        {"model": MODEL, "messages": USER, "stop_token_ids": ["a"]},
    ],
    "/completions": [
        {"model": MODEL}, {"model": MODEL, "prompt": []}, {"model": MODEL, "prompt": [10**9]},
        {"model": MODEL, "prompt": [[]]}, {"model": MODEL, "prompt": "x", "echo": True},
        {"model": MODEL, "prompt": "x", "presence_penalty": 1.0},
    ],
    "/../inference/v1/generate": [
        [], {"token_ids": []}, {"token_ids": [1, -1]}, {"token_ids": [True]}, {"token_ids": [1], "sampling_params": 3},
        {"token_ids": [1], "sampling_params": {"max_tokens": -1}},
        {"token_ids": [1], "sampling_params": {"repetition_penalty": 1.2}},
    ],
}  # fmt: skip


def test_bad_input_is_a_400_never_a_crash(served):
    head = {"Authorization": f"Bearer {served.api_key}"}
    before = served.counters()
    sent = 0
    for route, bodies in BAD_BODIES.items():
        url = (served.episode_url("bad-2") + route).replace("/v1/../", "/")
        for body in bodies:
            r = httpx.post(url, json=body, headers=head, timeout=60)
            assert r.status_code == 400 and r.json()["error"]["message"], (route, body, r.text)
            sent += 1
        r = httpx.post(url, content=b"{not json", headers=head, timeout=60)
        assert r.status_code == 400, r.text
        sent += 1
    after = served.counters()
    assert after["bad_request"] - before["bad_request"] == sent and after["server_errors"] == before["server_errors"]
    assert served.store.pop("bad-2") == [] and after["sampled_tokens"] == before["sampled_tokens"]


def test_renders_are_cached_by_their_exact_messages(served):
    """The episodes of one problem share their first prompt's render and a repeated tool answer's; a rewritten
    history renders afresh (equal to a fresh render), never from a stale entry."""
    from p3o.envs.render import Renderer

    fresh = Renderer(served.tokenizer, None, max_obs_tokens=served.max_model_len)
    prompt = [{"role": "user", "content": "What is 6 * 7? (render cache)"}]
    hits = served.counters()["render_hits"]
    outs = [client(served, f"cache-{i}").chat.completions.create(model=MODEL, messages=prompt, max_tokens=4, seed=i)
            for i in range(2)]  # fmt: skip
    assert served.counters()["render_hits"] == hits + 1  # the second episode's prompt: the first's render
    assert [o.model_extra["prompt_token_ids"] for o in outs] == [fresh.prompt_ids(prompt)] * 2
    edited = [*prompt, {"role": "assistant", "content": "(edited)"}, {"role": "user", "content": "42"}]
    for i in range(2):  # each history extends its own episode's row: only the "42" turn is rendered, the once
        history = [*prompt, outs[i].choices[0].message.model_dump(exclude_none=True), edited[-1]]
        client(served, f"cache-{i}").chat.completions.create(model=MODEL, messages=history, max_tokens=4, seed=i)
    same_end = outs[0].choices[0].finish_reason == outs[1].choices[0].finish_reason  # EOS or not: part of the key
    assert served.counters()["render_hits"] == hits + 1 + same_end
    before = served.counters()["split_rewrite"]
    again = client(served, "cache-0").chat.completions.create(model=MODEL, messages=edited, max_tokens=4, seed=0)
    assert served.counters()["split_rewrite"] == before + 1  # the rewritten history: a new row, rendered whole
    assert again.model_extra["prompt_token_ids"] == fresh.prompt_ids(edited)
    rows = served.store.pop("cache-0")
    assert [r.reason for r in rows] == ["start", "rewrite"] and rows[1].prompt_ids == fresh.prompt_ids(edited)
    served.store.pop("cache-1")


def test_the_render_cache_tells_apart_everything_a_template_reads(served):
    """A key is the tool set, the kind of render (prompt, observation after an EOS or not) and the messages' exact
    JSON: a tool-call id or an ended-with-EOS flag that differs is a miss; a hit is a copy."""
    renders = []

    def render(ids):
        return lambda: renders.append(ids) or list(ids)

    tool = {"role": "tool", "tool_call_id": "call_a", "content": "4"}
    assert served._render("k", True, [tool], render([1, 2])) == [1, 2]
    got = served._render("k", True, [dict(tool)], render([9]))
    assert got == [1, 2] and len(renders) == 1
    got.append(7)  # the caller's copy: the cached render is unchanged
    assert served._render("k", True, [tool], render([9])) == [1, 2]
    assert served._render("k", True, [{**tool, "tool_call_id": "call_b"}], render([3])) == [3]
    assert served._render("k", False, [tool], render([4])) == [4]
    assert served._render("other tools", True, [tool], render([5])) == [5]
    assert served._render("k", "prompt", [tool], render([6])) == [6] and len(renders) == 5


def test_the_render_cache_keeps_the_key_order_a_template_prints(served):
    """A chat template prints a tool schema and a tool call's arguments in the order they were sent, so two
    requests that differ only in key order are two renders (a sorted key would serve one the other's ids)."""
    import json

    renders = []

    def render(ids):
        return lambda: renders.append(ids) or list(ids)

    fn = {"name": "f", "arguments": {"a": 1, "b": 2}}
    call = {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": fn}]}
    swapped = json.loads(json.dumps(call).replace('"a": 1, "b": 2', '"b": 2, "a": 1'))
    assert served._render("k", "prompt", [call], render([1])) == [1]
    assert served._render("k", "prompt", [swapped], render([2])) == [2] and len(renders) == 2
