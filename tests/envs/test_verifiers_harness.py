"""A `verifiers` environment as a p3o harness (``agent.harness: verifiers:<module>``, `p3o.envs.verifiers_harness`):
the shipped example (p3o/examples/verifiers_calc.py, no p3o import) run by verifiers' own ``Env.run_episode`` against
p3o's endpoint on the shipped tiny-chat base; every row is what the endpoint served (its prompt ids, the sampled ids
with their recorded log-probs, the observation ids between turns), it trains end to end inside ``p3o train``, and a
wrong module is one line.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("verifiers.v1", reason="the verifiers extra (pip install -e '.[verifiers]')")
pytest.importorskip("fastapi", reason="the serve extra (pip install -e '.[serve]')")

from p3o.config import load_config
from p3o.envs.harness import HarnessEngine, load_harness
from p3o.envs.verifiers_harness import CHAT_HARNESS, VerifiersHarness, described, load_verifiers, untitled
from p3o.errors import ConfigError
from p3o.logprobs import token_logprobs
from p3o.models import load_policy
from p3o.models.chat import CALCULATOR_TOOL
from p3o.rollout import HFEngine
from p3o.serve import EndpointServer
from p3o.train.loop import run

EXAMPLE = "p3o.examples.verifiers_calc"
MODEL = "tiny-chat"
CALC_TOOLS = [CALCULATOR_TOOL]
"""The example's tool as tiny-chat sees it (its chat template renders this list): the openai-SDK example's schema."""


@pytest.fixture(scope="module")
def base() -> tuple[Any, Any]:
    return load_policy(MODEL)


@pytest.fixture(scope="module")
def harness() -> VerifiersHarness:
    return load_verifiers(EXAMPLE)


def test_the_example_imports_only_verifiers() -> None:
    """The example is a verifiers environment as verifiers' scaffold writes it: verifiers and the standard library
    (its tool's argument is described in the docstring's ``Args:``, no pydantic ``Field``)."""
    path = Path(__file__).resolve().parents[2] / "src" / "p3o" / "examples" / "verifiers_calc.py"
    tops = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            tops |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            tops.add((node.module or "").split(".")[0])
    assert tops == {"verifiers", "random", "re"}


def test_the_tools_the_seat_sends_for_the_example_are_the_schema_tiny_chat_was_shown() -> None:
    """The example's MCP tool, listed by MCP as verifiers serves it and made an OpenAI tool as verifiers'
    ``connect_mcp`` does, is sent by p3o's seat (`described`, `untitled`) as exactly `CALC_TOOLS`."""
    import asyncio

    import verifiers.v1 as vf
    from mcp.server.mcpserver import MCPServer

    from p3o.examples.verifiers_calc import CalcToolset

    server = MCPServer("calc")
    CalcToolset(vf.SharedToolsetConfig()).register(server)
    listed = asyncio.run(server.list_tools())
    tools = [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description or "", "parameters": t.input_schema},
        }
        for t in listed
    ]  # verifiers.v1.harnesses.utils.mcp.connect_mcp's shape
    assert "Args:" in tools[0]["function"]["description"]  # MCP passes the whole docstring on
    assert json.dumps([untitled(described(t)) for t in tools]) == json.dumps(CALC_TOOLS)


def test_a_docstrings_args_section_describes_the_parameters_that_have_no_description() -> None:
    doc = """Add two numbers.

    Args:
        a (int): the first,
            on two lines
        b: kept
        c: no parameter

    Returns:
        the sum"""
    props = {"a": {"type": "integer"}, "b": {"type": "integer", "description": "from Field"}}
    tool = {"type": "function", "function": {"name": "add", "description": doc, "parameters": {"properties": props}}}
    before = json.dumps(tool)
    out = described(tool)
    assert out["function"]["description"] == "Add two numbers."
    assert out["function"]["parameters"]["properties"] == {
        "a": {"type": "integer", "description": "the first, on two lines"},
        "b": {"type": "integer", "description": "from Field"},  # MCP's (pydantic's) description wins
    }
    assert json.dumps(tool) == before  # the input is not modified
    plain = {"type": "function", "function": {"name": "f", "description": "No sections.", "parameters": {}}}
    assert described(plain) is plain  # no Args: section, nothing to fill


