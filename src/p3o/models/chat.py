"""The endpoint testbed's base, ``tiny-chat``: the main tiny base speaking Qwen3-style tool calls through its template.

An ``openai``-SDK harness sends ``messages`` and ``tools`` to p3o's endpoint, which renders them with the model's
chat template (`transformers` ``apply_chat_template(messages, tools=tools, add_generation_prompt=True)``) and parses
``<tool_call>`` JSON out of what the model samples. ``tiny-chat`` is the main base (``tiny``, the arithmetic warm
start) with

* four markers added to its tokenizer, one id each (`CHAT_TOKENS`, appended after the main vocabulary, so the main
  tokenizer's ids are unchanged; added as Qwen3's tokenizer has them: single tokens that are not "special", so a
  decode with ``skip_special_tokens=True`` keeps the markup a tool-call parser reads, while ``<|im_end|>`` goes);
* the words of the tools block and of a call as tokens of their own (`CHAT_WORDS`, after the markers);
* `CHAT_TEMPLATE`: Qwen3's published tool layout, with the prose of its tools block shortened (with the calculator's
  schema the system block is 187 tokens; Qwen3's wording would make it 339) and without Qwen3's reasoning handling
  (no ``<think>``). With tools, a system block::

      <|im_start|>system
      [the system message's content, then a blank line, when the first message is a system message]
      # Tools

      Functions:
      <tools>
      {"type": "function", "function": {...}}            (one JSON object per line, transformers' tojson)
      </tools>

      Call one as:
      <tool_call>
      {"name": <function-name>, "arguments": <args-json-object>}
      </tool_call><|im_end|>

  then each message: ``<|im_start|>ROLE\\nCONTENT<|im_end|>\\n`` (user, a later system message); an assistant turn
  ``<|im_start|>assistant\\nCONTENT`` + each of its ``tool_calls`` as ``<tool_call>\\n{"name": NAME, "arguments":
  ARGS}\\n</tool_call>`` (after a ``\\n`` when content or another call precedes it; ARGS as given when a string, the
  OpenAI SDK's form, else ``tojson``) + ``<|im_end|>\\n``; ``tool`` messages inside one user turn per run of
  consecutive ones, each ``\\n<tool_response>\\nCONTENT\\n</tool_response>``; ``add_generation_prompt``:
  ``<|im_start|>assistant\\n``. Without tools a system message is a plain turn, as in ChatML;
* a context of `CHAT_RECIPE` ``["context"]`` positions (the main base's config says 512; its rotary position code
  has no learned positions, so the longer context changes no weight; the warm start's transcripts are at most
  about 260 tokens long, and positions past them are untrained);
* a short supervised warm start on ``calc-small`` episodes (`p3o.tasks.calc.load_calc`) written out with the
  calculator schema the example harness sends (`CALCULATOR_TOOL`) and built exactly as an endpoint episode's row
  is (`p3o.envs.render.Renderer`, chat mode: the template's prompt, each assistant turn's ids + EOS with the loss,
  each tool result as the fixed-base delta without it)::

      user: What is 47 * 6?
      assistant: <tool_call>\\n{"name": "calculator", "arguments": {"expression": "47 * 6"}}\\n</tool_call>
      tool: 282
      assistant: #### 282

  A share ``CHAT_RECIPE["tool_share"]`` of the transcripts calls the tool; the rest answer directly with the worked
  solution (``47 * 6 = 282\\n#### 282``), which the model cannot compute: so the base calls the tool on some
  problems and not others, and RL has a behaviour to strengthen (held-out pass@1: `p3o.models.chat_eval`). Every
  transcript starts with the same ~190 ids (the system block with the tools, up to ``What is``): they are read once
  per step without gradient (`_SharedPrefixLM`), and each row trains on its own ~30–70 ids after them (a few times
  less compute than whole rows; the same loss, the gradient through the prefix's keys and values dropped).

The main base it starts from is the shipped ``tiny`` (`main_base`), the model every run loads, while the current
sources build it (else the cache's build of them); its weights' sha256 ends the cache key (`init_tag`), and
``python -m p3o.models.ship --check`` says when the shipped main base changed under a shipped ``tiny-chat``.

    model, tok = load_policy("tiny-chat")   # the shipped base (p3o.models.bases): nothing is built
    path = ensure_chat_base()               # a build from the current code, cached by code, recipe and main base
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from pathlib import Path
from typing import Any

import torch
from tokenizers import AddedToken
from torch import Tensor, nn
from transformers import AutoTokenizer, GenerationConfig, Qwen3ForCausalLM

from p3o.envs.render import Renderer
from p3o.logprobs import cache_kwarg
from p3o.models.bases import WEIGHTS, compare, file_sha256, manifest, shipped_dir, sources_fingerprint
from p3o.models.cache import atomic_build, cache_root
from p3o.models.tiny import BASE_SOURCES, DEFAULT_SIZE, code_version
from p3o.models.warmstart import batched, ensure_base, sft_recipe, sft_steps, testbed_recipe
from p3o.tasks.base import Problem
from p3o.tasks.calc import load_calc

__all__ = [
    "CALCULATOR_TOOL",
    "CHAT_NAME",
    "CHAT_RECIPE",
    "CHAT_SOURCES",
    "CHAT_TEMPLATE",
    "CHAT_TOKENS",
    "CHAT_WORDS",
    "chat_base_dir",
    "chat_tokenizer",
    "chat_transcript",
    "ensure_chat_base",
    "init_tag",
    "main_base",
    "shipped_main",
    "tool_call_text",
    "warm_start_chat",
]

CHAT_NAME = "tiny-chat"
CHAT_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
"""Qwen3's tool markers, one token each (appended to the main vocabulary: ids 469..472 of ``tiny-chat``)."""

