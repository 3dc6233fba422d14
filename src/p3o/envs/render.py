"""Observation messages -> token ids, appended after the model's sampled ids: nothing earlier is re-tokenised.

Two modes (docs/agents.md, "Token and mask rules"):

* ``chat`` (a tokenizer with a chat template, e.g. Qwen3): SkyRL's fixed-base delta. The ids of
  ``template(base + observation, add_generation_prompt=True)`` minus the ids of ``template(base)``, the base cut
  after its last EOS, so the separator that follows EOS (the ``\\n`` after ``<|im_end|>``) opens the observation.
  When the model's turn ended at a stop string (a tool call's close) instead of EOS, the EOS id comes first: the
  template would have closed the turn with it. Consecutive tool messages are one observation (Qwen3 renders them in
  one user turn).
* ``plain`` (the built-in tiny model): tool results after a ``</calc>`` stop are appended inline,
  ``<result>N</result>``, and the model continues the same assistant turn; any other message (user feedback) closes
  the turn (EOS first if the turn did not end with it) and is a ChatML turn, followed by the assistant generation
  prompt: ``\\n<|im_start|>user\\nhigher<|im_end|>\\n<|im_start|>assistant\\n``.

An observation longer than ``max_obs_tokens`` is cut in the middle of its longest message with a visible marker
``…[cut N tokens]…`` (its template tokens are kept), and counted (`Renderer.cuts`).

    renderer = Renderer(tokenizer, mode="plain", max_obs_tokens=32)
    ids = renderer.prompt_ids([{"role": "user", "content": "What is 4821 * 37?"}])
    obs = renderer.observation_ids([{"role": "tool", "content": "178377"}], turn_ended_with_eos=False)
    stops = stop_ids(tokenizer, ("</calc>",))                  # one id per stop string, else ConfigError
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from p3o.envs.base import Message
from p3o.errors import ConfigError

__all__ = ["MODES", "Observation", "Renderer", "default_mode", "stop_ids"]

MODES = ("chat", "plain")
CUT_MARKER = "…[cut {n} tokens]…"
_BASE_WITH_SYSTEM: list[Message] = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
_BASE_USER_ONLY: list[Message] = [{"role": "user", "content": "u"}]


def stop_ids(tokenizer: Any, stop_strings: Sequence[str], env_name: str = "") -> list[int]:
    """The token id of each stop string (engines stop on ids); ConfigError naming the string when one is not a
    single token of `tokenizer` (add it to the tokenizer as a special token)."""
    out = []
    for s in stop_strings:
        ids = tokenizer.encode(s, add_special_tokens=False)
        if len(ids) != 1:
            where = f"environment {env_name!r}: " if env_name else ""
            raise ConfigError(
                f"{where}stop string {s!r} is {len(ids)} tokens of this tokenizer, not one (engines stop on one "
                "token id: add it as a special token)"
            )
        out.append(int(ids[0]))
    return out


def default_mode(tokenizer: Any, env: Any = None) -> str:
    """The environment's ``render_mode`` when it declares one, else "chat" when the tokenizer has a chat template."""
    mode = getattr(env, "render_mode", None)
    if mode in MODES:
        return str(mode)
    return "chat" if getattr(tokenizer, "chat_template", None) else "plain"


@dataclass
class Observation:
    """An observation's ids and how many tokens of its content were cut (0 when it fit ``max_obs_tokens``)."""

    ids: list[int]
    cut: int = 0


