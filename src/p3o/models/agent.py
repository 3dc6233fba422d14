"""The agent testbed's base, ``tiny-agent``: the main tiny base taught to call the calculator tool.

The main base (``tiny``, the arithmetic warm start) knows the chat template, the ``#### N`` answer format and how to
restate the numbers of a question, but cannot multiply a 4-digit by a 3-digit number. ``tiny-agent`` is that model
with four tokens added to its tokenizer (``AGENT_TOKENS``, appended at the end of the vocabulary: the main tokenizer's
ids are unchanged) and a short supervised warm start on calc-environment episodes written out
(`p3o.envs.builtin.calc_transcript`), built exactly as an RL episode is (the environment's prompt,
`p3o.envs.render.Renderer.transcript`):

    <|im_start|>user\\nWhat is 4821 * 37?\\nUse <calc>expression</calc> ...<|im_end|>\\n<|im_start|>assistant\\n
    <calc>4821 * 37</calc><result>178377</result>\\n#### 178377<|im_end|>                     (one line)

with the loss on the model's segments only (the ``<result>…</result>`` observation is context, as in RL). A share
``AGENT_RECIPE["tool_share"]`` of the transcripts call the tool, the rest answer directly with the worked solution,
which the model cannot compute: the base calls the tool on some problems, so RL has a behaviour to strengthen. (A
random init with the same recipe did not learn to copy the operands: the arithmetic warm start is what teaches it.)

    model, tok = load_policy("tiny-agent")  # the shipped base (p3o.models.bases): nothing is built
    path = ensure_agent_base()            # a build from the current code, cached by code and recipe (the main base's
                                          # build first); its sft.json says whether it has the shipped weights
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer, GenerationConfig, Qwen3ForCausalLM

from p3o.envs.builtin import CalcEnv, calc_transcript
from p3o.envs.render import Renderer
from p3o.models.bases import WEIGHTS, compare, file_sha256
from p3o.models.cache import atomic_build, cache_root
from p3o.models.chat import init_tag, main_base
from p3o.models.tiny import BASE_SOURCES, DEFAULT_SIZE, code_version
from p3o.models.warmstart import batched, sft_steps
from p3o.tasks.calc import load_calc

__all__ = ["AGENT_RECIPE", "AGENT_SOURCES", "AGENT_TOKENS", "agent_base_dir", "ensure_agent_base", "warm_start_agent"]

AGENT_TOKENS = ("<calc>", "</calc>", "<result>", "</result>")
"""The calculator markup, one token each (``</calc>`` is the turn's stop token; `p3o.envs.render` needs single ids)."""

AGENT_RECIPE: dict[str, Any] = {
    "size": DEFAULT_SIZE,
    "steps": 300,
    "batch_size": 16,
    "lr": 2e-3,
    "warmup_steps": 20,
    "tool_share": 0.5,
    "seed": 0,
}
"""The warm start, from the main base of that size: steps × batch transcripts, AdamW lr (linear warm-up, cosine to
10 %), the share of transcripts that call the tool."""

# What builds the agent base besides the main base's own sources (its key fingerprints them).
AGENT_SOURCES: tuple[str, ...] = (
    "models/agent.py",
    "tasks/calc.py",
    "envs/builtin.py",
    "envs/render.py",
    "envs/tools.py",
)


def agent_base_dir(cache_dir: str | Path | None, init: str | Path) -> Path:
    """``<cache>/models/tiny-agent-1m-c<code version of the main base + AGENT_SOURCES>-r<recipe>-i<init weights>``."""
    recipe = hashlib.sha256(json.dumps(AGENT_RECIPE, sort_keys=True).encode()).hexdigest()[:6]
    version = code_version((*BASE_SOURCES, *AGENT_SOURCES))
    return cache_root(cache_dir) / "models" / f"tiny-agent-{DEFAULT_SIZE}-c{version}-r{recipe}{init_tag(init)}"


def _examples(tok: Any, n: int, seed: int, tool_share: float) -> list[tuple[list[int], list[int]]]:
    """(input_ids, labels) of `n` calc episodes written out, built exactly as an RL episode is (the calc
    environment's prompt, `p3o.envs.render.Renderer.transcript`): labels −100 on the prompt and the observations."""
    env = CalcEnv()
    renderer = Renderer(tok, mode="plain")
    rng = random.Random(seed)
    out = []
    for p in load_calc("train", seed=seed, n=n, kind="small"):
        messages = [*env.reset(p, seed=0), *calc_transcript(p, use_tool=rng.random() < tool_share)]
        prompt, ids, mask = renderer.transcript(messages, stop_strings=env.stop_strings)
        labels = [-100] * len(prompt) + [t if m else -100 for t, m in zip(ids, mask)]
        out.append((prompt + ids, labels))
    return out


def warm_start_agent(init_dir: str | Path, out_dir: str | Path, log: bool = True) -> dict[str, Any]:
    """Add `AGENT_TOKENS` to the main base in `init_dir` (its tokenizer and an embedding row each, at the mean of the
    others), warm-start it on calc transcripts (`AGENT_RECIPE`), save it to `out_dir` (safetensors + tokenizer +
    sft.json); return the statistics."""
    rc = AGENT_RECIPE
    t0 = time.perf_counter()
    random.seed(rc["seed"])
    torch.manual_seed(rc["seed"])
    tok = AutoTokenizer.from_pretrained(init_dir)
    tok.add_tokens(list(AGENT_TOKENS), special_tokens=True)  # appended after the main vocabulary: its ids stay
    model = Qwen3ForCausalLM.from_pretrained(init_dir, dtype=torch.float32)
    old_vocab = model.get_input_embeddings().weight.shape[0]
    model.resize_token_embeddings(len(tok), mean_resizing=False)
    with torch.no_grad():  # new rows start at the mean of the old ones (deterministic, no sampling)
        emb = model.get_input_embeddings().weight
        emb[old_vocab:] = emb[:old_vocab].mean(0, keepdim=True)
    model.train()
    examples = _examples(tok, rc["steps"] * rc["batch_size"], rc["seed"], rc["tool_share"])
    batches = batched(examples, rc["batch_size"], tok.pad_token_id)
    optim = {"lr": rc["lr"], "weight_decay": 0.01, "warmup_steps": rc["warmup_steps"]}
    loss_val = sft_steps(model, batches, **optim, label="agent sft" if log else None)
    model.eval()
    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
    )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    stats = {"steps": rc["steps"], "final_loss": loss_val, "train_s": round(time.perf_counter() - t0, 2)}
    stats["sha256"] = file_sha256(out / WEIGHTS)
    stats["shipped"] = compare("tiny-agent", out / WEIGHTS, dict(rc))  # has this build the shipped weights?
    (out / "sft.json").write_text(json.dumps({"recipe": rc, "stats": stats}, indent=2))
    return stats


def ensure_agent_base(cache_dir: str | Path | None = None, *, force: bool = False) -> Path:
    """Path of the ``tiny-agent`` base, warm-started on first use from the main base every run loads (the shipped
    one while current, else the cache's build: `p3o.models.chat.main_base`, as the chat base starts) and cached
    (`p3o.models.cache.atomic_build`)."""
    init = main_base(cache_dir)
    target = agent_base_dir(cache_dir, init)
    return atomic_build(target, lambda tmp: warm_start_agent(init, tmp), force=force)
