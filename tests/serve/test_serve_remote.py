"""One endpoint serving through a Ray rollout worker (`p3o.serve.remote.RemoteEngine`): a real local Ray instance
(or the suite's, tests/cluster/conftest.py, when it is already up), one `p3o.cluster.RolloutWorker` built by
`p3o.cluster.RaySource` with the shipped chat base on the fp32 HF engine. Concurrent requests become ONE worker call,
every recorded log-prob is the trainer's, a weight load between two calls gives two versions, the call's sampling
settings reach the worker's engine (kept sets recorded, settings restored there), an in-flight version lands between
two decode steps of a running call, and a worker killed between two calls is restarted by Ray and serves the next
call at the engine's version."""

from __future__ import annotations

import concurrent.futures as cf
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

ray = pytest.importorskip("ray", reason="the Ray tests need the ray extra (make setup installs it)")
pytest.importorskip("fastapi", reason="the serve extra (pip install -e '.[serve]')")

from engine_checks import check_logprobs, client, concurrent_chats, shifted, split_by_version, two_versions  # noqa: E402

from p3o.errors import ConfigError  # noqa: E402
from p3o.serve import EndpointServer  # noqa: E402
from p3o.serve.remote import RemoteEngine, _describe  # noqa: E402

MODEL = "tiny-chat"


def worker_config(run_dir: Path, **overrides: Any) -> Any:
    """A run's config with one HF rollout worker on the chat base (fp32, the trainer's single thread)."""
    from p3o.config import load_config

    args = {"run_dir": str(run_dir), "model.name": MODEL, "rollout.workers": 1, "loop.mode": "sync",
            "rollout.precision": "fp32", "task.n_train": 8, "task.n_eval": 0, "log.progress": False,
            "log.plot": False, "log.tensorboard": False, **overrides}  # fmt: skip
    argv = [x for k, v in args.items() for x in (f"--{k}", str(v).lower() if isinstance(v, bool) else str(v))]
    return load_config(argv)


@pytest.fixture(scope="module")
def local_ray() -> Iterator[Any]:
    """Ray as the suite has it (tests/cluster's two-node cluster when it is up), else a local instance of our own
    (2 CPUs, stopped after)."""
    if ray.is_initialized():
        yield ray
        return
    ray.init(address="local", num_cpus=2, object_store_memory=80 * 1024**2, include_dashboard=False,
             logging_level="WARNING", log_to_driver=False)  # fmt: skip
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def base() -> tuple[Any, Any]:
    from p3o.models import load_policy

    model, tok = load_policy(MODEL)
    return model.float().eval(), tok


@pytest.fixture(scope="module")
def source(local_ray, base, tmp_path_factory) -> Iterator[Any]:
    from p3o.cluster import RaySource

    old = torch.get_num_threads()
    torch.set_num_threads(1)  # the worker takes the trainer's thread count: its kernels compute as ours
    run_dir = tmp_path_factory.mktemp("remote")
    src = RaySource(worker_config(run_dir), run_dir, base[0].state_dict(), start_step=0)
    yield src
    src.close()
    torch.set_num_threads(old)


@pytest.fixture(scope="module")
def served(source, base) -> Iterator[EndpointServer]:
    engine = RemoteEngine.from_source(source, worker=0)
    server = EndpointServer(engine, base[1], model_name=MODEL).start()
    yield server
    server.stop()


def test_concurrent_requests_are_one_worker_call_and_record_the_trainers_logprobs(served, base):
    engine = served.engine
    before, calls = served.counters(), engine.calls
    drawn = concurrent_chats(served, MODEL, k=4, tag="remote-batch")
    after = served.counters()
    assert after["engine_calls"] - before["engine_calls"] == 1 and engine.calls - calls == 1
    assert after["batched_jobs"] - before["batched_jobs"] == 4
    assert len({tuple(r.prompt_ids) for r, _ in drawn}) == 4  # four prompts in that one call
    check_logprobs(base[0], [r for r, _ in drawn], versions={served.version})


def test_a_weight_load_between_two_calls_gives_two_versions(served, base):
    v0 = served.version
    new = shifted(base[0])
    row = two_versions(served, MODEL, new, tag="remote-push")
    check_logprobs(base[0], [split_by_version(row, v0)])  # the first turn by the old weights
    model = type(base[0])(base[0].config).eval()
    model.load_state_dict(new)
    check_logprobs(model, [split_by_version(row, v0 + 1)])  # the second by the new ones
    served.load_weights(base[0].state_dict(), v0 + 2)  # back to the base's weights for the other tests


def test_the_calls_sampling_settings_reach_the_worker_and_are_restored(served, source, base):
    served.load_weights(base[0].state_dict(), served.version + 1)  # the base's weights, whatever ran before
    c = client(served, "remote-greedy")
    r = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "2 + 2?"}], max_tokens=6,
                                  temperature=0)  # fmt: skip
    p3o = r.choices[0].model_extra["p3o"]
    assert p3o["logprobs"] and all(lp == 0.0 for lp in p3o["logprobs"])  # greedy: the HF engine records 0
    (row,) = served.store.pop("remote-greedy")
    ids = torch.tensor([row.prompt_ids])
    with torch.no_grad():  # greedy is the trainer's argmax, token by token
        for t in range(len(p3o["logprobs"])):
            nxt = base[0](input_ids=ids).logits[0, -1].argmax()
            assert int(nxt) == row.ids[t]
            ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
    info = ray.get(source.actors[0].__ray_call__.remote(_describe))
    assert info["settings"]["temperature"] == 1.0 and info["engine"] == "HFEngine"  # the worker's own, restored


