"""docs/agents.md: the user environment and tool run as written (the file block saved as my_env.py, then the block
that uses it, in a scratch working directory), in at most 40 lines; it scores real episodes of the shipped tiny-agent
exactly as the built-in calc environment does; the page's training command runs; the page keeps its testbed
section."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from p3o.envs import tools

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "agents.md"
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def _python_blocks() -> list[str]:
    return _BLOCK.findall(PAGE.read_text(encoding="utf-8"))


def test_the_user_environment_and_tool_run_as_written(tmp_path, monkeypatch) -> None:
    blocks = _python_blocks()
    [module] = [b for b in blocks if b.startswith("# my_env.py")]
    [usage] = [b for b in blocks if 'make_env("my_env:' in b]
    assert len(module.strip().splitlines()) <= 40
    (tmp_path / "my_env.py").write_text(module, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".")])  # as the `p3o` console script
    try:
        exec(compile(usage, "docs/agents.md (usage)", "exec"), {"__name__": "__docs_snippet__"})
    finally:
        sys.modules.pop("my_env", None)
        for key, runner in list(tools._SHARED.items()):
            if any(spec.startswith("my_env:") for spec in key[0]):
                runner.close()
                tools._SHARED.pop(key)


def test_the_page_documents_the_rules_and_leaves_the_testbed_section() -> None:
    text = PAGE.read_text(encoding="utf-8")
    for words in ("## Token and mask rules", "## Limits", "## Not supported (yet)", "## Running an agent testbed"):
        assert words in text
    for key in ("max_turns", "max_turn_tokens", "max_total_tokens", "max_obs_tokens", "tool_timeout_s"):
        assert f"`agent.{key}`" in text
    assert "`agent.max_tool_output_chars`" in text


@pytest.mark.parametrize("i", range(len(_python_blocks())))
def test_every_python_block_compiles(i: int) -> None:
    compile(_python_blocks()[i], f"docs/agents.md block {i}", "exec")


@pytest.fixture
def my_env(tmp_path, monkeypatch):
    """The page's my_env.py in a scratch working directory (importable as the `p3o` console script finds it)."""
    [module] = [b for b in _python_blocks() if b.startswith("# my_env.py")]
    (tmp_path / "my_env.py").write_text(module, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    sys.modules.pop("my_env", None)
    for key, runner in list(tools._SHARED.items()):
        if any(spec.startswith("my_env:") for spec in key[0]):
            runner.close()
            tools._SHARED.pop(key)


@pytest.mark.slow  # ~8 s alone: 2 × 24 episodes of tiny-agent
def test_the_documented_environment_scores_real_episodes_as_calc_does(my_env) -> None:
    """Issue 51 item 1: on tiny-agent's own episodes (final turns ending in EOS) the page's reward equals the built-in
    calc environment's exact-int reward, episode by episode, and is not 0 everywhere (it was, with the EOS kept)."""
    from p3o.envs import EnvLimits, Renderer, make_env, stop_ids
    from p3o.envs.runner import run_episodes
    from p3o.models import load_policy
    from p3o.rollout import HFEngine
    from p3o.tasks import load_calc

    model, tok = load_policy("tiny-agent")
    problems = load_calc("test", seed=0, n=12, kind="small")
    limits = EnvLimits(max_turns=3, max_turn_tokens=40, max_total_tokens=96, max_obs_tokens=16)
    stops = stop_ids(tok, ("</calc>",), "calc")
    rewards = {}
    for name in ("calc-small", "my_env:Multiply"):
        engine = HFEngine(model, tok, max_new_tokens=40, seed=0, stop_token_ids=stops)
        ro = run_episodes(
            engine,
            lambda name=name: make_env(name, limits=limits),
            problems,
            2,
            renderer=Renderer(tok, mode="plain", max_obs_tokens=16),
            limits=limits,
            seed=0,
            eos_ids=[tok.eos_token_id],
            stop_ids=stops,
        )
        rewards[name] = ro.rewards.tolist()
        finals = [ro.response_ids[i][ro.mask[i]][-1].item() == tok.eos_token_id for i in range(len(ro))]
        assert sum(finals) > len(ro) // 2  # most episodes end at EOS
    assert rewards["my_env:Multiply"] == rewards["calc-small"]
    assert sum(rewards["calc-small"]) >= 1


def test_the_pages_training_command_runs(my_env) -> None:
    """The page's `p3o train --agent.env my_env:Multiply` command trains (one step here) on tiny-agent and calc-small,
    and p3o eval scores its final policy with the same environment."""
    import json

    from p3o.cli import main

    lines = PAGE.read_text().splitlines()
    [command] = [x for x in lines if x.startswith("p3o train") and "--agent.env my_env:Multiply" in x]
    argv = command.split("#")[0].split()
    assert argv[:2] == ["p3o", "train"]
    fast = ["--steps", "1", "--rollout.prompts_per_step", "4", "--task.n_eval", "8", "--log.eval_every", "1"]
    fast += ["--log.progress", "false", "--log.plot", "false", "--ckpt.every", "0", "--run_dir", str(my_env / "run")]
    assert main([*argv[1:], *fast]) == 0
    last = [json.loads(x) for x in (my_env / "run" / "metrics.jsonl").read_text().splitlines()][-1]
    assert last["episode/stop_done"] + last["episode/stop_max_turns"] + last["episode/stop_length"] >= 1
    assert "eval_accuracy" in last
