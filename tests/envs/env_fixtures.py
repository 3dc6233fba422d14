"""Tools and environments the environment tests import by `module:name` (this directory is on sys.path in tests, and
the tool worker inherits sys.path)."""

from __future__ import annotations

import json
import os
import time

from p3o.envs.base import Step
from p3o.envs.tools import Tool


def echo(arguments: dict) -> str:
    """Echo the arguments back as JSON."""
    return json.dumps(arguments, sort_keys=True)


def boom(arguments: dict) -> str:
    raise ValueError("bad input " + str(arguments.get("x")))


def hang(arguments: dict) -> str:
    time.sleep(600)
    return "never"


def flood(arguments: dict) -> str:
    return "x" * 5_000_000


def slow(arguments: dict) -> str:
    time.sleep(float(arguments.get("s", 0.3)))
    return "done"


def exits(arguments: dict) -> str:
    os._exit(3)


ECHO_TOOL = Tool(
    name="echo2",
    schema={"type": "function", "function": {"name": "echo2", "parameters": {"type": "object"}}},
    fn=echo,
    spec="env_fixtures:ECHO_TOOL",
)
NOT_A_TOOL = 42


class Counter:
    """A user environment: count to `target`, one number per turn."""

    stop_strings = ()

    def __init__(self, target: int = 3) -> None:
        self.target = target

    def reset(self, problem, seed):
        self.n = 0
        return [{"role": "user", "content": f"Count to {self.target}."}]

    def step(self, turn):
        self.n += 1
        if turn.strip() == str(self.target):
            return Step(reward=1.0, done=True)
        return Step([{"role": "user", "content": "go on"}])

    def close(self):
        pass


class TakesLimits(Counter):
    def __init__(self, limits=None) -> None:
        super().__init__()
        self.limits = limits


class NoStep:
    stop_strings = ()

    def reset(self, problem, seed):
        return []

    def close(self):
        pass


class BadStops(Counter):
    stop_strings = "</x>"


class Raises:
    def __init__(self) -> None:
        raise RuntimeError("cannot make it")


def hog(arguments: dict) -> str:
    return str(len(bytearray(int(arguments.get("gib", 2)) * 2**30)))
