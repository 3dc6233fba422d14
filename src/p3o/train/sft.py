"""`p3o sft`: the supervised warm start of the built-in tiny model on the arithmetic task's worked solutions.

A short run of next-token cross-entropy on `prompt + solution + <|im_end|>` (loss on the solution tokens only),
stopped early on purpose: the base policy should solve some but not most problems (pass@1 around 20–60% at T=1)
so that RL has signal and room to improve.

    p3o sft --out runs/base                    # trains, saves (safetensors + tokenizer), prints pass@1
    path = ensure_base("1m")                     # cached: the second call returns at once
    load_policy(resolve_model_name("tiny"))      # p3o.models.load_policy of the base, built on first use

Where the base is cached, and under which key, is `p3o.models.tiny` (below this floor, so `p3o eval` and
`load_policy("tiny")` find a base without importing the trainer). The key holds the recipe and a fingerprint of
this module's code (`p3o.models.tiny.BASE_SOURCES`): a base built by other code is never reused.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

import torch

from p3o.config import config_field as _f
from p3o.errors import ConfigError
from p3o.models.cache import atomic_build
from p3o.models.tiny import DEFAULT_SIZE, base_dir, code_version, parse_tiny


@dataclass
class SFTConfig:
    """The warm-start recipe (``p3o sft --help``; parsed and checked by the project's one config mechanism)."""

    size: Literal["1m", "5m", "30m"] = _f("1m", "model size (p3o.models.configs.SIZES)")
    task: Literal["arithmetic"] = _f("arithmetic", "the built-in task the base learns")
    difficulty: int = _f(2, "task difficulty the base is evaluated on (and keyed by in the cache)", ge=1)
    train_levels: str = _f(
        "1,2",
        "comma-separated difficulty levels mixed uniformly in the SFT data ('' = difficulty only): easier levels "
        "teach the single steps that harder chains compose",
    )
    seed: int = _f(0, "seed for data, init and sampling")
    steps: int = _f(600, "optimiser steps (the early stop that keeps the base imperfect)", ge=1)
    batch_size: int = _f(32, "sequences per step", ge=1)
    lr: float = _f(5e-3, "peak AdamW learning rate (linear warm-up, cosine decay to 10%: p3o.train.step)", gt=0)
    warmup_steps: int = _f(30, "linear warm-up length (steps)", ge=0)
    weight_decay: float = _f(0.01, "AdamW weight decay", ge=0)
    vocab_size: int = _f(512, "target BPE vocabulary size (the tokenizer may stop earlier on a small corpus)", ge=16)
    eval_n: int = _f(128, "held-out test problems for the pass@1 estimate after training (0: skip)", ge=0)
    eval_temperature: float = _f(1.0, "sampling temperature of that estimate", gt=0)
    max_new_tokens: int = _f(48, "generation budget of that estimate", ge=1)
    threads: int = _f(0, "torch CPU threads (0: leave as is)", ge=0)

    def _cross_check(self) -> None:
        from p3o.tasks.arithmetic import LEVELS

        for part in self.train_levels.split(","):
            if part.strip() and (not part.strip().isdigit() or int(part) not in LEVELS):
                known = ", ".join(map(str, LEVELS))
                raise ConfigError(f"train_levels: {part.strip()!r} is not a level; known: {known}")


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


def pass_at_1(
    model: Any,
    tokenizer: Any,
    problems: list[Any],
    *,
    temperature: float = 1.0,
    max_new_tokens: int = 48,
    seed: int = 0,
    template: str = "default",
    verifier: str | None = None,
    task: str = "arithmetic",
) -> float:
    """Mean reward of one sample per problem: pass@1 = (1/n) Σ_i r(y_i, answer_i), y_i ~ π(·|x_i) at temperature T.

    Sampled and scored by `p3o.eval.runner.evaluate` (the one evaluation sampler); the verifier is `verifier`, else
    the task's own (`p3o.tasks.default_verifier`). 0.0 for no problems.
    """
    from p3o.eval.runner import evaluate
    from p3o.tasks import default_verifier

    if not problems:
        return 0.0
    result = evaluate(
        model,
        tokenizer,
        problems,
        n_samples=1,
        ks=(1,),
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        verifier=verifier or default_verifier(task, problems),
        template=template,
        batch_prompts=64,
        seed=seed,
        task=task,
    )
    return result.mean_reward


def warm_start(cfg: SFTConfig, out_dir: str | Path, log: bool = True) -> dict[str, Any]:
    """Train the built-in model per `cfg`, save it to `out_dir` (safetensors + tokenizer + sft.json), return stats.

    Stats: params, steps, final_loss, train_s / train_cpu_s (wall / CPU time of tokenizer + data + training),
    threads, pass_at_1 (on `eval_n` test problems of `difficulty` at `eval_temperature`, or None), eval_s.
    """
    from transformers import GenerationConfig, Qwen3ForCausalLM

    from p3o.models.configs import qwen3_config
    from p3o.models.tokenizer import build_tokenizer
    from p3o.tasks import format_prompt, load_task
    from p3o.train.step import make_scheduler

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    t0, c0 = time.perf_counter(), time.process_time()
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    tok = build_tokenizer(cfg.task, vocab_size=cfg.vocab_size, seed=cfg.seed)
    model = Qwen3ForCausalLM(qwen3_config(cfg.size, len(tok), tok.pad_token_id, tok.bos_token_id, tok.eos_token_id))
    model.train()
    n_train = cfg.steps * cfg.batch_size
    levels = [int(x) for x in cfg.train_levels.split(",") if x.strip()] or [cfg.difficulty]
    problems = []
    for level in levels:
        problems += load_task(cfg.task, "train", seed=cfg.seed, n=n_train // len(levels) + 1, difficulty=level)
    random.Random(cfg.seed).shuffle(problems)
    problems = problems[:n_train]
    examples = encode_examples(tok, [format_prompt(p, tok) for p in problems], [p.solution for p in problems])
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95))
    # linear warm-up, then cosine decay to 0.1·lr at the last step: the trainer's own schedule
    sched = make_scheduler(
        opt, warmup_steps=cfg.warmup_steps, total_steps=cfg.steps, schedule="cosine", min_factor=0.1
    )
    loss_val = float("nan")
    for step in range(cfg.steps):
        batch = collate(examples[step * cfg.batch_size : (step + 1) * cfg.batch_size], tok.pad_token_id)
        loss = model(**batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        loss_val = float(loss.detach())
        if log and (step % 50 == 0 or step == cfg.steps - 1):
            print(f"sft step {step:4d}  loss {loss_val:.4f}  {time.perf_counter() - t0:6.1f}s", flush=True)
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
        "pass_at_1": None,
        "eval_s": 0.0,
    }
    if cfg.eval_n > 0:
        t1 = time.perf_counter()
        test = load_task(cfg.task, "test", seed=cfg.seed, n=cfg.eval_n, difficulty=cfg.difficulty)
        stats["pass_at_1"] = pass_at_1(
            model,
            tok,
            test,
            temperature=cfg.eval_temperature,
            max_new_tokens=cfg.max_new_tokens,
            seed=cfg.seed,
            task=cfg.task,
        )
        stats["eval_s"] = round(time.perf_counter() - t1, 2)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    info = {"config": asdict(cfg), "stats": stats, "code_version": code_version()}
    (out / "sft.json").write_text(json.dumps(info, indent=2))
    return stats


