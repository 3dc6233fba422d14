"""`p3o sft`: build the built-in tiny model's warm-started base and report its pass@1.

The warm start itself is `p3o.models.warmstart` (on the models floor, so `load_policy("tiny")`, `p3o eval` and
`p3o mismatch` build the base on first use too); this command trains or finds it and adds the pass@1 report.

    p3o sft --out runs/base                    # trains, saves (safetensors + tokenizer), prints stats + pass@1
    p3o sft --difficulty pad --train-levels pad --steps 400 --max-new-tokens 200    # the scratchpad testbed's base
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from p3o.config import config_help, load_config
from p3o.errors import ConfigError
from p3o.eval.runner import evaluate
from p3o.models import load_pretrained
from p3o.models.warmstart import SFTConfig, ensure_base, resolve_model_name, warm_start
from p3o.tasks import default_verifier, load_task

__all__ = ["SFTConfig", "ensure_base", "main", "pass_at_1", "resolve_model_name"]


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


def report(cfg: SFTConfig, path: Path) -> dict[str, Any]:
    """{"pass_at_1", "eval_s"} of the base at `path` on `cfg.eval_n` held-out problems of `cfg.difficulty`."""
    if cfg.eval_n <= 0:
        return {"pass_at_1": None, "eval_s": 0.0}
    t0 = time.perf_counter()
    model, tok = load_pretrained(path)
    test = load_task(cfg.task, "test", seed=cfg.seed, n=cfg.eval_n, difficulty=cfg.difficulty)
    p1 = pass_at_1(
        model, tok, test, temperature=cfg.eval_temperature, max_new_tokens=cfg.max_new_tokens, seed=cfg.seed
    )
    return {"pass_at_1": p1, "eval_s": round(time.perf_counter() - t0, 2)}


_EXTRA = [
    ("--out DIR", "output dir (default: the cache entry that ensure_base uses)"),
    ("--force", "retrain even if the cache holds this base"),
]


def main(argv: list[str] | None = None) -> int:
    """`p3o sft [--size 5m] [--difficulty 2] [--steps N] [--out DIR] [--force]`: train, save, print JSON stats.

    Options are parsed by `p3o.config.load_config(cls=SFTConfig)`: the same types, bounds, nearest-name errors and
    `--help` as `p3o train` (`--batch-size` and `--batch_size` are the same key).
    """
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
    if out:  # a one-off base outside the cache: its init (the main base) comes from the cache all the same
        init = ensure_base(cfg.size, seed=cfg.seed) if cfg.init == "tiny" else None
        stats = warm_start(cfg, out, init_dir=init)
        path = Path(out)
    else:
        path = ensure_base(cfg.size, task=cfg.task, difficulty=cfg.difficulty, seed=cfg.seed, force=force, sft=cfg)
        stats = json.loads((path / "sft.json").read_text())["stats"]
    print(json.dumps({"path": str(path), **stats, **report(cfg, path)}))
    return 0
