"""The shipped bases: the built-in tiny bases every preset starts from, inside the package (a few MB).

``tiny`` (the main job's base, also ``tiny-1m``), ``tiny-pad`` (the scratchpad testbed), ``tiny-agent`` (the agent
testbed) and ``tiny-chat`` (the endpoint testbed: Qwen3-style tool calls, `p3o.models.chat`) are not built on a user's
machine: their weights and tokenizer ship in ``p3o/models/shipped/<name>/``, so ``make train``, every preset and every
study start from the same model on any CPU (the warm start's kernels differ between CPU kinds, so a base built on an
AVX2-only CPU and one built on an AVX-512 CPU are different models).

    shipped_dir("tiny-1m")      # <package>/models/shipped/tiny ; None for a name that is not shipped ("tiny-5m")
    manifest("tiny")            # what shipped/tiny/manifest.json records (below)
    stamp("tiny")               # {"name", "key", "sha256"}: what a model loaded from it carries (config.p3o_base)
    base_id(stamp("tiny"))      # "tiny@6550aedbf4ee": the name and the weights' sha256, 12 hex digits
    verify("tiny")              # [] when every file has the bytes the manifest records, else the ones that differ

Each ``manifest.json`` records ``name``, ``key`` (the cache key it was built under, `p3o.models.tiny.base_key`),
``code_version``, ``sources`` (the fingerprinted source specs and `sources_fingerprint` of them, library versions left
out), ``libraries``, ``recipe``, ``built_on`` (the CPU) and ``files`` (the sha256 of every other file); ``sha256`` is
the weights' (model.safetensors). `load_policy` loads a shipped base whatever the current sources are: the shipped base
is *the* base. ``p3o sft`` still rebuilds into the cache and says whether the rebuild has the shipped weights;
``python scripts/ship_bases.py`` rebuilds and re-ships (`p3o.models.ship`, docs/main-job.md).

A leaf beside `p3o.models.tiny` (no torch): the grid runner reads a run's base from it without loading a model.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Any

from p3o.models.tiny import DEFAULT_SIZE, parse_tiny, source_fingerprint

__all__ = [
    "SHIPPED",
    "SHIPPED_ROOT",
    "base_id",
    "compare",
    "file_sha256",
    "manifest",
    "shipped_dir",
    "shipped_name",
    "sources_fingerprint",
    "stamp",
    "stamp_of",
    "verify",
]

SHIPPED_ROOT = Path(__file__).resolve().parent / "shipped"
SHIPPED: tuple[str, ...] = ("tiny", "tiny-pad", "tiny-agent", "tiny-chat")
"""The shipped bases, by directory name (= their `load_policy` name)."""
MANIFEST = "manifest.json"
WEIGHTS = "model.safetensors"


def shipped_name(name: str) -> str | None:
    """The shipped base a model name loads: ``tiny`` / ``tiny-1m`` -> "tiny", ``tiny-pad``, ``tiny-agent``,
    ``tiny-chat``; None for any other name (``tiny-5m`` is built on first use, ``tiny-random`` is a random init, a
    path is a path)."""
    if name in SHIPPED:
        return name
    tiny = parse_tiny(name)
    if tiny is not None and not tiny[1] and tiny[0] == DEFAULT_SIZE:
        return "tiny"
    return None


def shipped_dir(name: str) -> Path | None:
    """``<package>/models/shipped/<shipped_name(name)>`` when that base is shipped (its manifest is there), else
    None."""
    base = shipped_name(name)
    if base is None or not (SHIPPED_ROOT / base / MANIFEST).is_file():
        return None
    return SHIPPED_ROOT / base


def file_sha256(path: str | Path) -> str:
    """The sha256 of a file's bytes (hex)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def sources_fingerprint(specs: tuple[str, ...] | list[str], root: str | Path | None = None) -> str:
    """10 hex digits of sha256(Σ spec ‖ `source_fingerprint(spec)`): `p3o.models.tiny.code_version` without the
    library versions (a shipped base is compared with the sources, not with the installed torch)."""
    h = hashlib.sha256()
    for spec in specs:
        h.update(f"{spec}\n{source_fingerprint(spec, root)}\n".encode())
    return h.hexdigest()[:10]


def manifest(name: str, root: str | Path | None = None) -> dict[str, Any]:
    """The manifest of a shipped base (`shipped_name(name)`) under `root` (default: the package's shipped/)."""
    base = shipped_name(name) or name
    return json.loads((Path(root or SHIPPED_ROOT) / base / MANIFEST).read_text(encoding="utf-8"))


@functools.cache
def verify(name: str, root: str | None = None) -> tuple[str, ...]:
    """The files of a shipped base whose sha256 differs from its manifest's (or that are missing); () when intact.
    Checked once per process (3.4 MB: a few ms)."""
    base = shipped_name(name) or name
    folder = Path(root or SHIPPED_ROOT) / base
    info = manifest(base, root)
    files = {**info["files"], WEIGHTS: info["sha256"]}
    return tuple(f for f, sha in sorted(files.items()) if not (folder / f).is_file() or file_sha256(folder / f) != sha)


def stamp(name: str, root: str | Path | None = None) -> dict[str, str]:
    """What a model loaded from a shipped base records of it (``config.p3o_base``, so every checkpoint and final
    policy of a run names its base): {"name", "key", "sha256" of the weights}."""
    info = manifest(name, root)
    return {"name": info["name"], "key": info["key"], "sha256": info["sha256"]}


def stamp_of(path: str | Path) -> dict[str, str] | None:
    """`stamp` of the shipped base at `path` (a directory under the package's shipped/), None for any other path."""
    path = Path(path).resolve()
    if path.parent != SHIPPED_ROOT or path.name not in SHIPPED or not (path / MANIFEST).is_file():
        return None
    return stamp(path.name)


def base_id(record: Any) -> str | None:
    """``"<name>@<sha256[:12]>"`` of a stamp (`stamp`, or a run's ``config.json`` ``p3o_base``); None otherwise."""
    if isinstance(record, dict) and isinstance(record.get("name"), str) and isinstance(record.get("sha256"), str):
        return f"{record['name']}@{record['sha256'][:12]}"
    return None


def compare(name: str, weights: str | Path, recipe: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """How the weights file `weights` (a rebuild) compares with the shipped base `name`: {"name", "shipped" (its
    id), "equal"}; None when `name` is not shipped, or when `recipe` is given and is not the one it was built with
    (a one-off recipe has no shipped counterpart)."""
    base = shipped_name(name)
    if base is None or shipped_dir(base) is None:
        return None
    info = manifest(base)
    if recipe is not None and recipe != info["recipe"]:
        return None
    return {"name": base, "shipped": base_id(info), "equal": file_sha256(weights) == info["sha256"]}
