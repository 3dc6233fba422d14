"""Tools: the safe calculator, tool-call parsing, and the worker pool (raise, hang, flood, parallel, latency)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from fractions import Fraction

import pytest

from p3o.envs.tools import (
    CALCULATOR,
    ParseError,
    ToolCall,
    ToolRunner,
    calculate,
    calculator,
    cut_text,
    load_tool,
    parse_tool_calls,
    tool_info,
)
from p3o.errors import ConfigError

# ------------------------------------------------------------------------------------------------------------------
# The calculator
# ------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "out"),
    [
        ("4821 * 37", "178377"),
        ("48213 + 9921 + 77310", "135444"),
        ("-(3 + 4) * 2", "-14"),
        ("7 // 2", "3"),
        ("-7 // 2", "-4"),
        ("7 % 3", "1"),
        ("2 ** 10", "1024"),
        ("2 ** -2", "0.25"),
        ("1.5 * 2", "3"),  # integral results are exact integers
        ("0.1 + 0.2", "0.3"),  # decimals are exact, not binary floats
        ("1 / 3", "0.3333333333"),
        ("1 / 3 * 3", "1"),
        ("+5", "5"),
        (" 12×3 ", "36"),
        ("((((1))))", "1"),
    ],
)
def test_the_calculator_is_exact(expr: str, out: str) -> None:
    assert calculator({"expression": expr}) == out


@pytest.mark.parametrize(
    ("expr", "error"),
    [
        ("__import__('os').system('true')", ValueError),
        ("x + 1", ValueError),
        ("abs(-1)", ValueError),
        ("(1).real", ValueError),
        ("'a' * 3", ValueError),
        ("lambda: 1", ValueError),
        ("[1, 2]", ValueError),
        ("1 < 2", ValueError),
        ("1e5", ValueError),  # exponent notation: not a plain decimal
        ("1_000", ValueError),
        ("3j", ValueError),
        ("", ValueError),
        ("1 +", ValueError),
        ("1" * 201, ValueError),  # the length cap
        ("2 ** 100000", OverflowError),
        ("9 ** 9 ** 9", OverflowError),
        ("2 ** 0.5", ValueError),
        ("1 / 0", ZeroDivisionError),
        ("5 % 0", ZeroDivisionError),
        ("0 ** -1", ZeroDivisionError),
        ("-" * 60 + "1", ValueError),  # nesting cap
    ],
)
def test_the_calculator_refuses_what_is_not_bounded_arithmetic(expr: str, error: type) -> None:
    with pytest.raises(error):
        calculate(expr)


def test_the_calculator_keeps_values_bounded_and_never_calls_eval(monkeypatch) -> None:
    import builtins

    def no(*a, **k):
        raise AssertionError("eval / exec called")

    monkeypatch.setattr(builtins, "eval", no)
    monkeypatch.setattr(builtins, "exec", no)
    assert calculate("10 ** 300") == Fraction(10) ** 300
    with pytest.raises(OverflowError):
        calculate("10 ** 300 * 10 ** 300")
    with pytest.raises(ValueError):
        calculator({"expr": "1"})


# ------------------------------------------------------------------------------------------------------------------
# Parsing
# ------------------------------------------------------------------------------------------------------------------


def test_calc_markup_parses_and_an_unclosed_tag_is_a_parse_error() -> None:
    assert parse_tool_calls("so 4821 * 37 = <calc>4821 * 37</calc>", "calc") == [
        ToolCall("calc", {"expression": "4821 * 37"})
    ]
    assert parse_tool_calls("#### 178377", "calc") == []
    [err] = parse_tool_calls("<calc>4821 * 3", "calc")
    assert isinstance(err, ParseError) and "without </calc>" in err.message
    [stray] = parse_tool_calls("4821 * 37</calc>", "calc")  # stopped at the close of a call it never opened
    assert isinstance(stray, ParseError) and "</calc> without <calc>" in stray.message
    call, stray = parse_tool_calls("<calc>1+1</calc> and 2</calc>", "calc")
    assert call == ToolCall("calc", {"expression": "1+1"}) and isinstance(stray, ParseError)
    with pytest.raises(ValueError, match="BitXor"):
        calculate("2 ^ 10")


def test_qwen_calls_parse_several_per_turn_and_malformed_ones_are_parse_errors() -> None:
    turn = (
        'Let me compute.<tool_call>\n{"name": "calc", "arguments": {"expression": "1+1"}}\n</tool_call>'
        '<tool_call>{"name": "calc", "arguments": "{\\"expression\\": \\"2\\"}"}</tool_call>'  # arguments as a string
        "<tool_call>{not json}</tool_call>"
        '<tool_call>{"arguments": {}}</tool_call>'  # no name
        '<tool_call>{"name": "calc", "arguments": [1]}</tool_call>'
        '<tool_call>{"name": "calc"'  # unclosed
    )
    got = parse_tool_calls(turn, "qwen", max_calls=10)
    assert got[:2] == [ToolCall("calc", {"expression": "1+1"}), ToolCall("calc", {"expression": "2"})]
    assert [type(c) for c in got[2:]] == [ParseError] * 4
    assert "not valid JSON" in got[2].message and "without </tool_call>" in got[5].message
    capped = parse_tool_calls(turn, "qwen", max_calls=1)
    assert len(capped) == 2 and "at most 1 tool calls" in capped[1].message
    assert parse_tool_calls("[" * 100_000, "qwen") == []  # never raises on model text
    assert isinstance(parse_tool_calls("<tool_call>" + "[" * 100_000 + "</tool_call>", "qwen")[0], ParseError)
    with pytest.raises(ConfigError):
        parse_tool_calls("x", "hermes")


def test_cut_text_keeps_both_ends_and_says_how_much_went() -> None:
    assert cut_text("abc", 5) == ("abc", 0)
    text, cut = cut_text("a" * 10 + "b" * 10, 6)
    assert cut == 14 and text == "aaa…[cut 14 chars]…bbb"


# ------------------------------------------------------------------------------------------------------------------
# User tools
# ------------------------------------------------------------------------------------------------------------------


def test_load_tool_takes_functions_and_tool_objects_and_refuses_in_one_line() -> None:
    echo = load_tool("env_fixtures:echo")
    assert echo.name == "echo" and echo.schema["function"]["description"] == "Echo the arguments back as JSON."
    assert echo.run({"a": 1}) == '{"a": 1}'
    tool = load_tool("env_fixtures:ECHO_TOOL")
    assert tool.name == "echo2" and tool.spec == "env_fixtures:ECHO_TOOL"
    for spec, words in [
        ("env_fixtures", "expected 'package.module:name'"),
        ("no_such_module_xyz:f", "cannot import no_such_module_xyz"),
        ("env_fixtures:missing", "has no attribute 'missing'"),
        ("env_fixtures:NOT_A_TOOL", "not a function"),
    ]:
        with pytest.raises(ConfigError, match=words) as err:
            load_tool(spec)
        assert "\n" not in str(err.value)


# ------------------------------------------------------------------------------------------------------------------
# The worker pool
# ------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runner():
    tools = [CALCULATOR, *(load_tool(f"env_fixtures:{n}") for n in ("boom", "hang", "flood", "slow", "exits", "echo"))]
    r = ToolRunner(tools, timeout_s=1.0, max_output_chars=100, workers=3)
    r.start()
    yield r
    r.close()


def test_tool_failures_are_observations_and_counted(runner: ToolRunner) -> None:
    calls = [
        ToolCall("calc", {"expression": "4821 * 37"}),
        ToolCall("boom", {"x": 7}),
        ToolCall("flood", {}),
        ToolCall("calc", {"expression": "1/0"}),
        ToolCall("nope", {}),
        ParseError("error: the tool call is not valid JSON"),
    ]
    ok, raised, flooded, zero, unknown, parse = runner.run_many(calls)
    assert (ok.output, ok.status) == ("178377", "ok")
    assert (raised.output, raised.status) == ("error: ValueError: bad input 7", "error")
    assert flooded.status == "flood" and len(flooded.output) < 130 and "…[cut 4999900 chars]…" in flooded.output
    assert zero.output == "error: ZeroDivisionError: division by zero"
    assert unknown.status == "parse_error" and "unknown tool 'nope'" in unknown.output
    assert parse.status == "parse_error" and parse.latency_s == 0.0
    info = tool_info([ok, raised, flooded, zero, unknown, parse])
    assert {k: v for k, v in info.items() if k != "tool_latency_s"} == {
        "tool_calls": 4.0,
        "tool_errors": 3.0,
        "tool_timeouts": 0.0,
        "parse_errors": 2.0,
    }
    assert info["tool_latency_s"] > 0


def test_a_hung_tool_is_killed_at_the_limit_and_the_next_call_is_served(runner: ToolRunner) -> None:
    pids = {w.pid for w in runner._workers}
    t0 = time.monotonic()
    [hung] = runner.run_many([ToolCall("hang", {})])
    assert (hung.output, hung.status) == ("error: timeout after 1s", "timeout")
    assert 0.9 < hung.latency_s < 3.0 and time.monotonic() - t0 < 3.0
    assert tool_info([hung])["tool_timeouts"] == 1.0 and tool_info([hung])["tool_errors"] == 1.0
    dead = pids - {w.pid for w in runner._workers}
    assert len(dead) == 1  # the overrunning worker was killed (a spare replaces it)
    for pid in dead:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert runner.run(ToolCall("calc", {"expression": "2+3"})).output == "5"
    [died] = runner.run_many([ToolCall("exits", {})])  # a tool that kills its worker
    assert died.status == "error" and "died" in died.output
    assert runner.run(ToolCall("calc", {"expression": "2*3"})).output == "6"


def test_a_fault_on_the_runner_side_is_an_error_result(runner: ToolRunner, monkeypatch) -> None:
    def broken(call):
        raise KeyError("value")

    monkeypatch.setattr(runner, "_run_one", broken)
    [res] = runner.run_many([ToolCall("calc", {"expression": "1"})])
    assert res.status == "error" and res.output == "error: KeyError: 'value'"


def test_calls_run_in_parallel_and_latency_is_measured_per_call(runner: ToolRunner) -> None:
    t0 = time.monotonic()
    results = runner.run_many([ToolCall("slow", {"s": 0.4})] * 3)
    wall = time.monotonic() - t0
    assert [r.output for r in results] == ["done"] * 3
    assert all(0.35 < r.latency_s < 2.0 for r in results)
    assert wall < 1.1, wall  # one after another would take >= 1.2 s


def test_artificial_latency_and_close_leaves_no_process() -> None:
    with ToolRunner([CALCULATOR], timeout_s=2.0, workers=1, latency_s=0.2) as r:
        r.start()
        [res] = r.run_many([ToolCall("calc", {"expression": "1+1"})])
        assert res.output == "2" and res.latency_s >= 0.2
        pid = r._workers[0].pid
    assert r.closed and pid is not None
    time.sleep(0.05)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    with pytest.raises(ConfigError):
        ToolRunner([CALCULATOR], timeout_s=0)
    with pytest.raises(RuntimeError, match="closed"):
        r.run_many([ToolCall("calc", {"expression": "1"})])


def test_a_tool_that_allocates_past_the_memory_cap_reads_an_error() -> None:
    with ToolRunner([load_tool("env_fixtures:hog")], timeout_s=5.0, workers=1, memory_gib=1.0) as r:
        res = r.run(ToolCall("hog", {"gib": 2}))
        assert res.status == "error" and res.output.startswith("error: MemoryError"), res


_ORPHAN_SCRIPT = """
import json, sys, threading, time
from p3o.envs.tools import CALCULATOR, ToolCall, ToolRunner
r = ToolRunner([CALCULATOR], workers=2)
caller = threading.Thread(target=lambda: r.run_many([ToolCall("calc", {"expression": "1+1"})] * 2))
caller.start()
caller.join()  # the thread that asked for the calls is gone; the workers were started by the runner's own threads
time.sleep(0.3)
print(json.dumps([w.pid for w in r._workers]), r.run(ToolCall("calc", {"expression": "2+2"})).output, flush=True)
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as fh:
            return not any(line.startswith("State:") and "Z" in line.split()[1] for line in fh)
    except FileNotFoundError:
        return False


