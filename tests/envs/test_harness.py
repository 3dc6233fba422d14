"""The harness runner (`p3o.envs.harness`) against a local stand-in endpoint: concurrency, grouping, time limits and
every fault of issue 52 item 5 counted (never raised, never a hang).

The stand-in is a stdlib HTTP server speaking the two replies the example harness needs (a ``calculator`` tool call,
then ``#### <value>``); the real endpoint's rows are tested in tests/train/test_wiring_harness.py.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

pytest.importorskip("openai", reason="the serve extra (openai) is not installed")

from p3o.envs.harness import FAULTS, episode_result, load_harness, run_harness
from p3o.envs.harness_client import HarnessProcesses, new_episodes
from p3o.errors import ConfigError
from p3o.examples.agent_openai import calculator, solve
from p3o.tasks.calc import calc_problem

KEY = "k-test"


class _Server(ThreadingHTTPServer):
    request_queue_size = 256  # every episode may connect at once
    daemon_threads = True


class StandIn:
    """A local endpoint: ``/episodes/<id>/v1/chat/completions`` answers a calculator call on the prompt's
    expression, then the tool's result as ``#### <value>``; it counts calls per episode and the most at once."""

    def __init__(self, delay_s: float = 0.05) -> None:
        self.calls: dict[str, int] = {}
        self.active = self.peak = 0
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.headers.get("Authorization") != f"Bearer {KEY}":
                    return self._send(401, {"error": {"message": "bad key"}})
                episode = self.path.split("/")[2]
                with outer.lock:
                    outer.calls[episode] = outer.calls.get(episode, 0) + 1
                    outer.active += 1
                    outer.peak = max(outer.peak, outer.active)
                time.sleep(delay_s)
                with outer.lock:
                    outer.active -= 1
                self._send(200, outer.reply(body["messages"]))

            def _send(self, code: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = _Server(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def url(self, episode_id: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_port}/episodes/{episode_id}/v1"

    @staticmethod
    def reply(messages: list[dict]) -> dict:
        last = messages[-1]
        if last["role"] == "tool":
            message = {"role": "assistant", "content": f"#### {last['content']}"}
            finish = "stop"
        else:
            expr = re.search(r"(\d+ \* \d+)", last["content"])[1]
            call = {
                "id": "c1",
                "type": "function",
                "function": {"name": "calculator", "arguments": json.dumps({"expression": expr})},
            }
            message, finish = {"role": "assistant", "content": None, "tool_calls": [call]}, "tool_calls"
        return {
            "id": "x",
            "object": "chat.completion",
            "created": 0,
            "model": "m",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        }

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def endpoint():
    server = StandIn()
    yield server
    server.close()


def _problems(k: int):
    return [calc_problem(i, "test", kind="small") for i in range(k)]


def _run(endpoint, harness, problems, n=2, timeout_s=5.0, model="m", concurrency=64):
    return run_harness(
        harness, problems, n, base_url=endpoint.url, api_key=KEY, model=model, timeout_s=timeout_s,
        concurrency=concurrency,
    )  # fmt: skip


def test_the_example_harness_solves_every_episode_concurrently_in_problem_order(endpoint) -> None:
    problems = _problems(6)
    eps = _run(endpoint, solve, problems, n=3)
    assert [ep.group for ep in eps] == [b for b in range(6) for _ in range(3)]
    assert [ep.problem for ep in eps] == [p for p in problems for _ in range(3)]
    assert all(ep.fault is None and ep.reward == 1.0 for ep in eps), [(ep.fault, ep.error) for ep in eps]
    assert all(ep.calls == 2 and ep.metrics == {"calculator_calls": 1.0} for ep in eps)
    assert {endpoint.calls[ep.episode_id] for ep in eps} == {2} and len({ep.episode_id for ep in eps}) == 18
    assert endpoint.peak > 1  # episodes overlapped


def test_the_example_calculator_parses_and_never_evaluates() -> None:
    assert calculator("47 * 6") == "282" and calculator(" -3 - 4 ") == "-7"
    assert calculator("__import__('os').system('true')").startswith("error")
    assert calculator("2 ** 99999").startswith("error")


def test_concurrency_bounds_the_episodes_in_flight(endpoint) -> None:
    _run(endpoint, solve, _problems(4), n=2, concurrency=2)
    assert endpoint.peak <= 2


def test_a_plain_def_harness_gets_a_sync_client(endpoint) -> None:
    def plain(client, model, problem):
        out = client.chat.completions.create(model=model, messages=[{"role": "user", "content": problem.prompt}])
        return float(out.choices[0].finish_reason == "tool_calls")

    eps = _run(endpoint, plain, _problems(2))
    assert [ep.reward for ep in eps] == [1.0] * 4 and all(ep.calls == 1 for ep in eps)


async def _raises(client, model, problem):
    raise RuntimeError("a harness bug")


async def _hangs(client, model, problem):
    await client.chat.completions.create(model=model, messages=[{"role": "user", "content": problem.prompt}])
    await __import__("asyncio").sleep(60)


def _hangs_in_a_thread(client, model, problem):
    time.sleep(30)
    return 1.0


async def _never_calls(client, model, problem):
    return 1.0


async def _other_model(client, model, problem):
    await client.chat.completions.create(model="gpt-5", messages=[{"role": "user", "content": problem.prompt}])
    return 1.0


async def _not_a_reward(client, model, problem):
    await client.chat.completions.create(model=model, messages=[{"role": "user", "content": problem.prompt}])
    return {"reward": float("nan")}


@pytest.mark.parametrize(
    ("harness", "fault"),
    [
        (_raises, "error"),
        (_hangs, "timeout"),
        (_hangs_in_a_thread, "timeout"),
        (_other_model, "wrong_model"),
        (_not_a_reward, "bad_reward"),
    ],
)
def test_each_fault_is_counted_never_raised_and_never_hangs(endpoint, harness, fault) -> None:
    assert fault in FAULTS
    t0 = time.perf_counter()
    eps = _run(endpoint, harness, _problems(2), timeout_s=0.5)
    assert time.perf_counter() - t0 < 15  # the limit holds (it sleeps 60 s, a thread 30 s; slack for a busy box)
    assert [ep.fault for ep in eps] == [fault] * 4, [ep.error for ep in eps]
    assert all(ep.reward == 0.0 and ep.metrics == {} and ep.error for ep in eps)


def test_a_harness_that_never_calls_the_model_sends_nothing(endpoint) -> None:
    eps = _run(endpoint, _never_calls, _problems(1))
    assert [ep.calls for ep in eps] == [0, 0] and not endpoint.calls  # the caller marks it no_calls from the records


def test_a_wrong_key_is_an_episode_error_not_a_crash(endpoint) -> None:
    eps = run_harness(solve, _problems(1), 2, base_url=endpoint.url, api_key="nope", model="m", timeout_s=5.0)
    assert [ep.fault for ep in eps] == ["error", "error"] and "401" in eps[0].error


def test_episode_result_reads_numbers_and_reward_dicts_only() -> None:
    assert episode_result(1) == (1.0, {})
    assert episode_result({"reward": 0.5, "turns": 2, "note": "x", "flag": True}) == (0.5, {"turns": 2.0})
    for bad in (None, "1.0", True, float("inf"), {"score": 1.0}, {"reward": "1"}):
        assert episode_result(bad) is None


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("p3o.examples.agent_openai", "package.module:function"),
        ("p3o.no_such_module:solve", "cannot import"),
        ("p3o.examples.agent_openai:nothing", "no function 'nothing'"),
        ("verifiers:p3o_no_such_env", "cannot import 'p3o_no_such_env'"),
    ],
)
def test_a_wrong_harness_spec_is_one_line_naming_the_option(spec, says) -> None:
    with pytest.raises(ConfigError, match=r"agent\.harness") as info:
        load_harness(spec)
    assert says in str(info.value) and "\n" not in str(info.value)


