"""The episode rules: n > 1 choices and the one the harness continues, multi-token stop strings kept as sampled with
a mask-0 EOS fix-up, token calls extending by ids, concurrent calls of one episode forking, keyless calls named by a
header, and top log-probs from the weights that sampled."""

from __future__ import annotations

import time

import httpx
from serve_fixtures import MODEL, ScriptedEngine, client

from p3o.serve import EndpointServer
from p3o.serve.batcher import Batcher, Job, Sampling
from p3o.serve.episodes import Choice, EpisodeStore, canonical

USER = [{"role": "user", "content": "What is 12 * 7?"}]


def test_n_choices_the_continued_one_stays_in_the_row_the_others_branch(served):
    c = client(served, "n-1")
    r1 = c.chat.completions.create(model=MODEL, messages=USER, max_tokens=6, n=3, seed=7).model_dump()
    assert len(r1["choices"]) == 3
    picked = r1["choices"][1]
    history = [*USER, {"role": "assistant", "content": picked["message"]["content"]}, {"role": "user", "content": "?"}]
    c.chat.completions.create(model=MODEL, messages=history, max_tokens=4, seed=8)
    rows = served.store.pop("n-1")
    assert [r.reason for r in rows] == ["start", "branch", "branch"]
    main, *branches = rows
    k = len(picked["token_ids"])
    assert main.ids[:k] == picked["token_ids"] and main.calls == 2
    others = [r1["choices"][i]["token_ids"] for i in (0, 2)]
    assert [b.ids for b in branches] == others and all(b.prompt_ids == main.prompt_ids for b in branches)


def test_a_multi_token_stop_string_keeps_the_sampled_ids_and_the_eos_fix_up_is_mask_0(base):
    tok = base[1]
    stop = "STOP"
    assert len(tok.encode(stop, add_special_tokens=False)) > 1
    script = [*tok.encode("12 * 7 STOP ignored", add_special_tokens=False), tok.eos_token_id]
    server = EndpointServer(ScriptedEngine(tok, [script]), tok, model_name=MODEL, max_model_len=512).start()
    try:
        c = client(server, "stop-1")
        r1 = c.chat.completions.create(model=MODEL, messages=USER, stop=[stop]).model_dump()
        ch = r1["choices"][0]
        assert ch["finish_reason"] == "stop" and ch["message"]["content"] == "12 * 7 "
        ids = ch["token_ids"]
        assert tok.decode(ids).endswith(stop) and script[: len(ids)] == ids and len(ids) < len(script)
        history = [
            *USER,
            {"role": "assistant", "content": ch["message"]["content"]},
            {"role": "user", "content": "ok"},
        ]
        c.chat.completions.create(model=MODEL, messages=history, stop=[stop])
        (row,) = server.store.pop("stop-1")
        assert row.ids[: len(ids)] == ids and all(row.mask[: len(ids)])
        assert row.ids[len(ids)] == tok.eos_token_id and not row.mask[len(ids)]  # the template's EOS, not sampled
    finally:
        server.stop()