def test_workers_outlive_the_calling_thread_and_die_with_the_trainer() -> None:
    proc = subprocess.Popen([sys.executable, "-c", _ORPHAN_SCRIPT], stdout=subprocess.PIPE, text=True)
    try:
        pids_json, output = proc.stdout.readline().rsplit(" ", 1)
        pids = json.loads(pids_json)
        assert output.strip() == "4" and len(set(pids)) == 2 and all(_alive(p) for p in pids)
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 5
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(p) for p in pids)  # PR_SET_PDEATHSIG: no orphaned tool process


def test_calls_queued_behind_a_killed_worker_are_not_charged_and_its_children_die(tmp_path) -> None:
    """Issue 51 item 7: after a hung call is killed, calls that wait while the spare still imports (1.5 s here, past
    the 0.5 s limit) run in full and return, not 'timeout'; the hung tool's own child process dies with its worker."""
    tools = [load_tool("slow_import_tools:quick"), load_tool("slow_import_tools:spawn_and_hang")]
    pid_file = tmp_path / "child.pid"
    with ToolRunner(tools, timeout_s=0.5, workers=1) as r:
        r.start()
        [hung] = r.run_many([ToolCall("spawn_and_hang", {"pid_file": str(pid_file)})])
        assert hung.status == "timeout"
        child = int(pid_file.read_text())
        results = r.run_many([ToolCall("quick", {}), ToolCall("quick", {})])
        assert [(x.status, x.output) for x in results] == [("ok", "quick")] * 2
        deadline = time.monotonic() + 5
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child)  # the killed worker's process group went with it
