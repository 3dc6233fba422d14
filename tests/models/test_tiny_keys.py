"""The warm-started base's cache key covers its recipe AND the code that builds it: older code's base is not reused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import p3o.models.tiny as tiny
import p3o.models.warmstart as sft
from p3o.errors import ConfigError
from p3o.models import load_policy
from p3o.models.bases import shipped_dir
from p3o.models.tiny import BASE_SOURCES, TOKENIZER_SOURCES, base_dir, code_version, source_fingerprint


def _write(root: Path, text: str) -> str:
    (root / "mod.py").write_text(text)
    code_version.cache_clear()
    return code_version(("mod.py",), str(root))


def test_code_version_follows_code_not_docstrings_comments_or_layout(tmp_path: Path) -> None:
    base = _write(tmp_path, '"""Doc."""\n\ndef f(x):\n    """What f does."""\n    return x + 1\n')
    same = _write(tmp_path, '"""Other doc."""\n# a comment\n\n\n\ndef f(x):  # why\n    return x + 1\n')
    changed = _write(tmp_path, '"""Doc."""\n\ndef f(x):\n    """What f does."""\n    return x + 2\n')
    assert base == same and base != changed and len(base) == 10


def test_one_definition_of_a_shared_module_and_a_missing_one(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text("def a():\n    return 1\n\n\ndef b():\n    return 2\n")
    a = source_fingerprint("m.py:a", tmp_path)
    (tmp_path / "m.py").write_text("def a():\n    return 1\n\n\ndef b():\n    return 3\n")
    assert source_fingerprint("m.py:a", tmp_path) == a  # b changed, a did not
    assert source_fingerprint("m.py", tmp_path) != a
    with pytest.raises(ValueError, match="no top-level definition 'c'"):
        source_fingerprint("m.py:c", tmp_path)


def test_the_fingerprint_covers_the_sources_that_build_the_base_and_the_libraries(monkeypatch) -> None:
    built_from = {"models/warmstart.py", "models/tokenizer.py", "models/configs.py", "tasks/arithmetic.py"}
    assert built_from <= set(BASE_SOURCES)
    assert set(TOKENIZER_SOURCES) <= set(BASE_SOURCES)
    for spec in BASE_SOURCES:  # every listed source exists (a rename must update the list)
        assert source_fingerprint(spec)
    code_version.cache_clear()
    now = code_version()
    monkeypatch.setattr(tiny, "_library_version", lambda name: "0.0" if name == "torch" else "x")
    code_version.cache_clear()
    assert code_version() != now  # another torch builds another base
    monkeypatch.undo()
    code_version.cache_clear()
    assert code_version() == now


def test_a_base_built_by_older_code_is_rebuilt_not_reused(tmp_path: Path, monkeypatch) -> None:
    built: list[str] = []

    def fake_warm_start(cfg: sft.SFTConfig, out: Path, log: bool = True, init_dir: Path | None = None) -> dict:
        built.append(tiny.code_version())
        (out / "config.json").write_text("{}")
        (out / "model.safetensors").write_bytes(b"")
        (out / "sft.json").write_text(json.dumps({"code_version": tiny.code_version()}))
        return {}

    monkeypatch.setattr(sft, "warm_start", fake_warm_start)
    old = sft.ensure_base("1m", tmp_path)
    assert sft.ensure_base("1m", tmp_path) == old and len(built) == 1  # same code: a cache hit
    assert old == base_dir("1m", tmp_path) and old.name.endswith(f"-c{code_version()}")

    monkeypatch.setattr(tiny, "code_version", lambda *a, **k: "newc0de000")  # the code that builds it changed
    new = sft.ensure_base("1m", tmp_path)  # the old base is there, but it is not this code's: built again
    assert new != old and new.name.endswith("-cnewc0de000") and built == [built[0], "newc0de000"]
    assert sft.resolve_model_name("tiny-1m", tmp_path) == str(shipped_dir("tiny"))  # the shipped base, whatever
    assert sft.resolve_model_name("tiny-5m", tmp_path).endswith("-cnewc0de000") and len(built) == 3  # is cached
    assert sft.resolve_model_name("tiny-random", tmp_path) == "tiny-random"
    assert sft.resolve_model_name("runs/x/final", tmp_path) == "runs/x/final" and len(built) == 3
    assert sft.resolve_model_name("tiny-7b", tmp_path) == "tiny-7b"  # load_policy's own error names the sizes
    with pytest.raises(ConfigError, match="unknown tiny size or testbed in 'tiny-7b'; known: 1m, 5m, 30m, pad"):
        load_policy("tiny-7b", cache_dir=tmp_path)


def test_a_custom_recipe_gets_its_own_entry(tmp_path: Path) -> None:
    default = sft.SFTConfig()
    assert sft.recipe_hash(default) is None
    assert sft.recipe_hash(sft.SFTConfig(threads=2)) is None  # threads do not change the recipe
    custom = sft.recipe_hash(sft.SFTConfig(steps=5))
    assert custom is not None and len(custom) == 8
    assert base_dir("1m", tmp_path, recipe=custom).name.endswith(f"-c{code_version()}-{custom}")
