"""Agent environments: the protocol, the built-ins, tools, the rendering of observations and the episode loop
(docs/agents.md).

    env = make_env("calc")
    messages = env.reset(problem, seed=0)
    step = env.step(turn_text)              # Step(observation, reward, done, info)

The episode loop's names (`p3o.envs.runner`: `run_episodes`, `EpisodeEngine`, ...) are loaded on first use: the
runner imports torch, and the tool worker processes (`p3o.envs.tool_worker`) import this package, so they stay light.
"""

import importlib
from typing import Any

from p3o.envs.base import COUNTERS, Environment, EnvLimits, Message, Step
from p3o.envs.builtin import CalcEnv, GuessEnv, calc_transcript, guess_problems
from p3o.envs.registry import ENV_NAMES, env_problems, env_splits, make_env
from p3o.envs.render import Renderer, default_mode, stop_ids
from p3o.envs.tools import CALCULATOR, ParseError, Tool, ToolCall, ToolResult, ToolRunner, load_tool, parse_tool_calls

_RUNNER = ("EPISODE_STATS", "EpisodeEngine", "run_episodes")  # p3o.envs.runner, loaded on first use

__all__ = [
    "CALCULATOR",
    "COUNTERS",
    "ENV_NAMES",
    "EPISODE_STATS",
    "CalcEnv",
    "EnvLimits",
    "Environment",
    "EpisodeEngine",
    "GuessEnv",
    "Message",
    "ParseError",
    "Renderer",
    "Step",
    "Tool",
    "ToolCall",
    "ToolResult",
    "ToolRunner",
    "calc_transcript",
    "default_mode",
    "env_problems",
    "env_splits",
    "guess_problems",
    "load_tool",
    "make_env",
    "parse_tool_calls",
    "run_episodes",
    "stop_ids",
]


def __getattr__(name: str) -> Any:
    if name in _RUNNER:  # importlib, not an import statement: the runner (torch) loads only when asked for
        return getattr(importlib.import_module("p3o.envs.runner"), name)
    raise AttributeError(f"module 'p3o.envs' has no attribute {name!r}")