CHAT_WORDS = (
    "type",
    "function",
    "name",
    "calculator",
    "description",
    "arguments",
    "expression",
    "parameters",
    "object",
    "properties",
    "string",
    "required",
    "Evaluate",
    "arithmetic",
    "Tools",
    "Functions",
    "Call",
)
"""Words of the tools block and of a call, one token each when they stand alone (``single_word``), appended after
`CHAT_TOKENS`: a real tokenizer's BPE has them as words, the tiny one (trained on arithmetic) spells them a letter or
two per token. With them the prompt with the calculator tool is 206 tokens instead of 350, and a call
``<tool_call>\\n{"name": "calculator", "arguments": {"expression": "47 * 6"}}\\n</tool_call>`` 35 instead of 56."""

CALCULATOR_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. 47 * 6"}},
            "required": ["expression"],
        },
    },
}
"""The function tool of the example ``openai``-SDK harness, exactly as it sends it (the warm start's schema)."""

CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages and messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nFunctions:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nCall one as:\\n<tool_call>\\n"
    '{"name": <function-name>, "arguments": <args-json-object>}'
    "\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif messages and messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.content is string %}{%- set content = message.content %}{%- else %}{%- set content = '' %}"
    "{%- endif %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' + content }}"
    "{%- for call in message.tool_calls or [] %}"
    "{%- if content or not loop.first %}{{- '\\n' }}{%- endif %}"
    "{%- if call.function is defined %}{%- set call = call.function %}{%- endif %}"
    '{{- \'<tool_call>\\n{"name": "\' + call.name + \'", "arguments": \' }}'
    "{%- if call.arguments is string %}{{- call.arguments }}{%- else %}{{- call.arguments | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
"""Qwen3's tool-call chat template, its tools prose shortened, no reasoning handling (the module docstring)."""

CHAT_RECIPE: dict[str, Any] = {
    "size": DEFAULT_SIZE,
    "context": 1024,
    "steps": 700,
    "batch_size": 16,
    "lr": 5e-3,
    "warmup_steps": 20,
    "tool_share": 0.5,
    "seed": 0,
}
"""The warm start, from the main base of that size: its context (max_position_embeddings), steps × batch
transcripts, AdamW lr (linear warm-up, cosine to 10 %), the share of transcripts that call the tool."""

# What builds the chat base besides the main base's own sources (its key fingerprints them).
CHAT_SOURCES: tuple[str, ...] = ("models/chat.py", "tasks/calc.py", "envs/render.py")


def shipped_main() -> Path | None:
    """The shipped main base (``tiny``) while the current sources and recipe are the ones it was built from (its
    manifest, `p3o.models.bases`), else None."""
    folder = shipped_dir("tiny")
    if folder is None:
        return None
    info = manifest("tiny")
    current = info["sources"]["specs"] == list(BASE_SOURCES)
    current = current and info["sources"]["fingerprint"] == sources_fingerprint(BASE_SOURCES)
    return folder if current and info["recipe"] == sft_recipe(testbed_recipe(2, CHAT_RECIPE["size"])) else None


def main_base(cache_dir: str | Path | None = None) -> Path:
    """The main base the chat base starts from: the shipped one (`shipped_main`), the model every run loads, built
    once on one CPU kind (a rebuild on another kind has other weights); else the cache's build of the current code
    (`p3o.models.warmstart.ensure_base`, built first if needed)."""
    return shipped_main() or ensure_base(CHAT_RECIPE["size"], cache_dir)