def test_a_truncating_call_records_each_tokens_kept_set_from_the_worker(served):
    r = client(served, "remote-topk").chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "3 + 4?"}],
        max_tokens=6,
        temperature=1.5,
        extra_body={"top_k": 3},
    )
    assert r.choices[0].model_extra["token_ids"]
    (row,) = served.store.pop("remote-topk")
    sampled = [(t, kept) for t, m, kept in zip(row.ids, row.mask, row.kept or []) if m]
    assert sampled and all(t in kept and 1 <= len(kept) <= 3 for t, kept in sampled), sampled


def test_top_logprobs_is_refused_in_one_line(served):
    with pytest.raises(Exception) as err:
        client(served, "remote-top").chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4, logprobs=True, top_logprobs=2
        )
    assert getattr(err.value, "status_code", None) == 400 and "RemoteEngine" in str(err.value)


def test_inflight_versions_are_published_and_taken_before_the_next_call(source, base):
    engine = RemoteEngine.from_source(source, worker=0, inflight=True)
    server = EndpointServer(engine, base[1], model_name=MODEL).start()
    try:
        v = engine.version + 1
        server.load_weights(base[0].state_dict(), v)  # published: no call runs, the next one takes it first
        r = client(server, "remote-inflight").chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "1 + 1?"}], max_tokens=6
        )
        assert set(r.choices[0].model_extra["p3o"]["versions"]) == {v}
    finally:
        server.stop()


def _pause_for_a_newer_version(worker: Any, step: int) -> None:
    """In the worker: at decode step `step`, wait (≤ 30 s) until a newer version is published, then take it (as
    ``rollout.inflight_updates`` does between two decode steps); a negative step removes the hook."""
    import time

    def hook(t: int) -> None:
        if t == step:
            worker.paused_for_test = True
            deadline = time.monotonic() + 30
            while (
                worker._latest is None or worker._latest[0] <= worker.engine.version
            ) and time.monotonic() < deadline:
                time.sleep(0.01)
        worker._take_newer(t)

    worker.engine.on_decode_step = hook if step >= 0 else None
    worker.paused_for_test = False


def _paused(worker: Any) -> bool:
    return bool(getattr(worker, "paused_for_test", False))


def test_inflight_a_version_published_mid_response_stamps_the_later_tokens(source, base):
    engine = RemoteEngine.from_source(source, worker=0, inflight=True)
    actor, v = source.actors[0], engine.version + 1
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the hook runs in the worker
    ray.get(actor.__ray_call__.remote(_pause_for_a_newer_version, 2))
    try:
        with EndpointServer(engine, base[1], model_name=MODEL) as server, cf.ThreadPoolExecutor(1) as pool:
            asked = pool.submit(
                client(server, "remote-midway").chat.completions.create,
                model=MODEL, messages=[{"role": "user", "content": "What is 12 * 7?"}], max_tokens=12, n=8,
                temperature=2.0, seed=3,
            )  # fmt: skip
            deadline = time.monotonic() + 60
            while not ray.get(actor.__ray_call__.remote(_paused)) and time.monotonic() < deadline:
                time.sleep(0.05)  # until the call waits in the worker at decode step 2
            server.load_weights(shifted(base[0]), v)  # published: the worker takes it at that step
            choices = asked.result(timeout=60).choices
    finally:
        ray.get(actor.__ray_call__.remote(_pause_for_a_newer_version, -1))
        ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    versions = [c.model_extra["p3o"]["versions"] for c in choices]
    assert any(len(vs) > 3 for vs in versions), versions  # a response longer than the pause holds both versions
    for vs in versions:
        assert vs[:3] == [v - 1] * len(vs[:3]) and set(vs[3:]) <= {v}, versions


def test_a_worker_handle_and_a_channel_of_its_own_make_an_engine(source, base):
    from p3o.cluster.weights import ObjectStoreChannel

    actor = source.actors[0]
    engine = RemoteEngine(actor, ray=ray, channel=ObjectStoreChannel(ray, [actor]))
    v = engine.version + 1
    engine.load_weights(base[0].state_dict(), v)
    ro = engine.generate([[1, 5, 7], [1, 9]], 2, seed=0, max_new_tokens=5)
    assert ro.response_ids.shape[0] == 4 and ro.response_ids.shape[1] <= 5 and engine.calls == 1
    g = ro.group_ids.tolist()  # prompt i in rows 2i, 2i + 1
    assert set(ro.policy_version[ro.mask].tolist()) == {v} and g[0] == g[1] and g[2] == g[3] == g[0] + 1


def test_a_worker_that_does_not_exist_is_one_line(source):
    with pytest.raises(ConfigError, match=r"rollout.workers: no worker 3 to serve through \(1 running\)"):
        RemoteEngine.from_source(source, worker=3)


def test_a_killed_worker_is_restarted_and_serves_the_next_call_at_the_engines_version(served, source, base):
    engine = served.engine
    served.load_weights(base[0].state_dict(), served.version + 1)
    old = ray.get(source.actors[0].info.remote())["pid"]
    os.kill(old, signal.SIGKILL)
    drawn = concurrent_chats(served, MODEL, k=2, tag="remote-killed")
    assert engine.restarts == 1 and ray.get(source.actors[0].info.remote())["pid"] != old
    check_logprobs(base[0], [r for r, _ in drawn], versions={served.version})
