"""The supervised warm start of the built-in tiny model: what built the shipped bases, and builds any other.

A short run of next-token cross-entropy on `prompt + solution + <|im_end|>` (loss on the solution tokens only),
stopped early on purpose: the base policy should solve some but not most problems so that RL has signal and room.
The bases the presets use (``tiny``, ``tiny-pad``; ``tiny-agent`` starts from ``tiny``) ship inside the package
(`p3o.models.bases`): `resolve_tiny` returns their shipped directory and builds nothing. Other sizes (``tiny-5m``,
``tiny-30m``) are built on first use and cached; ``p3o sft`` (`p3o.train.sft`) rebuilds any of them into the cache,
reports pass@1 and says whether the rebuild has the shipped weights (`warm_start`'s ``shipped`` statistic).

    path = ensure_base("1m")                  # built into the cache on first use; the second call returns at once
    path = resolve_tiny("tiny-pad")           # the shipped scratchpad testbed's base (p3o.models.tiny.TESTBEDS)
    path = resolve_tiny("tiny-5m")            # not shipped: built once, cached
    name = resolve_model_name("tiny")         # the base's directory for tiny names, any other name as is

Where a built base is cached and under which key is `p3o.models.tiny` (the key holds the recipe and a fingerprint of
this module's code, `p3o.models.tiny.BASE_SOURCES`): a base built by other code is never reused.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor

from p3o.errors import ConfigError
from p3o.models.bases import SHIPPED, WEIGHTS, compare, file_sha256, shipped_dir
from p3o.models.cache import atomic_build
from p3o.models.configs import SIZES, qwen3_config
from p3o.models.tiny import DEFAULT_SIZE, TESTBEDS, base_dir, code_version, parse_tiny
from p3o.models.tokenizer import build_tokenizer
from p3o.options import config_field as _f
from p3o.tasks import format_prompt, load_task
from p3o.tasks.arithmetic import LEVELS
from p3o.tasks.scratchpad import is_level

__all__ = [
    "SFTConfig",
    "collate",
    "encode_examples",
    "ensure_base",
    "lr_factor",
    "recipe_hash",
    "resolve_model_name",
    "resolve_tiny",
    "sft_recipe",
    "testbed_recipe",
    "warm_start",
]

# Fields of SFTConfig that only steer `p3o sft`'s pass@1 report, not the weights: not part of the recipe.
REPORT_FIELDS = ("eval_n", "eval_temperature", "threads")


@dataclass
class SFTConfig:
    """The warm-start recipe (``p3o sft --help``; parsed and checked by the project's one config mechanism)."""

    size: Literal["1m", "5m", "30m"] = _f("1m", "model size (p3o.models.configs.SIZES)")
    task: Literal["arithmetic"] = _f("arithmetic", "the built-in task the base learns")
    difficulty: int | str = _f(
        2, "task difficulty the base is evaluated on and keyed by in the cache (1..5, or 'pad' / 'pad-hard')"
    )
    train_levels: str = _f(
        "1,2",
        "comma-separated difficulty levels mixed uniformly in the SFT data ('' = difficulty only): easier levels "
        "teach the single steps that harder chains compose",
    )
    seed: int = _f(0, "seed for data, init and sampling")
    steps: int = _f(600, "optimiser steps (the early stop that keeps the base imperfect)", ge=1)
    batch_size: int = _f(32, "sequences per step", ge=1)
    lr: float = _f(5e-3, "peak AdamW learning rate (linear warm-up, cosine decay to 10%)", gt=0)
    warmup_steps: int = _f(30, "linear warm-up length (steps)", ge=0)
    weight_decay: float = _f(0.01, "AdamW weight decay", ge=0)
    vocab_size: int = _f(512, "target BPE vocabulary size (the tokenizer may stop earlier on a small corpus)", ge=16)
    eval_n: int = _f(128, "held-out test problems for p3o sft's pass@1 report after training (0: skip)", ge=0)
    eval_temperature: float = _f(1.0, "sampling temperature of that report", gt=0)
    max_new_tokens: int = _f(48, "generation budget of that report (also the saved generation config's)", ge=1)
    threads: int = _f(0, "torch CPU threads (0: leave as is)", ge=0)
    init: Literal["", "tiny"] = _f(
        "", "starting weights: '' random, 'tiny' the default base of this size and seed (built first if needed)"
    )

    def _cross_check(self) -> None:
        for part in self.train_levels.split(","):
            if part.strip() and not is_level(_level(part)):
                known = ", ".join([*map(str, LEVELS), "pad", "pad-hard"])
                raise ConfigError(f"train_levels: {part.strip()!r} is not a level; known: {known}")


def _level(part: str) -> int | str:
    part = part.strip()
    return int(part) if part.isdigit() else part


def encode_examples(tokenizer: Any, prompts: list[str], solutions: list[str]) -> list[tuple[list[int], list[int]]]:
    """(input_ids, labels) per example; labels are -100 on the prompt (loss on the solution + EOS only)."""
    assert len(prompts) == len(solutions), (len(prompts), len(solutions))
    if not prompts:
        return []
    ps = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    ss = tokenizer(solutions, add_special_tokens=False)["input_ids"]
    eos = tokenizer.eos_token_id
    return [(p + s + [eos], [-100] * len(p) + s + [eos]) for p, s in zip(ps, ss)]


def collate(batch: list[tuple[list[int], list[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad a batch: input_ids (B, L) long, attention_mask (B, L) long, labels (B, L) long (-100 = ignored)."""
    length = max(len(ids) for ids, _ in batch)
    ids = torch.full((len(batch), length), pad_id, dtype=torch.long)
    labels = torch.full((len(batch), length), -100, dtype=torch.long)
    attn = torch.zeros((len(batch), length), dtype=torch.long)
    for i, (x, y) in enumerate(batch):
        ids[i, : len(x)] = torch.tensor(x)
        labels[i, : len(y)] = torch.tensor(y)
        attn[i, : len(x)] = 1
    return {"input_ids": ids, "attention_mask": attn, "labels": labels}


def lr_factor(step: int, warmup_steps: int, total_steps: int, min_factor: float = 0.1) -> float:
    """The warm start's lr multiplier: the trainer's cosine schedule (`p3o.train.step.lr_factor`), restated here.

    warm-up (step + 1) / warmup_steps for step < warmup_steps, then
    min_factor + (1 − min_factor)·½(1 + cos(π·p)),  p = min(1, (step − warmup) / max(1, total − warmup)).
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    p = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_factor + (1 - min_factor) * 0.5 * (1 + math.cos(math.pi * p))


def sft_steps(
    model: torch.nn.Module,
    batches: list[dict[str, Tensor]],
    *,
    lr: float,
    weight_decay: float,
    warmup_steps: int,
    label: str | None = "sft",
) -> float:
    """One supervised step per batch of `batches` (`collate`'s, labels −100 where no loss), in order: AdamW(β = 0.9,
    0.95), the learning rate times `lr_factor` (warm-up, then cosine over len(batches) steps), gradient norm clipped
    at 1. Prints the loss every 50 steps and at the last under `label` (None: silent); returns the last loss."""
    t0, steps = time.perf_counter(), len(batches)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, warmup_steps, steps))
    loss_val = float("nan")
    for step, batch in enumerate(batches):
        loss = model(**batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        loss_val = float(loss.detach())
        if label is not None and (step % 50 == 0 or step == steps - 1):
            print(f"{label} step {step:4d}  loss {loss_val:.4f}  {time.perf_counter() - t0:6.1f}s", flush=True)
    return loss_val


def batched(examples: list[tuple[list[int], list[int]]], batch_size: int, pad_id: int) -> list[dict[str, Tensor]]:
    """`examples` in consecutive batches of `batch_size`, each `collate`d (the last may be shorter)."""
    return [collate(examples[i : i + batch_size], pad_id) for i in range(0, len(examples), batch_size)]


def warm_start(
    cfg: SFTConfig, out_dir: str | Path, log: bool = True, init_dir: str | Path | None = None
) -> dict[str, Any]:
    """Train the built-in model per `cfg`, save it to `out_dir` (safetensors + tokenizer + sft.json), return stats.

    `init_dir`: a saved base to start from (same size and tokenizer; `cfg.init == "tiny"`), else a random init.

    Stats: params, steps, final_loss, train_s / train_cpu_s (wall / CPU time of tokenizer + data + training),
    threads. (``p3o sft`` adds its pass@1 report; the weights do not depend on it.)
    """
    # pinned: the base's cache key hashes this module's syntax tree (p3o.models.tiny): moving it rebuilds the base
    from transformers import GenerationConfig, Qwen3ForCausalLM

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    t0, c0 = time.perf_counter(), time.process_time()
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    tok = build_tokenizer(cfg.task, vocab_size=cfg.vocab_size, seed=cfg.seed)
    if init_dir is not None:
        model = Qwen3ForCausalLM.from_pretrained(init_dir, dtype=torch.float32)
    else:
        config = qwen3_config(cfg.size, len(tok), tok.pad_token_id, tok.bos_token_id, tok.eos_token_id)
        model = Qwen3ForCausalLM(config)
    model.train()
    n_train = cfg.steps * cfg.batch_size
    levels = [_level(x) for x in cfg.train_levels.split(",") if x.strip()] or [cfg.difficulty]
    problems = []
    for level in levels:
        problems += load_task(cfg.task, "train", seed=cfg.seed, n=n_train // len(levels) + 1, difficulty=level)
    random.Random(cfg.seed).shuffle(problems)
    problems = problems[:n_train]
    examples = encode_examples(tok, [format_prompt(p, tok) for p in problems], [p.solution for p in problems])
    batches = batched(examples, cfg.batch_size, tok.pad_token_id)
    optim = {"lr": cfg.lr, "weight_decay": cfg.weight_decay, "warmup_steps": cfg.warmup_steps}
    loss_val = sft_steps(model, batches, **optim, label="sft" if log else None)
    train_s, train_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    model.eval()
    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=cfg.max_new_tokens,
    )
    stats: dict[str, Any] = {
        "params": sum(p.numel() for p in model.parameters()),
        "steps": cfg.steps,
        "final_loss": loss_val,
        "train_s": round(train_s, 2),
        "train_cpu_s": round(train_cpu_s, 2),
        "threads": torch.get_num_threads(),
    }
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    stats["sha256"] = file_sha256(out / WEIGHTS)
    stats["shipped"] = _compare_shipped(cfg, out, log)
    info = {"config": asdict(cfg), "stats": stats, "code_version": code_version()}
    (out / "sft.json").write_text(json.dumps(info, indent=2))
    return stats


def sft_recipe(cfg: SFTConfig) -> dict[str, Any]:
    """A warm-start config as a recipe: its fields, the pass@1 report's (`REPORT_FIELDS`) at their defaults."""
    return asdict(replace(cfg, **{f: getattr(SFTConfig(), f) for f in REPORT_FIELDS}))


def _compare_shipped(cfg: SFTConfig, out: Path, log: bool) -> dict[str, Any] | None:
    """`p3o.models.bases.compare` of a fresh build in `out` with the shipped base of the same recipe (None: none
    is), said on stderr when they differ."""
    found = None
    for name in SHIPPED:
        found = found or compare(name, out / WEIGHTS, sft_recipe(cfg))
    if log and found is not None and not found["equal"]:
        print(
            f"p3o sft: this build differs from the shipped base {found['shipped']}, which every run loads (a build is "
            "bit-exact only on the CPU kind it was made on, and the shipped bases were built on an AVX2-only CPU: "
            "p3o docs main-job says how to force AVX2 code paths); train from this build with --model.name and "
            "the path p3o sft prints, or re-ship it with python -m p3o.models.ship",
            file=sys.stderr,
            flush=True,
        )
    return found


def recipe_hash(cfg: SFTConfig) -> str | None:
    """8 hex digits of sha1(the recipe) when `cfg` differs from the default recipe of its size/task/difficulty/seed.

    The default recipe of a named testbed's difficulty (`testbed_recipe`) counts as default. None for the default
    recipe (its cache key carries no hash). `REPORT_FIELDS` (pass@1 report, threads) are not part of the recipe.
    """
    keep = {f: getattr(SFTConfig(), f) for f in REPORT_FIELDS}
    custom = asdict(replace(cfg, **keep))
    default = asdict(replace(testbed_recipe(cfg.difficulty, cfg.size, cfg.seed), task=cfg.task, **keep))
    if custom == default:
        return None
    return hashlib.sha1(json.dumps(custom, sort_keys=True).encode()).hexdigest()[:8]


def testbed_recipe(difficulty: int | str, size: str = DEFAULT_SIZE, seed: int = 0) -> SFTConfig:
    """The default recipe for a base of `difficulty`: `SFTConfig()` with a named testbed's overrides when one is
    keyed by that difficulty (`p3o.models.tiny.TESTBEDS`)."""
    cfg = replace(SFTConfig(), size=size, difficulty=difficulty, seed=seed)
    for bed in TESTBEDS.values():
        if bed["difficulty"] == difficulty:
            return replace(cfg, **bed["sft"])
    return cfg


def ensure_base(
    size: str = DEFAULT_SIZE,
    cache_dir: str | Path | None = None,
    *,
    task: str = "arithmetic",
    difficulty: int | str = 2,
    seed: int = 0,
    force: bool = False,
    sft: SFTConfig | None = None,
) -> Path:
    """Path of the warm-started base for (size, task, difficulty, seed), training and caching it on first use.

    The entry is `p3o.models.tiny.base_dir(...)` (its key: the recipe and the code version), built by `warm_start`
    through `p3o.models.cache.atomic_build`. `sft` overrides the recipe (default: `testbed_recipe(difficulty)`);
    its size/task/difficulty/seed are replaced by the arguments here, and a non-default recipe gets its own cache
    entry (`recipe_hash` appended to the key).
    """
    if size not in SIZES:
        raise ConfigError(f"model size: unknown {size!r}; known: {', '.join(SIZES)}")
    base = sft or testbed_recipe(difficulty, size, seed)
    cfg = replace(base, size=size, task=task, difficulty=difficulty, seed=seed)
    target = base_dir(size, cache_dir, task=task, difficulty=difficulty, seed=seed, recipe=recipe_hash(cfg))
    init = ensure_base(size, cache_dir, seed=seed) if cfg.init == "tiny" else None  # the main base, first
    return atomic_build(target, lambda tmp: warm_start(cfg, tmp, init_dir=init), force=force)


def resolve_tiny(name: str, cache_dir: str | Path | None = None) -> Path | None:
    """The base directory for a warm-started tiny name: the shipped base for "tiny", "tiny-1m" and a testbed such as
    "tiny-pad" (`p3o.models.bases`: nothing is built or written), the cached build for another size ("tiny-5m", built
    on first use); None for names that are not one (other models, "tiny-random", an unknown size)."""
    tiny = parse_tiny(name)
    if tiny is None or tiny[1]:
        return None
    shipped = shipped_dir(name)
    if shipped is not None:
        return shipped
    size, _ = tiny
    bed = TESTBEDS.get(size)
    if bed is not None:
        return ensure_base(bed["size"], cache_dir, task=bed["task"], difficulty=bed["difficulty"])
    if size not in SIZES:
        return None
    return ensure_base(size, cache_dir)


def resolve_model_name(name: str, cache_dir: str | Path | None = None) -> str:
    """The directory of the warm-started base when `name` is a tiny base name (built on first use), else `name`.

    An existing path is returned as is; so is an unknown size (e.g. "tiny-7b": load_policy names the known ones).
    """
    if Path(name).exists():
        return name
    path = resolve_tiny(name, cache_dir)
    return name if path is None else str(path)