def init_tag(init: str | Path) -> str:
    """``-i<sha256[:8] of the weights>`` of the main base a chat base starts from (the last part of its key)."""
    return f"-i{file_sha256(Path(init) / WEIGHTS)[:8]}"


def chat_base_dir(cache_dir: str | Path | None, init: str | Path) -> Path:
    """``<cache>/models/tiny-chat-1m-c<code version of the main base + CHAT_SOURCES>-r<recipe>-i<init weights>``."""
    recipe = hashlib.sha256(json.dumps(CHAT_RECIPE, sort_keys=True).encode()).hexdigest()[:6]
    version = code_version((*BASE_SOURCES, *CHAT_SOURCES))
    return cache_root(cache_dir) / "models" / f"{CHAT_NAME}-{DEFAULT_SIZE}-c{version}-r{recipe}{init_tag(init)}"


def tool_call_text(name: str, arguments: dict[str, Any]) -> str:
    """A tool call as the template renders an assistant message's ``tool_calls`` entry (and as the model samples
    it): ``<tool_call>\\n{"name": NAME, "arguments": ARGS}\\n</tool_call>``, ARGS as ``json.dumps`` writes it."""
    return f'<tool_call>\n{{"name": {json.dumps(name)}, "arguments": {json.dumps(arguments)}}}\n</tool_call>'


def chat_transcript(problem: Problem, use_tool: bool) -> list[dict[str, Any]]:
    """A calc-small episode written out, the user message first: with the tool, the call, its result (a ``tool``
    message, the integer) and ``#### N``; without, the worked solution (``47 * 6 = 282\\n#### 282``)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": problem.prompt}]
    if not use_tool:
        return [*messages, {"role": "assistant", "content": problem.solution or f"#### {problem.answer}"}]
    expr = str(problem.meta.get("expression") or problem.prompt.removeprefix("What is ").rstrip("?"))
    name = CALCULATOR_TOOL["function"]["name"]
    return [
        *messages,
        {"role": "assistant", "content": tool_call_text(name, {"expression": expr})},
        {"role": "tool", "content": problem.answer},
        {"role": "assistant", "content": f"#### {problem.answer}"},
    ]


def _examples(tok: Any, n: int, seed: int, tool_share: float) -> list[tuple[list[int], list[int]]]:
    """(input_ids, labels) of `n` calc-small transcripts built as an endpoint row is (`Renderer.transcript`, chat
    mode, the calculator tool): labels −100 on the prompt and the tool results."""
    renderer = Renderer(tok, mode="chat", max_obs_tokens=10_000, tools=[CALCULATOR_TOOL])
    rng = random.Random(seed)
    out = []
    for p in load_calc("train", seed=seed, n=n, kind="small"):
        prompt, ids, mask = renderer.transcript(chat_transcript(p, use_tool=rng.random() < tool_share))
        labels = [-100] * len(prompt) + [t if m else -100 for t, m in zip(ids, mask)]
        out.append((prompt + ids, labels))
    return out


class _SharedPrefixLM(nn.Module):
    """The model reading every row of a batch after one shared prefix (the system block with the tools, the same
    ids in every transcript), whose keys and values are computed once per call without gradient.

    forward(input_ids (B, S), attention_mask (B, S), labels (B, S)) = the model's output on [prefix ‖ input_ids]
    with the prefix's keys and values detached: the same loss as on whole rows (the prefix carries no loss), at
    the cost of the rows' S tokens instead of P + S (P ≈ 190). The gradient that would reach the weights
    through the prefix's keys and values is dropped."""

    def __init__(self, model: nn.Module, prefix: list[int]) -> None:
        super().__init__()
        self.model = model
        self.prefix = torch.tensor([prefix], dtype=torch.long)

    def forward(self, input_ids: Tensor, attention_mask: Tensor, labels: Tensor) -> Any:
        b, p = input_ids.shape[0], self.prefix.shape[1]
        with torch.no_grad():
            out = self.model(input_ids=self.prefix, use_cache=True)
        cache = out.past_key_values if getattr(out, "cache", None) is None else out.cache
        cache.batch_repeat_interleave(b)
        mask = torch.cat([torch.ones(b, p, dtype=attention_mask.dtype), attention_mask], dim=1)
        positions = torch.arange(p, p + input_ids.shape[1]).unsqueeze(0).expand(b, -1)
        kw = {cache_kwarg(self.model) or "past_key_values": cache}
        return self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions, labels=labels, **kw)