def test_token_calls_extend_the_row_by_ids_and_a_header_names_the_episode(served):
    tok = served.tokenizer
    prompt = tok.encode("<|im_start|>user\n3 + 4?<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    key = {"Authorization": f"Bearer {served.api_key}", "X-Episode-Id": "tok-1"}
    r1 = httpx.post(served.base_url + "/completions", headers=key, timeout=60,
                    json={"model": MODEL, "prompt": prompt, "max_tokens": 5, "seed": 1}).json()  # fmt: skip
    got = r1["choices"][0]["token_ids"]
    more = tok.encode("\nmore", add_special_tokens=False)
    r2 = httpx.post(served.base_url + "/completions", headers=key, timeout=60,
                    json={"model": MODEL, "prompt": prompt + got + more, "max_tokens": 5}).json()  # fmt: skip
    (row,) = served.store.pop("tok-1")
    assert row.prompt_ids == prompt and row.ids == got + more + r2["choices"][0]["token_ids"]
    assert row.mask == [True] * len(got) + [False] * len(more) + [True] * len(r2["choices"][0]["token_ids"])


def test_top_logprobs_come_from_the_weights_that_sampled(served):
    r = client(served).chat.completions.create(model=MODEL, messages=USER, max_tokens=6, logprobs=True,
                                               top_logprobs=3, seed=2)  # fmt: skip
    content = r.choices[0].logprobs.content
    assert len(content) == len(r.model_dump()["choices"][0]["token_ids"])
    for entry in content:
        alts = [a.logprob for a in entry.top_logprobs]
        assert len(alts) == 3 and alts == sorted(alts, reverse=True) and entry.logprob <= alts[0] + 1e-5
        same = [a.logprob for a in entry.top_logprobs if a.token == entry.token]
        assert not same or abs(same[0] - entry.logprob) < 1e-4


def test_a_concurrent_call_of_the_same_row_forks_and_an_unrelated_one_rewrites():
    store = EpisodeStore()
    msgs = [canonical(m) for m in USER]
    first = store.prepare_chat("e", msgs, None, lambda: [1, 2, 3], lambda k, eos: [9])
    answer = ("assistant", "84", ())
    store.commit(first, [Choice([5, 6, 2], [-0.1, -0.2, -0.3], [0, 0, 0], True, "stop", answer)])
    follow = [*msgs, answer, ("user", "more", ())]
    a = store.prepare_chat("e", follow, None, lambda: [1, 2, 3, 5, 6, 2, 9], lambda k, eos: [9])
    b = store.prepare_chat("e", follow, None, lambda: [1, 2, 3, 5, 6, 2, 9], lambda k, eos: [9])
    assert a.reason == "" and a.prompt_ids == [1, 2, 3, 5, 6, 2, 9] and b.reason == "fork"
    store.commit(a, [Choice([7, 2], [-0.5, -0.6], [1, 1], True, "stop", ("assistant", "x", ()))])
    store.commit(b, [Choice([8, 2], [-0.7, -0.8], [1, 1], True, "stop", ("assistant", "y", ()))])
    other = store.prepare_chat("e", [("user", "else", ())], None, lambda: [4], lambda k, eos: [])
    store.abort(other)
    assert other.reason == "rewrite" and store.counters()["split_fork"] == 1
    rows = store.pop("e")
    assert [r.reason for r in rows] == ["start", "fork"]
    assert rows[0].ids == [5, 6, 2, 9, 7, 2] and rows[0].mask == [True, True, True, False, True, True]
    assert rows[0].versions == [0, 0, 0, -1, 1, 1] and rows[1].prompt_ids == [1, 2, 3, 5, 6, 2, 9]


def test_the_batcher_waits_for_the_expected_requests_then_runs_them_in_one_call(base):
    from serve_fixtures import ScriptedEngine

    tok = base[1]
    engine = ScriptedEngine(tok, [[5, tok.eos_token_id]])
    batcher = Batcher(engine, window_s=0.001)
    batcher.gather(expect=lambda: 3, max_wait_s=5.0)
    batcher.start()
    try:
        first = batcher.submit(Job([1, 2], 1, 4, Sampling()))
        time.sleep(0.05)  # the first waits: two more are expected
        assert not first.done() and batcher.counts["engine_calls"] == 0
        rest = [batcher.submit(Job([1, 3], 1, 4, Sampling())) for _ in range(2)]
        draws = [f.result(timeout=30) for f in (first, *rest)]
        assert batcher.counts == {"engine_calls": 1, "batched_jobs": 3, "sampled_tokens": 6}
        assert all(d[0].ids == [5, tok.eos_token_id] and d[0].stopped for d in draws)
    finally:
        batcher.stop()


def test_a_truncating_request_records_each_tokens_kept_set(served):
    """top-p < 1: the HF engine records the support each token was drawn from; the row and the generate route carry
    it, and every sampled id lies in its own set."""
    c = client(served, "kept-1")
    r = c.chat.completions.create(model=MODEL, messages=USER, max_tokens=8, top_p=0.8, seed=3).model_dump()
    (row,) = served.store.pop("kept-1")
    ids = r["choices"][0]["token_ids"]
    assert row.kept is not None and len(row.kept) == len(ids)
    assert all(t in kept for t, kept in zip(ids, row.kept)) and any(len(k) < len(served.tokenizer) for k in row.kept)
    plain = client(served, "kept-2").chat.completions.create(model=MODEL, messages=USER, max_tokens=4, seed=3)
    assert plain.choices[0].finish_reason and served.store.pop("kept-2")[0].kept is None  # nothing truncated


def test_a_request_without_max_tokens_samples_to_the_context_or_the_default(base):
    tok = base[1]
    script = tok.encode("one two three four five six", add_special_tokens=False)  # no EOS: runs to the budget
    engine = ScriptedEngine(tok, [script])
    server = EndpointServer(engine, tok, model_name=MODEL, max_model_len=40, default_max_tokens=3).start()
    try:
        r = client(server).chat.completions.create(model=MODEL, messages=USER).model_dump()
        assert r["choices"][0]["finish_reason"] == "length" and r["choices"][0]["token_ids"] == script[:3]
        server.default_max_tokens = None  # the rest of the context
        r = client(server).chat.completions.create(model=MODEL, messages=USER).model_dump()
        assert r["choices"][0]["token_ids"] == script[: 40 - len(r["prompt_token_ids"])]
    finally:
        server.stop()
