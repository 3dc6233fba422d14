"""Agent environments: the protocol, the built-ins, tools and the rendering of observations (docs/agents.md).

env = make_env("calc")
messages = env.reset(problem, seed=0)
step = env.step(turn_text)              # Step(observation, reward, done, info)
"""

from p3o.envs.base import COUNTERS, Environment, EnvLimits, Message, Step
from p3o.envs.builtin import CalcEnv, GuessEnv, calc_transcript, guess_problems
from p3o.envs.registry import ENV_NAMES, env_problems, make_env
from p3o.envs.render import Renderer, stop_ids
from p3o.envs.tools import CALCULATOR, ParseError, Tool, ToolCall, ToolResult, ToolRunner, load_tool, parse_tool_calls

__all__ = [
    "CALCULATOR",
    "COUNTERS",
    "ENV_NAMES",
    "CalcEnv",
    "EnvLimits",
    "Environment",
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
    "env_problems",
    "guess_problems",
    "load_tool",
    "make_env",
    "parse_tool_calls",
    "stop_ids",
]
