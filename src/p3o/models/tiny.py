"""The built-in tiny model's cache entries: where the warm-started base and its tokenizer live, and their keys.

A key names everything that changes the entry it points to:

* the recipe: size, task, difficulty, seed, plus a hash of any non-default warm-start setting (`recipe`);
* the code that builds it: `code_version`, a fingerprint of the source of the modules that generate the task
  data, format the prompts, train the tokenizer, configure the model and run the warm start (`BASE_SOURCES`),
  and of the installed torch / transformers / tokenizers versions.

So an entry built by other code sits under another key and is never reused silently: the current code builds its
own (``p3o sft``; ``p3o train`` does it on first use). The fingerprint is of each module's syntax tree without
docstrings, so comments, docstrings and formatting do not invalidate a base; any change to code does.

    base_dir("1m")                       # <cache>/models/tiny-1m-arithmetic-d2-s0-c<code_version()>
    tokenizer_dir()                      # <cache>/tokenizers/arithmetic-v512-s0-c<code_version(TOKENIZER_SOURCES)>
    parse_tiny("tiny-5m-random")         # ("5m", True)

The warm start itself (a training loop) is `p3o.models.warmstart`: this module reads the sources it fingerprints
as text and never imports them.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
from importlib import metadata
from pathlib import Path

from p3o.models.cache import cache_root

__all__ = [
    "BASE_SOURCES",
    "DEFAULT_SIZE",
    "LIBRARIES",
    "TESTBEDS",
    "TESTBED_SOURCES",
    "TOKENIZER_SOURCES",
    "base_dir",
    "base_key",
    "code_version",
    "parse_tiny",
    "source_fingerprint",
    "tokenizer_dir",
]

# Named testbeds: "tiny-<name>" is the base warm-started on that task and difficulty with that recipe (the fields of
# p3o.models.warmstart.SFTConfig that differ from its defaults). docs/tasks.md, "The scratchpad testbed".
TESTBEDS: dict[str, dict] = {
    "pad": {
        "size": "1m",
        "task": "arithmetic",
        "difficulty": "pad",
        # the main base's recipe (600 steps × 32, lr 5e-3, from scratch) on the scratchpad format: a warm start
        # from the main base (init "tiny") kept its position habits and reached pass@1 0.26 (docs/tasks.md)
        "sft": {
            "train_levels": "pad-1,pad",
            "max_new_tokens": 200,
        },
    },
}
DEFAULT_SIZE = "1m"  # the size whose warm start fits the ~2 min / 2-core budget (5m needs ~4x the compute)

# Paths relative to the p3o package; "file.py:name" takes one top-level function or class of a shared module.
TOKENIZER_SOURCES: tuple[str, ...] = (
    "models/tokenizer.py",
    "tasks/arithmetic.py",
    "tasks/base.py",
    "tasks/prompts.py",
    "tasks/loaders.py:load_task",
)
BASE_SOURCES: tuple[str, ...] = (
    *TOKENIZER_SOURCES,
    "models/configs.py",
    "models/warmstart.py",
)
# What a testbed's base (a difficulty of TESTBEDS) is built from besides BASE_SOURCES: its task generator. Kept out
# of BASE_SOURCES so that a change to a testbed does not rebuild the main job's base.
TESTBED_SOURCES: tuple[str, ...] = ("tasks/scratchpad.py",)
LIBRARIES: tuple[str, ...] = ("torch", "transformers", "tokenizers")
_PACKAGE = Path(__file__).resolve().parents[1]


def _drop_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        first = node.body[0] if node.body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and type(first.value.value) is str:
            node.body = node.body[1:] or [ast.Pass()]
    return tree


def source_fingerprint(spec: str, root: str | Path | None = None) -> str:
    """The syntax tree (no docstrings, no line numbers) of ``"path.py"`` or one definition ``"path.py:name"``.

    `root` is the directory the path is relative to (default: the installed p3o package). Raises ValueError when
    the file holds no top-level definition `name`.
    """
    rel, _, name = spec.partition(":")
    tree = _drop_docstrings(ast.parse(Path(root or _PACKAGE, rel).read_text(encoding="utf-8")))
    if not name:
        return ast.dump(tree)
    assert isinstance(tree, ast.Module)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return ast.dump(node)
    raise ValueError(f"{rel}: no top-level definition {name!r} to fingerprint")


def _library_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "absent"


@functools.cache
def code_version(sources: tuple[str, ...] = BASE_SOURCES, root: str | None = None) -> str:
    """A 10-hex-digit fingerprint of the code that builds an entry.

    code_version = sha256( Σ_spec spec ‖ source_fingerprint(spec) ‖ Σ_lib lib==version )[:10], over `sources`
    in order and `LIBRARIES`. Computed once per process (the sources do not change under a running program).
    """
    h = hashlib.sha256()
    for spec in sources:
        h.update(f"{spec}\n{source_fingerprint(spec, root)}\n".encode())
    for lib in LIBRARIES:
        h.update(f"{lib}=={_library_version(lib)}\n".encode())
    return h.hexdigest()[:10]


def base_key(size: str, task: str, difficulty: object, seed: int, recipe: str | None = None) -> str:
    """Cache key of a warm-started base: ``tiny-<size>-<task>-d<difficulty>-s<seed>-c<code_version>[-<recipe>]``.

    A testbed's difficulty (TESTBEDS) is keyed by the code version of BASE_SOURCES + TESTBED_SOURCES and a hash of
    its TESTBEDS entry (``...-c<version>-t<entry>``).

    `recipe` is the hash of a non-default warm-start recipe (`p3o.models.warmstart.recipe_hash`), None for the
    default.
    """
    beds = [bed for bed in TESTBEDS.values() if bed["difficulty"] == difficulty]
    version = code_version((*BASE_SOURCES, *TESTBED_SOURCES)) if beds else code_version()
    key = f"tiny-{size}-{task}-d{difficulty}-s{seed}-c{version}"
    if beds:  # the testbed's default recipe lives here, outside the fingerprinted sources: key it too
        key += "-t" + hashlib.sha256(json.dumps(beds[0], sort_keys=True).encode()).hexdigest()[:6]
    return f"{key}-{recipe}" if recipe else key


def base_dir(
    size: str = DEFAULT_SIZE,
    cache_dir: str | Path | None = None,
    *,
    task: str = "arithmetic",
    difficulty: object = 2,
    seed: int = 0,
    recipe: str | None = None,
) -> Path:
    """``<cache>/models/<base_key(...)>``: where the warm-started base of the current code lives (may not exist)."""
    return cache_root(cache_dir) / "models" / base_key(size, task, difficulty, seed, recipe)


def tokenizer_dir(
    cache_dir: str | Path | None = None, *, task: str = "arithmetic", vocab_size: int = 512, seed: int = 0
) -> Path:
    """``<cache>/tokenizers/<task>-v<vocab_size>-s<seed>-c<code_version(TOKENIZER_SOURCES)>`` (may not exist)."""
    version = code_version(TOKENIZER_SOURCES)
    return cache_root(cache_dir) / "tokenizers" / f"{task}-v{vocab_size}-s{seed}-c{version}"


def parse_tiny(name: str) -> tuple[str, bool] | None:
    """ "tiny" / "tiny-1m" / "tiny-random" / "tiny-30m-random" -> (size, random); None for other names."""
    if name != "tiny" and not name.startswith("tiny-"):  # "tinyy" is not a tiny model
        return None
    parts = name.split("-")[1:]
    rand = "random" in parts
    sizes = [p for p in parts if p != "random"]
    if len(sizes) > 1:
        return None
    return (sizes[0] if sizes else DEFAULT_SIZE), rand
