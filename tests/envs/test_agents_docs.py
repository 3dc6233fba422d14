"""docs/agents.md: the user environment and tool run as written (the file block saved as my_env.py, then the block
that uses it, in a scratch working directory), in at most 30 lines; the page keeps its lead-owned testbed section."""

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
    assert len(module.strip().splitlines()) <= 30
    (tmp_path / "my_env.py").write_text(module, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".")])  # as the `p3o` console script
    try:
        exec(compile(usage, "docs/agents.md (usage)", "exec"), {"__name__": "__docs_snippet__"})
    finally:
        sys.modules.pop("my_env", None)
        for key, runner in list(tools._SHARED.items()):
            if "my_env:lookup" in key[0]:
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
