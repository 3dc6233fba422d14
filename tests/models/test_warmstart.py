"""The warm start on the models floor: `ensure_base` builds into the cache; `--model tiny` loads the shipped base."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import p3o.models.warmstart as ws
from p3o.cli import main as p3o_main
from p3o.models import load_policy
from p3o.models.bases import WEIGHTS, file_sha256, shipped_dir, stamp
from p3o.models.tiny import BASE_SOURCES, TESTBED_SOURCES, TESTBEDS, base_dir, base_key, code_version
from p3o.train.step import lr_factor as trainer_lr_factor

QUICK = {"steps": 3, "batch_size": 2, "warmup_steps": 1, "max_new_tokens": 6}


@pytest.fixture
def quick_recipes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """An empty cache, and default recipes shrunk to a few steps (the real ones take minutes)."""
    real = ws.testbed_recipe
    monkeypatch.setattr(ws, "testbed_recipe", lambda *a, **k: replace(real(*a, **k), **QUICK))
    monkeypatch.setenv("P3O_CACHE", str(tmp_path / "cache"))
    torch.set_num_threads(1)
    return tmp_path / "cache"


def test_mismatch_and_eval_use_the_shipped_base_and_build_nothing(quick_recipes: Path, capsys) -> None:
    small = ["--num-prompts", "2", "--group", "2", "--max-new-tokens", "4", "--no-greedy", "--threads", "1"]
    assert p3o_main(["mismatch", "--model", "tiny", "--precision", "fp32", *small]) == 0
    assert "HFEngine fp32" in capsys.readouterr().out
    out = quick_recipes.parent / "eval.json"
    argv = ["eval", "--model", "tiny", "--n-problems", "2", "--n-samples", "1", "--k", "1", "--max-new-tokens", "4"]
    assert p3o_main([*argv, "--out", str(out), "--quiet"]) == 0
    assert json.loads(out.read_text())["n_problems"] == 2
    assert not (quick_recipes / "models").exists()  # the shipped base (p3o.models.bases): no cache entry


def test_ensure_base_builds_tiny_and_a_testbed_base_load_policy_does_not(quick_recipes: Path) -> None:
    model, tok = load_policy("tiny")
    assert type(model).__name__ == "Qwen3ForCausalLM" and tok.eos_token == "<|im_end|>"
    assert model.config.p3o_base == stamp("tiny") and not (quick_recipes / "models").exists()
    bed = TESTBEDS["pad"]
    built = ws.ensure_base(bed["size"], task=bed["task"], difficulty=bed["difficulty"])
    path = base_dir(bed["size"], quick_recipes, task=bed["task"], difficulty=bed["difficulty"])
    assert built == path and path.name.startswith("tiny-1m-arithmetic-dpad-s0-c") and (path / WEIGHTS).is_file()
    info = json.loads((path / "sft.json").read_text())
    assert info["config"]["train_levels"] == "pad-1,pad" and info["config"]["difficulty"] == "pad"
    assert info["config"]["init"] == ""  # from scratch
    assert info["stats"]["sha256"] == file_sha256(path / WEIGHTS) and info["stats"]["shipped"] is None  # 3 steps
    assert ws.resolve_model_name("tiny-pad") == str(shipped_dir("tiny-pad"))  # the cached build is not used
    assert ws.resolve_model_name("tiny-random") == "tiny-random" and ws.resolve_tiny("smollm2") is None


def test_a_testbed_is_keyed_by_its_generator_too_the_main_base_is_not() -> None:
    assert not set(TESTBED_SOURCES) & set(BASE_SOURCES)  # editing a testbed does not rebuild the main job's base
    assert base_key("1m", "arithmetic", 2, 0).endswith(f"-c{code_version()}")
    both = code_version((*BASE_SOURCES, *TESTBED_SOURCES))
    assert base_key("1m", "arithmetic", "pad", 0).startswith(f"tiny-1m-arithmetic-dpad-s0-c{both}-t")
    assert both != code_version()


def test_a_changed_testbed_recipe_is_a_new_key(monkeypatch: pytest.MonkeyPatch) -> None:
    before = base_key("1m", "arithmetic", "pad", 0)
    changed = {**TESTBEDS["pad"], "sft": {**TESTBEDS["pad"]["sft"], "steps": 7}}
    monkeypatch.setitem(TESTBEDS, "pad", changed)
    assert base_key("1m", "arithmetic", "pad", 0) != before  # the recipe is not in the fingerprinted sources
    assert base_key("1m", "arithmetic", 2, 0).endswith(f"-c{code_version()}")  # the main base's key is unmoved


def test_init_starts_from_the_given_weights(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    cfg = replace(ws.SFTConfig(), steps=1, batch_size=2, warmup_steps=1, lr=1e-9, max_new_tokens=4)
    ws.warm_start(cfg, tmp_path / "a", log=False)
    ws.warm_start(replace(cfg, seed=5, init="tiny"), tmp_path / "b", log=False, init_dir=tmp_path / "a")
    a, _ = load_policy(str(tmp_path / "a"))
    b, _ = load_policy(str(tmp_path / "b"))
    assert all(torch.allclose(p, q, atol=1e-6) for p, q in zip(a.parameters(), b.parameters()))  # lr ~ 0


def test_sft_out_with_init_tiny_starts_from_the_cached_main_base(quick_recipes: Path, tmp_path: Path) -> None:
    """`p3o sft --out DIR --init tiny` (a one-off base outside the cache) starts from the main base, as the cached
    path does: it once trained from a random init instead."""
    out = tmp_path / "one-off"
    argv = ["sft", "--out", str(out), "--init", "tiny", "--steps", "1", "--batch_size", "2", "--warmup_steps", "1"]
    assert p3o_main([*argv, "--lr", "1e-9", "--max_new_tokens", "4", "--eval_n", "0"]) == 0
    main, _ = load_policy(str(ws.ensure_base("1m")))  # the cached main base (3 steps here), not the shipped one
    got, _ = load_policy(str(out))
    assert all(torch.allclose(p, q, atol=1e-6) for p, q in zip(main.parameters(), got.parameters()))  # lr ~ 0


def test_testbed_recipe_is_the_default_of_its_key() -> None:
    pad = ws.testbed_recipe("pad")
    assert pad.train_levels == "pad-1,pad" and pad.init == "" and ws.recipe_hash(pad) is None
    assert ws.recipe_hash(replace(pad, eval_n=3, threads=2)) is None  # the pass@1 report is not the recipe
    assert ws.recipe_hash(replace(pad, steps=pad.steps + 1)) is not None
    assert ws.testbed_recipe(2) == ws.SFTConfig()


def test_lr_factor_is_the_trainers_cosine() -> None:
    for step in range(0, 40):
        got = ws.lr_factor(step, 5, 30)
        assert got == trainer_lr_factor(step, warmup_steps=5, total_steps=30, schedule="cosine", min_factor=0.1)