class Renderer:
    """Token ids of prompts and observations, for one tokenizer and mode.

    Args:
        tokenizer: a transformers tokenizer (its ``eos_token_id`` ends turns).
        mode: "chat" or "plain" (see the module docstring); None: `default_mode`.
        max_obs_tokens: tokens per observation (``agent.max_obs_tokens``); a longer one is cut with a marker.
        tools: OpenAI function-format schemas passed to the chat template (``tools=``) for the prompt (chat mode).
        template_kwargs: extra chat-template keywords (e.g. ``{"enable_thinking": False}`` for Qwen3).

    Attributes:
        cuts: observations cut so far; cut_tokens: content tokens removed by those cuts.
    """

    def __init__(
        self,
        tokenizer: Any,
        mode: str | None = None,
        max_obs_tokens: int = 32,
        tools: Sequence[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        mode = default_mode(tokenizer) if mode is None else mode
        if mode not in MODES:
            raise ConfigError(f"render mode {mode!r}: known: {', '.join(MODES)}")
        if mode == "chat" and not getattr(tokenizer, "chat_template", None):
            raise ConfigError("render mode 'chat': the tokenizer has no chat template (use mode 'plain')")
        if int(max_obs_tokens) < 1:
            raise ConfigError(f"agent.max_obs_tokens: must be >= 1, got {max_obs_tokens}")
        eos = getattr(tokenizer, "eos_token_id", None)
        if eos is None:
            raise ConfigError("the tokenizer has no EOS token: a turn cannot end")
        self.tokenizer = tokenizer
        self.mode = mode
        self.max_obs_tokens = int(max_obs_tokens)
        self.tools = list(tools) if tools else None
        self.template_kwargs = dict(template_kwargs or {})
        self.eos_id = int(eos)
        self.cuts = 0
        self.cut_tokens = 0
        self._base: tuple[list[Message], list[int]] | None = None
        if mode == "chat":  # a template that cannot be appended to fails here, with one line, not mid-run
            self._delta([{"role": "user", "content": "u"}])

    # -- text and ids --------------------------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """`text`'s ids, no special tokens added (special-token strings in the text are recognised)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _template(self, messages: Sequence[Message], generation_prompt: bool, tools: Any = None) -> str:
        kwargs = dict(self.template_kwargs)
        if tools:
            kwargs["tools"] = tools
        return self.tokenizer.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=generation_prompt, **kwargs
        )

    def prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        """The ids of the episode's first messages plus the assistant generation prompt.

        Chat mode: the chat template (with ``tools`` when given). Plain mode: the tokenizer's template when it has
        one, else literal ChatML (``<|im_start|>role\\ncontent<|im_end|>\\n`` per message, then
        ``<|im_start|>assistant\\n``).
        """
        if getattr(self.tokenizer, "chat_template", None):
            return self.encode(self._template(messages, True, self.tools if self.mode == "chat" else None))
        return self.encode(_chatml(messages, generation_prompt=True))

    # -- observations --------------------------------------------------------------------------------------------

    def observation_ids(self, messages: Sequence[Message], turn_ended_with_eos: bool) -> list[int]:
        """The ids to append after a model turn (see `observation`)."""
        return self.observation(messages, turn_ended_with_eos).ids

    def observation(self, messages: Sequence[Message], turn_ended_with_eos: bool) -> Observation:
        """The ids to append after a model turn that ended with EOS (`turn_ended_with_eos`) or at a stop string,
        ending where the model's next turn starts; cut to ``max_obs_tokens`` (middle of the longest message)."""
        messages = [dict(m) for m in messages]
        if not messages:
            return Observation([])
        ids = self._render(messages, turn_ended_with_eos)
        if len(ids) <= self.max_obs_tokens:
            return Observation(ids)
        return self._cut(messages, turn_ended_with_eos, ids)

    def _render(self, messages: list[Message], ended_with_eos: bool) -> list[int]:
        if self.mode == "chat":
            return ([] if ended_with_eos else [self.eos_id]) + self._delta(messages)
        return self._plain(messages, ended_with_eos)

    def _delta(self, messages: list[Message]) -> list[int]:
        base, base_ids = self._fixed_base()
        full = self.encode(self._template([*base, *messages], True))
        if full[: len(base_ids)] != base_ids:
            raise ConfigError(
                "the chat template does not render a conversation as a prefix of its continuation "
                "(its base changes when messages follow): observations cannot be appended token-exactly"
            )
        return full[len(base_ids) :]

    def _fixed_base(self) -> tuple[list[Message], list[int]]:
        """A short conversation and its ids cut after the last EOS (SkyRL's fixed base), computed once."""
        if self._base is None:
            for base in (_BASE_WITH_SYSTEM, _BASE_USER_ONLY):
                try:
                    ids = self.encode(self._template(base, False))
                except Exception:  # a template that refuses a system message
                    continue
                if self.eos_id in ids:
                    last = len(ids) - 1 - ids[::-1].index(self.eos_id)
                    self._base = (base, ids[: last + 1])
                    break
            else:
                raise ConfigError("the chat template renders no EOS after a message: turns cannot be delimited")
        return self._base

    def _plain(self, messages: list[Message], ended_with_eos: bool) -> list[int]:
        ids: list[int] = []
        closed = ended_with_eos
        for m in messages:
            if m.get("role") == "tool" and not closed:  # inline, the model's turn goes on
                ids += self.encode(f"<result>{m.get('content', '')}</result>")
                continue
            if not closed:
                ids.append(self.eos_id)
                closed = True
            ids += self.encode(f"\n<|im_start|>{m.get('role', 'user')}\n{m.get('content', '')}<|im_end|>")
        if closed:
            ids += self.encode("\n<|im_start|>assistant\n")
        return ids

    def _cut(self, messages: list[Message], ended_with_eos: bool, ids: list[int]) -> Observation:
        """Shrink the longest message's content (in tokens, from the middle, with a marker) until the rendering fits.
        When the template tokens and the marker alone overflow, the ids themselves are cut in the middle, keeping
        more of the end (where the next turn's generation prompt is)."""
        removed = 0
        for _ in range(4):
            excess = len(ids) - self.max_obs_tokens
            if excess <= 0:
                break
            k = max(range(len(messages)), key=lambda i: len(str(messages[i].get("content", ""))))
            content = self.encode(str(messages[k].get("content", "")))
            if not content:
                break
            marker_len = len(self.encode(CUT_MARKER.format(n=len(content))))
            keep = max(len(content) - excess - marker_len, 0)
            head, tail = keep - keep // 2, keep // 2
            gone = len(content) - keep
            removed += gone
            text = self.tokenizer.decode(content[:head]) + CUT_MARKER.format(n=gone)
            messages[k]["content"] = text + (self.tokenizer.decode(content[-tail:]) if tail else "")
            ids = self._render(messages, ended_with_eos)
        if len(ids) > self.max_obs_tokens:
            gone = len(ids) - self.max_obs_tokens
            marker = self.encode(CUT_MARKER.format(n=gone))
            keep = self.max_obs_tokens - len(marker)
            ids = marker + ids[len(ids) - keep :] if keep > 0 else ids[-self.max_obs_tokens :]
            removed += gone
        self.cuts += 1
        self.cut_tokens += removed
        return Observation(ids, removed)

    # -- whole transcripts (warm starts, tests) ------------------------------------------------------------------

    def transcript(
        self, messages: Sequence[Message], stop_strings: Sequence[str] = ()
    ) -> tuple[list[int], list[int], list[bool]]:
        """(prompt ids, response ids, loss mask) of a whole episode written as messages, built exactly as an episode
        is: the prompt is every message before the first assistant message; an assistant message is the model's turn
        (its text's ids, plus EOS unless it ends with one of `stop_strings`; mask True); the messages between two
        assistant messages are an observation (mask False). A trailing observation is dropped."""
        first = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), len(messages))
        prompt = self.prompt_ids(messages[:first])
        ids: list[int] = []
        mask: list[bool] = []
        pending: list[Message] = []
        ended_with_eos = True
        for m in messages[first:]:
            if m.get("role") != "assistant":
                pending.append(m)
                continue
            if pending:
                obs = self.observation_ids(pending, ended_with_eos)
                ids += obs
                mask += [False] * len(obs)
                pending = []
            content = str(m.get("content", ""))
            turn = self.encode(content)
            ended_with_eos = not any(content.endswith(s) for s in stop_strings if s)
            if ended_with_eos:
                turn.append(self.eos_id)
            ids += turn
            mask += [True] * len(turn)
        return prompt, ids, mask


def _chatml(messages: Sequence[Message], generation_prompt: bool) -> str:
    text = "".join(f"<|im_start|>{m.get('role', 'user')}\n{m.get('content', '')}<|im_end|>\n" for m in messages)
    return text + ("<|im_start|>assistant\n" if generation_prompt else "")