def test_load_harness_finds_the_example() -> None:
    assert load_harness("p3o.examples.agent_openai:solve") is solve


# -- harness processes (agent.harness_processes) -------------------------------------------------------------------


@pytest.fixture
def importable(monkeypatch):
    """Harness processes import their harness by spec from this process's sys.path: tests/envs (proc_harnesses)
    put on it here, not in the environment."""
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    monkeypatch.delenv("PYTHONPATH", raising=False)


def _procs(spec: str, processes: int = 2, timeout_s: float = 5.0, concurrency: int = 64) -> HarnessProcesses:
    return HarnessProcesses(spec, processes, api_key=KEY, model="m", timeout_s=timeout_s, concurrency=concurrency)


def _template(endpoint) -> str:
    return endpoint.url("{episode}")


def test_harness_processes_run_the_episodes_in_order_across_processes(endpoint, importable) -> None:
    procs = _procs("proc_harnesses:pid")
    try:
        eps = procs.run(new_episodes(_problems(3), 2), _template(endpoint))
        pids = {child.proc.pid for child in procs.children}
        assert [ep.group for ep in eps] == [0, 0, 1, 1, 2, 2]
        assert all(ep.fault is None and ep.calls == 1 for ep in eps)
        assert {int(ep.reward) for ep in eps} == pids and os.getpid() not in pids  # dealt to both, none here
        assert [int(ep.reward) for ep in eps[::2]] == [int(ep.reward) for ep in eps[::2][:1]] * 3  # round-robin
        assert sorted(endpoint.calls) == sorted(ep.episode_id for ep in eps) and procs.active == 0
        again = procs.run(new_episodes(_problems(2), 1), _template(endpoint))  # the same processes, batch after batch
        assert {int(ep.reward) for ep in again} == pids
        children = list(procs.children)
    finally:
        procs.close()
    assert procs.children == [] and all(child.proc.poll() is not None for child in children)  # closed: exited