def test_the_taskset_rows_are_the_problems_held_out_at_the_end(harness) -> None:
    train, held_out = harness.problems(None, 256)
    assert len(train) + len(held_out) == len(harness.tasks) == 720 and len(held_out) == 256
    assert [p.meta["verifiers_task"] for p in train + held_out] == list(range(720))
    assert not {p.prompt for p in train} & {p.prompt for p in held_out}  # every product once: disjoint
    first = train[0]
    a, b = (int(x) for x in first.prompt.removeprefix("What is ").removesuffix("?").split(" * "))
    assert first.answer == str(a * b)
    assert len(harness.problems(10, 5)[0]) == 10
    assert load_harness(f"verifiers:{EXAMPLE}") is harness  # one environment per module and process


def test_tool_schemas_lose_mcps_titles_and_put_type_first() -> None:
    prop = {"title": "Title", "description": "d", "type": "string"}
    schema = {"title": "fArgs", "type": "object", "properties": {"title": prop}, "required": ["title"]}
    expect = {"type": "object", "properties": {"title": {"type": "string", "description": "d"}}, "required": ["title"]}
    assert json.dumps(untitled(schema)) == json.dumps(expect)  # the keys in this order (the model reads the text)


def test_every_row_is_what_the_endpoint_served_and_its_logprobs_are_the_trainers(harness, base, monkeypatch) -> None:
    """Episodes run by verifiers against the endpoint: each row's ids are the served prompt ids + sampled ids +
    observation ids (the tool's result between turns, mask 0), each sampled token's log-prob is the one recorded
    (and the trainer's, fp32), and the reward is the environment's. Every call carries a seed (the harness's
    ``sampling``), so each draw depends on its prompt only: the run is the same every time (its episodes call the
    tool), and a problem's two episodes are one."""
    model, tok = base
    monkeypatch.setattr(harness, "sampling", {**harness.sampling, "seed": 0})
    server = EndpointServer(HFEngine(model, tok, precision="fp32"), tok, model_name=MODEL).start()
    served: dict[str, list[tuple[list[int], list[Any]]]] = {}
    commit = server.store.commit

    def record(pending, choices):  # what the endpoint served for each call: its prompt ids and sampled choices
        served.setdefault(pending.episode, []).append((list(pending.prompt_ids), list(choices)))
        return commit(pending, choices)

    server.store.commit = record
    try:
        problems, _ = harness.problems(None, 256)
        problems = problems[:4]
        prompts = [tok(p.prompt, add_special_tokens=False)["input_ids"] for p in problems]
        by_prompt = {tuple(ids): p for ids, p in zip(prompts, problems)}
        engine = HarnessEngine(server, harness, by_prompt, timeout_s=60.0, pad_id=int(tok.pad_token_id or 0))
        r = engine.generate(prompts, 2)
    finally:
        server.stop()
    assert engine.faults == dict.fromkeys(engine.faults, 0) and len(r) == 8
    assert r.group_ids.tolist() == [0, 0, 1, 1, 2, 2, 3, 3] and r.extras["turns"].sum() >= 8
    assert r.extras["tool_calls"].sum() > 0  # the model called the MCP calculator through verifiers
    for g in range(4):  # seeded: a problem's two episodes drew the same tokens
        assert torch.equal(r.response_ids[2 * g], r.response_ids[2 * g + 1])
    rendered = [  # each episode's first prompt: its user turn under the tools block of exactly CALC_TOOLS
        tok.apply_chat_template(
            [{"role": "user", "content": p.prompt}], tools=CALC_TOOLS, add_generation_prompt=True, tokenize=False
        )
        for p in problems
    ]
    firsts = sorted(tok.decode(c[0][0]) for c in served.values())
    assert firsts == sorted(rendered * 2)
    calls = {tuple(c[-1][0] + c[-1][1][0].ids): c for c in served.values()}
    for i in range(len(r)):
        full = r.prompt_ids[i][r.prompt_mask[i]].tolist() + r.response_ids[i][r.attn[i]].tolist()
        c = calls[tuple(full)]  # the row is one episode's served ids, exactly
        assert r.prompt_ids[i][r.prompt_mask[i]].tolist() == c[0][0]
        mask = r.mask[i][r.attn[i]].tolist()
        expect, at = [], len(c[0][0])
        for prompt, choices in c:  # per call: observation ids since the last call (mask 0), then the sampled ids
            expect += [False] * (len(prompt) - at) + [True] * len(choices[0].ids)
            at = len(prompt) + len(choices[0].ids)
        assert mask == expect
        recorded = [lp for _, choices in c for lp in choices[0].logprobs]
        assert r.rollout_logp[i][r.mask[i]].tolist() == pytest.approx(recorded, abs=1e-6)
        last_turn = tok.decode(r.response_ids[i][r.attn[i]].tolist()).split("<|im_start|>assistant")[-1]
        found = re.findall(r"####\s*(-?\d+)", last_turn)  # the environment's reward, on its last reply
        assert r.rewards[i].item() == float(bool(found) and found[-1] == problems[int(r.group_ids[i])].answer)
    with torch.no_grad():
        trainer, _ = token_logprobs(model, r.prompt_ids, r.prompt_mask, r.response_ids, r.attn, loss_mask=r.mask)
    assert (trainer[r.mask] - r.rollout_logp[r.mask]).abs().max() < 1e-4  # fp32 tolerance