def recipe_hash(cfg: SFTConfig) -> str | None:
    """8 hex digits of sha1(the recipe) when `cfg` differs from the default recipe of its size/task/difficulty/seed.

    None for the default recipe (its cache key carries no hash). `threads` is not part of the recipe.
    """
    custom = asdict(replace(cfg, threads=0))
    default = asdict(replace(SFTConfig(), size=cfg.size, task=cfg.task, difficulty=cfg.difficulty, seed=cfg.seed))
    if custom == default:
        return None
    return hashlib.sha1(json.dumps(custom, sort_keys=True).encode()).hexdigest()[:8]


def ensure_base(
    size: str = DEFAULT_SIZE,
    cache_dir: str | Path | None = None,
    *,
    task: str = "arithmetic",
    difficulty: int = 2,
    seed: int = 0,
    force: bool = False,
    sft: SFTConfig | None = None,
) -> Path:
    """Path of the warm-started base for (size, task, difficulty, seed), training and caching it on first use.

    The entry is `p3o.models.tiny.base_dir(...)` (its key: the recipe and the code version), built by `warm_start`
    through `p3o.models.cache.atomic_build`. `sft` overrides the recipe; its size/task/difficulty/seed are replaced
    by the arguments here, and a non-default recipe gets its own cache entry (`recipe_hash` appended to the key).
    """
    from p3o.models.configs import SIZES

    if size not in SIZES:
        raise ConfigError(f"model size: unknown {size!r}; known: {', '.join(SIZES)}")
    cfg = replace(sft or SFTConfig(), size=size, task=task, difficulty=difficulty, seed=seed)
    target = base_dir(size, cache_dir, task=task, difficulty=difficulty, seed=seed, recipe=recipe_hash(cfg))
    return atomic_build(target, lambda tmp: warm_start(cfg, tmp), force=force)