def test_harness_processes_bound_the_episodes_in_flight(endpoint, importable) -> None:
    procs = _procs("proc_harnesses:solve", processes=2, concurrency=1)
    try:
        eps = procs.run(new_episodes(_problems(4), 2), _template(endpoint))
    finally:
        procs.close()
    assert [ep.reward for ep in eps] == [1.0] * 8 and endpoint.peak <= 2


@pytest.mark.parametrize(("spec", "fault"), [("proc_harnesses:raises", "error"), ("proc_harnesses:hangs", "timeout")])
def test_a_fault_in_a_harness_process_is_counted_like_one_in_process(endpoint, importable, spec, fault) -> None:
    procs = _procs(spec, timeout_s=0.5)
    try:
        t0 = time.perf_counter()
        eps = procs.run(new_episodes(_problems(2), 2), _template(endpoint))
        assert time.perf_counter() - t0 < 15
    finally:
        procs.close()
    assert [ep.fault for ep in eps] == [fault] * 4 and all(ep.reward == 0.0 and ep.error for ep in eps)


def test_a_harness_process_that_dies_fails_its_episodes_and_is_replaced(endpoint, importable) -> None:
    procs = _procs("proc_harnesses:dies_on_first")
    try:
        eps = procs.run(new_episodes(_problems(4), 1), _template(endpoint))  # problem 0 kills process 0
        assert [ep.fault for ep in eps] == ["error", None, "error", None]  # process 0 held problems 0 and 2
        assert "died (exit code 3)" in eps[0].error and [ep.reward for ep in eps[1::2]] == [1.0, 1.0]
        assert procs.restarts == 1 and procs.active == 0
        again = procs.run(new_episodes(_problems(4)[1:], 1), _template(endpoint))  # the fresh process serves
        assert [ep.fault for ep in again] == [None] * 3
    finally:
        procs.close()


def test_a_harness_process_that_cannot_import_its_harness_is_one_line(importable) -> None:
    with pytest.raises(ConfigError, match=r"^agent.harness: the harness process did not start .*no_such_module"):
        _procs("no_such_module:solve", processes=1)
    with pytest.raises(ConfigError, match=r"agent.harness_processes: .* not 'verifiers:x'"):
        _procs("verifiers:x", processes=1)


def test_a_harness_process_killed_between_batches_fails_only_its_share_of_the_next(endpoint, importable) -> None:
    procs = _procs("proc_harnesses:solve")
    try:
        procs.run(new_episodes(_problems(2), 1), _template(endpoint))
        victim = procs.children[1].proc
        victim.kill()
        victim.wait(5)
        eps = procs.run(new_episodes(_problems(4), 1), _template(endpoint))  # process 1 held problems 1 and 3
        assert [ep.fault for ep in eps] == [None, "error", None, "error"] and "died" in eps[1].error
        assert procs.restarts == 1 and procs.children[1].proc.pid != victim.pid
        again = procs.run(new_episodes(_problems(4), 1), _template(endpoint))
        assert [ep.reward for ep in again] == [1.0] * 4
    finally:
        procs.close()