@pytest.mark.slow
def test_the_example_environment_trains_end_to_end(tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    argv = [
        "--config", "agent-verifiers", "--steps", "2", "--rollout.prompts_per_step", "2", "--rollout.group_size", "2",
        "--task.n_eval", "4", "--log.eval_every", "2", "--log.progress", "false", "--log.plot", "false",
        "--log.tensorboard", "false", "--ckpt.every", "0", "--run_dir", str(run_dir),
    ]  # fmt: skip
    out = run(load_config(argv))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    last = rows[-1]
    assert last["episode/failed"] == 0.0 and last["episode/stop_done"] == 4.0, last
    assert last["episode/turns"] >= 1.0 and "episode/vf_turns" in last and "eval_accuracy" in last
    assert json.loads((out / "endpoint.json").read_text())["model"] == MODEL


@pytest.mark.parametrize(
    ("module", "says"),
    [
        ("p3o.no_such_env", "cannot import 'p3o.no_such_env'"),
        ("p3o.examples.agent_openai", "is not a verifiers environment"),
        ("", "must be an importable module path"),
        ("bad name", "must be an importable module path"),
    ],
)
def test_a_module_that_is_not_a_verifiers_environment_is_one_line(module, says) -> None:
    with pytest.raises(ConfigError, match=r"agent\.harness") as info:
        load_harness(f"verifiers:{module}")
    assert says in str(info.value) and "\n" not in str(info.value)


def test_the_chat_harness_is_a_verifiers_harness_verifiers_can_load(harness) -> None:
    import verifiers.v1 as vf

    assert isinstance(harness.env.config.agent.harness, vf.HarnessConfig)
    assert harness.env.config.agent.harness.id == CHAT_HARNESS
    assert harness.env.config.agent.runtime.type == "subprocess"  # local: nothing is provisioned remotely


BROKEN_ENV = """
import verifiers.v1 as vf

__all__ = ["BrokenTaskset"]


class BrokenTaskset(vf.Taskset[vf.Task, vf.TasksetConfig]):
    def load(self):
        raise RuntimeError("no data here")
"""


def test_an_environment_that_does_not_load_or_a_missing_extra_is_one_line(tmp_path, monkeypatch) -> None:
    (tmp_path / "p3o_broken_vf_env.py").write_text(BROKEN_ENV)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=r"agent\.harness") as info:
        load_harness("verifiers:p3o_broken_vf_env")
    assert "does not load (RuntimeError: no data here)" in str(info.value) and "\n" not in str(info.value)
    monkeypatch.setitem(__import__("sys").modules, "verifiers.v1", None)  # as if the extra were not installed
    with pytest.raises(ConfigError, match=r"needs the verifiers extra") as info:
        load_harness("verifiers:another_env")
    assert "\n" not in str(info.value)
