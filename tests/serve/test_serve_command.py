"""`p3o serve` as a user runs it: it answers with the key written to its info file, 401 without it, stops on Ctrl-C
(exit 0); a port in use is one line and exit 2, before the model loads."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import httpx
import pytest

from p3o.cli import main as p3o_main
from p3o.serve.server import bind


@pytest.mark.slow
def test_p3o_serve_answers_with_its_key_and_stops_on_ctrl_c(tmp_path):
    info = tmp_path / "serve.json"
    proc = subprocess.Popen([sys.executable, "-m", "p3o", "serve", "--model", "tiny-agent", "--port", "0", "--info",
                             str(info)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while not info.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert info.exists(), proc.stderr.read() if proc.poll() is not None else "no info file"
        time.sleep(0.2)
        served = json.loads(info.read_text())
        assert (info.stat().st_mode & 0o777) == 0o600 and served["api_key"].startswith("p3o-")
        key = {"Authorization": f"Bearer {served['api_key']}"}
        body = {"model": "tiny-agent", "messages": [{"role": "user", "content": "2 + 2?"}], "max_tokens": 4}
        r = httpx.post(served["base_url"] + "/chat/completions", json=body, headers=key, timeout=120)
        assert r.status_code == 200 and r.json()["choices"][0]["token_ids"]
        assert httpx.get(served["base_url"] + "/models", timeout=30).status_code == 401
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert served["api_key"] not in out + err and served["api_key"][:6] in out  # never logged in full
    assert "requests 2" in err and "unauthorized 1" in err


def test_a_port_in_use_is_one_line_and_exit_2(capsys):
    sock = bind("127.0.0.1", 0)
    try:
        port = sock.getsockname()[1]
        assert p3o_main(["serve", "--port", str(port)]) == 2
    finally:
        sock.close()
    err = capsys.readouterr().err.strip()
    assert err == f"p3o serve: error: serve: port {port} on 127.0.0.1 is already in use (choose another with --port)"


@pytest.mark.slow
def test_p3o_serve_on_the_chat_base_answers_tools_with_structured_tool_calls(tmp_path):
    """The issue's check, on the shipped chat base (Qwen3-style `<tool_call>` markers as single tokens): a chat
    completion with `tools` comes back with structured tool_calls, prompt_token_ids, token_ids, log-probs, versions."""
    from p3o.models.bases import shipped_dir

    if shipped_dir("tiny-chat") is None:
        pytest.skip("tiny-chat is not shipped yet (issue 52 item 6)")
    from p3o.examples.agent_openai import TOOLS
    from p3o.tasks.calc import load_calc

    info = tmp_path / "serve.json"
    proc = subprocess.Popen([sys.executable, "-m", "p3o", "serve", "--model", "tiny-chat", "--port", "0",
                             "--api_key", "K-test-key", "--info", str(info)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while not info.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(0.2)
        served = json.loads(info.read_text())
        key = {"Authorization": "Bearer K-test-key"}
        calls = []
        for problem in load_calc("test", n=8, kind="small"):  # the base calls the calculator on about half of them
            body = {"model": "tiny-chat", "messages": [{"role": "user", "content": problem.prompt}],
                    "tools": TOOLS, "max_tokens": 64, "seed": 0, "logprobs": True}  # fmt: skip
            r = httpx.post(served["base_url"] + "/chat/completions", json=body, headers=key, timeout=120).json()
            ch = r["choices"][0]
            assert r["prompt_token_ids"] and ch["token_ids"] and len(ch["p3o"]["versions"]) == len(ch["token_ids"])
            assert len(ch["logprobs"]["content"]) == len(ch["token_ids"])
            if ch["finish_reason"] == "tool_calls":
                calls += ch["message"]["tool_calls"]
        assert calls and all(c["function"]["name"] == "calculator" for c in calls)
        assert all(isinstance(json.loads(c["function"]["arguments"]), dict) for c in calls)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
