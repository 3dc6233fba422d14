"""The environment seam: what an agent episode talks to between the model's turns.

An environment is made once per episode (by name, like tasks and verifiers: a built-in name or
``package.module:Name``), reset with a problem, and stepped with each finished model turn:

    env = make_env("calc")                                   # p3o.envs.registry
    messages = env.reset(problem, seed=0)                    # the first messages: [{"role": "user", "content": ...}]
    step = env.step(turn_text)                               # Step(observation=[{"role": "tool", ...}], done=False)
    ...                                                      # until step.done; the episode's reward is Σ step.reward
    env.close()

The framework, never the environment, turns messages into token ids (`p3o.envs.render`): the model's sampled ids are
kept as they are, the observation's ids are appended, nothing is decoded and re-tokenised (token in, token out).
``turn_text`` is the decoded text of the model's turn, for parsing only (tool calls, a final answer): its sampled ids
decoded with special tokens kept, without the EOS that ended it (a final answer reads ``#### 324``, not
``#### 324<|im_end|>``); a stop string that ended it (``</calc>``) is kept.

A turn ends at the tokenizer's EOS or at one of the environment's ``stop_strings`` (e.g. ``"</calc>"``, the close of a
tool call); each stop string must be one token of the tokenizer (engines stop on ids), else the run is refused with one
line naming the environment.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Protocol, runtime_checkable

from p3o.errors import ConfigError
from p3o.tasks.base import Problem

__all__ = ["COUNTERS", "EnvLimits", "Environment", "Message", "Step"]

Message = dict[str, str]
"""A chat message: ``{"role": "system" | "user" | "assistant" | "tool", "content": str}``."""

COUNTERS = ("tool_calls", "tool_errors", "tool_timeouts", "parse_errors", "tool_latency_s")
"""The per-step `Step.info` keys the runner sums per episode and logs; any other numeric key is summed and logged
too, under its own name (``episode/<key>`` in metrics.jsonl: its mean per episode)."""


@dataclass
class Step:
    """What an environment returns after one model turn.

    Attributes:
        observation: messages to append before the model's next turn (tool results: role "tool"; feedback: role
            "user"); empty when ``done``.
        reward: added to the episode's return (most environments give the whole reward on the last step).
        done: the episode ends here (the model's last turn was its final answer, or the environment gives up).
        info: per-step counters, summed over the episode: ``tool_calls``, ``tool_errors`` (a tool that raised, hung,
            or returned too much), ``tool_timeouts``, ``parse_errors`` (a malformed call), ``tool_latency_s``.
    """

    observation: list[Message] = field(default_factory=list)
    reward: float = 0.0
    done: bool = False
    info: dict[str, float] = field(default_factory=dict)


@runtime_checkable
class Environment(Protocol):
    """One episode's environment (made fresh for every episode; `close` is always called)."""

    stop_strings: tuple[str, ...]
    """Strings that end a model turn besides EOS (each one token of the tokenizer), e.g. ``("</calc>",)``."""

    def reset(self, problem: Problem, seed: int) -> list[Message]:
        """Start an episode on `problem`; return the first messages (the prompt: system and/or user)."""
        ...

    def step(self, turn: str) -> Step:
        """React to the model's finished turn `turn` (decoded text of its sampled ids, special tokens kept, without
        the EOS that ended it; a stop string that ended it is kept)."""
        ...

    def close(self) -> None:
        """Release what the episode holds (tool workers are shared and stay up)."""
        ...


@dataclass(frozen=True)
class EnvLimits:
    """Limits of one episode (``agent.*`` in the config).

    Attributes:
        max_turns: model turns per episode; the episode is cut after the last (``stop_reason`` "max_turns").
        max_turn_tokens: tokens the model may sample in one turn (each engine call's max_new_tokens, clamped to what
            the episode has left).
        max_total_tokens: response tokens per episode, model and observation together (the row's length T).
        max_obs_tokens: tokens per observation; a longer one is cut in the middle with a visible marker.
        tool_timeout_s: wall-clock limit of one tool call; past it the call is killed and the model reads an error.
        max_tool_output_chars: characters of a tool's result kept before it is cut (a flood is a counted error).
        env_timeout_s: wall-clock limit of one environment `step` (the environment's own code, in the trainer's
            process); past it the episode is cut (``env_timeout``, scored 0) and the step left running in a daemon
            thread.
    """

    max_turns: int = 4
    max_turn_tokens: int = 48
    max_total_tokens: int = 160
    max_obs_tokens: int = 32
    tool_timeout_s: float = 2.0
    max_tool_output_chars: int = 2000
    env_timeout_s: float = 60.0

    @classmethod
    def from_config(cls, agent: Any) -> EnvLimits:
        """The limits of ``agent.*`` (an `AgentConfig` or a run's recorded one; a field it lacks keeps its default)."""
        return cls(**{f.name: getattr(agent, f.name) for f in fields(cls) if hasattr(agent, f.name)})

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_turn_tokens", "max_total_tokens", "max_obs_tokens", "max_tool_output_chars"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"agent.{name}: must be >= 1, got {getattr(self, name)}")
        for name in ("tool_timeout_s", "env_timeout_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"agent.{name}: must be > 0, got {getattr(self, name)}")


def info_number(info: dict[str, Any], key: str) -> float:
    """``info[key]`` as a float (0.0 when absent or not a number)."""
    v = info.get(key, 0.0)
    return float(v) if isinstance(v, (int, float)) else 0.0