def resolve_model_name(name: str, cache_dir: str | Path | None = None) -> str:
    """The directory of the warm-started base when `name` is "tiny" / "tiny-<size>" (built on first use), else `name`.

    What `p3o train` passes to `p3o.models.load_policy`, which loads a built base but never trains one (an unknown
    size, e.g. "tiny-7b", is returned as is: load_policy names the known sizes).
    """
    from p3o.models.configs import SIZES

    tiny = parse_tiny(name)
    if tiny is None or tiny[1] or tiny[0] not in SIZES or Path(name).exists():
        return name
    return str(ensure_base(tiny[0], cache_dir))


_EXTRA = [
    ("--out DIR", "output dir (default: the cache entry that ensure_base uses)"),
    ("--force", "retrain even if the cache holds this base"),
]


def main(argv: list[str] | None = None) -> int:
    """`p3o sft [--size 5m] [--difficulty 2] [--steps N] [--out DIR] [--force]`: train, save, print JSON stats.

    Options are parsed by `p3o.config.load_config(cls=SFTConfig)`: the same types, bounds, nearest-name errors and
    `--help` as `p3o train` (`--batch-size` and `--batch_size` are the same key).
    """
    import sys

    from p3o.config import config_help, load_config

    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a in {"-h", "--help"} for a in argv):
        print("usage: p3o sft [--size 5m] [--steps N] [--out DIR] [--force] [--key value ...]\n")
        print(config_help(SFTConfig, extra=_EXTRA))
        return 0
    out, force, rest = None, False, []
    i = 0
    while i < len(argv):
        name, eq, val = argv[i].partition("=")
        if name == "--out":
            if not eq:
                if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                    raise ConfigError("--out: expected a directory")
                val, i = argv[i + 1], i + 1
            out = val
        elif name == "--force":
            force = True
        else:
            rest.append(argv[i])
        i += 1
    cfg = load_config(rest, cls=SFTConfig)
    args = argparse.Namespace(out=out, force=force)
    if args.out:
        stats = warm_start(cfg, args.out)
        path = Path(args.out)
    else:
        path = ensure_base(
            cfg.size, task=cfg.task, difficulty=cfg.difficulty, seed=cfg.seed, force=args.force, sft=cfg
        )
        stats = json.loads((path / "sft.json").read_text())["stats"]
    print(json.dumps({"path": str(path), **stats}))
    return 0
