"""The on-disk cache of built-in models and tokenizers: where it lives and the one way an entry is built.

A leaf module: it imports no other `p3o.models` module, so `hub` (loading), `sft` (the warm-started base) and
`smollm2` (the converted checkpoint) all build their entries through it without importing each other.

    root = cache_root()                                   # $P3O_CACHE, else ~/.cache/p3o
    path = atomic_build(root / "models" / "x", lambda tmp: save_into(tmp))

An entry is written to a temporary sibling directory and renamed into place under an inter-process file lock, so
concurrent callers never see a half-written entry and only one of them builds it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

__all__ = ["atomic_build", "cache_root", "is_complete", "locked"]


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
    """A model entry is usable once its config and weights are both there (it is renamed into place whole)."""
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def atomic_build(
    target: Path,
    build: Callable[[Path], Any],
    force: bool = False,
    *,
    done: Callable[[Path], bool] = is_complete,
) -> Path:
    """`target`, built by `build(tmp_dir)` into a temporary sibling and renamed into place, unless `done(target)`.

    Args:
        target: the cache entry (a directory; its parent is created).
        build: writes the entry's files into the directory it is given.
        force: build again even when `done(target)`; the old entry is replaced whole.
        done: is an existing entry usable? (`is_complete` for a model; e.g. "has tokenizer.json" for a tokenizer).

    The check is repeated under the lock, so of several processes asking at once exactly one builds. A model entry
    (`done` = `is_complete`) says so on stderr, once: what it builds (a first use of its key in this environment:
    another virtual environment has other library versions, hence its own key) and how long it took
    (docs/scaling.md).
    """
    if done(target) and not force:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with locked(target.parent / f".{target.name}.lock"):
        if done(target) and not force:
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
        entry, t0, say = f"{target.parent.name}/{target.name}", time.perf_counter(), done is is_complete
        if say:
            print(
                f"p3o: building {entry} in {target.parent.parent} (first use of this key in this environment, once; "
                "the warm-started tiny base takes about 3 min on a CPU: p3o docs scaling)",
                file=sys.stderr,
                flush=True,
            )
        try:
            build(tmp)
            os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache entry should read like any other dir
            if target.exists():
                old = target.with_name(f".{target.name}.old-{os.getpid()}")
                target.rename(old)
                shutil.rmtree(old, ignore_errors=True)
            tmp.rename(target)
            if say:
                print(f"p3o: built {entry} in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target