def _split_prefix(examples: list[tuple[list[int], list[int]]]) -> tuple[list[int], list[tuple[list[int], list[int]]]]:
    """The ids every example starts with (all without loss) and the examples after them."""
    first = examples[0][0]
    n = min(len(ids) for ids, _ in examples) - 1
    for ids, labels in examples:
        n = next((i for i in range(n) if ids[i] != first[i] or labels[i] != -100), n)
    return first[:n], [(ids[n:], labels[n:]) for ids, labels in examples]


def chat_tokenizer(init_dir: str | Path) -> Any:
    """The main base's tokenizer in `init_dir` with `CHAT_TOKENS`, then `CHAT_WORDS` (whole words only) appended,
    and `CHAT_TEMPLATE`."""
    tok = AutoTokenizer.from_pretrained(init_dir)
    tok.add_tokens(list(CHAT_TOKENS), special_tokens=False)  # single ids after the main vocabulary, as in Qwen3
    tok.add_tokens([AddedToken(w, single_word=True, normalized=False, special=False) for w in CHAT_WORDS])
    tok.chat_template = CHAT_TEMPLATE
    tok.model_max_length = CHAT_RECIPE["context"]
    return tok


def _init_rows(model: Any, tok: Any, main_vocab: int) -> None:
    """Embedding rows of the added tokens: a marker at the mean of the main vocabulary's rows, a word at the mean of
    the rows of the main tokenizer's pieces of it (deterministic, no sampling)."""
    emb = model.get_input_embeddings().weight
    with torch.no_grad():
        emb[main_vocab:] = emb[:main_vocab].mean(0, keepdim=True)
        for word in CHAT_WORDS:
            rows = [tok.convert_tokens_to_ids(t.value) for t in tok.backend_tokenizer.model.tokenize(word)]
            emb[tok.convert_tokens_to_ids(word)] = emb[rows].mean(0)


def warm_start_chat(init_dir: str | Path, out_dir: str | Path, log: bool = True) -> dict[str, Any]:
    """Add `CHAT_TOKENS` and `CHAT_TEMPLATE` to the main base in `init_dir` (an embedding row per token at the mean
    of the others; the context set to the recipe's), warm-start it on calc-small transcripts (`CHAT_RECIPE`), save
    it to `out_dir` (safetensors + tokenizer + sft.json); return the statistics."""
    rc = CHAT_RECIPE
    t0 = time.perf_counter()
    random.seed(rc["seed"])
    torch.manual_seed(rc["seed"])
    tok = chat_tokenizer(init_dir)
    model = Qwen3ForCausalLM.from_pretrained(init_dir, dtype=torch.float32)
    model.config.max_position_embeddings = rc["context"]  # rotary positions: no weight depends on it
    main_vocab = model.get_input_embeddings().weight.shape[0]
    model.resize_token_embeddings(len(tok), mean_resizing=False)
    _init_rows(model, tok, main_vocab)
    model.train()
    examples = _examples(tok, rc["steps"] * rc["batch_size"], rc["seed"], rc["tool_share"])
    prefix, rows = _split_prefix(examples)
    batches = batched(rows, rc["batch_size"], tok.pad_token_id)
    optim = {"lr": rc["lr"], "weight_decay": 0.01, "warmup_steps": rc["warmup_steps"]}
    loss_val = sft_steps(_SharedPrefixLM(model, prefix), batches, **optim, label="chat sft" if log else None)
    model.eval()
    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
    )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    stats = {
        "steps": rc["steps"],
        "final_loss": loss_val,
        "max_tokens": max(len(ids) for ids, _ in examples),
        "shared_prefix": len(prefix),
        "train_s": round(time.perf_counter() - t0, 2),
        "init_sha256": file_sha256(Path(init_dir) / WEIGHTS),
    }
    stats["sha256"] = file_sha256(out / WEIGHTS)
    stats["shipped"] = compare(CHAT_NAME, out / WEIGHTS, dict(rc))  # has this build the shipped weights?
    (out / "sft.json").write_text(json.dumps({"recipe": rc, "stats": stats}, indent=2))
    return stats


def ensure_chat_base(cache_dir: str | Path | None = None, *, force: bool = False) -> Path:
    """Path of the ``tiny-chat`` base, warm-started from the main base (`main_base`) on first use and cached
    (`p3o.models.cache.atomic_build`)."""
    init = main_base(cache_dir)
    return atomic_build(chat_base_dir(cache_dir, init), lambda tmp: warm_start_chat(init, tmp), force=force)
