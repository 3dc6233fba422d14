"""The shipped bases (`p3o.models.bases`): intact, current, loaded without building anything, recorded by runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from p3o.cli import main as p3o_main
from p3o.models import load_policy
from p3o.models.bases import (
    SHIPPED,
    SHIPPED_ROOT,
    WEIGHTS,
    base_id,
    compare,
    file_sha256,
    manifest,
    shipped_dir,
    shipped_name,
    stamp,
    verify,
)
from p3o.models.hub import ensure_tokenizer
from p3o.models.ship import drift, recipe, ship, sources


@pytest.fixture
def no_builds(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """An empty cache in which any build fails the test."""

    def refuse(target: Path, *args, **kwargs) -> Path:
        raise AssertionError(f"built {target.name}: a shipped base must be loaded, not built")

    for module in ("cache", "warmstart", "agent", "chat", "hub"):
        monkeypatch.setattr(f"p3o.models.{module}.atomic_build", refuse)
    monkeypatch.setenv("P3O_CACHE", str(tmp_path / "cache"))
    torch.set_num_threads(1)
    return tmp_path / "cache"


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_base_is_intact_and_says_what_built_it(name: str) -> None:
    info = manifest(name)
    assert verify(name) == () and info["name"] == name and info["sha256"] == file_sha256(SHIPPED_ROOT / name / WEIGHTS)
    assert {"config.json", "tokenizer.json", "tokenizer_config.json", "sft.json"} <= set(info["files"])
    assert info["sources"]["specs"] == list(sources(name)) and info["recipe"] == recipe(name)
    libraries = {"torch", "transformers", "tokenizers"}
    assert info["key"].startswith("tiny-") and info["built_on"] and set(info["libraries"]) == libraries
    assert sum(p.stat().st_size for p in (SHIPPED_ROOT / name).iterdir()) < 4_000_000  # a few MB in all


@pytest.mark.parametrize("name", SHIPPED)
def test_the_shipped_bases_are_what_the_current_sources_build(name: str) -> None:
    """The shipped base is the one every run loads, whatever the sources: when the code or recipe that builds it
    changes, re-ship (a rebuild with unchanged arithmetic has the same bytes on the CPU kind that built it)."""
    why = drift(name)
    assert not why, (
        f"the shipped base {name} is not what the current code builds: {'; '.join(why)}. Run "
        f"`python -m p3o.models.ship {name}` (rebuilds it, says whether the weights changed, re-ships it; new weights "
        "mean new figures: docs/main-job.md), or revert the change"
    )


def test_names_resolve_to_the_shipped_bases() -> None:
    names = ("tiny", "tiny-1m", "tiny-pad", "tiny-agent", "tiny-chat")
    assert [shipped_name(n) for n in names] == ["tiny", "tiny", "tiny-pad", "tiny-agent", "tiny-chat"]
    assert [shipped_name(n) for n in ("tiny-5m", "tiny-random", "tiny-1m-random", "smollm2", "runs/x")] == [None] * 5
    assert shipped_dir("tiny-1m") == SHIPPED_ROOT / "tiny" and shipped_dir("tiny-30m") is None
    assert base_id(stamp("tiny")) == f"tiny@{manifest('tiny')['sha256'][:12]}" and base_id({"name": "x"}) is None


def test_load_policy_loads_the_shipped_bases_and_builds_nothing(no_builds: Path) -> None:
    for name in ("tiny", "tiny-1m", "tiny-pad", "tiny-agent", "tiny-chat"):
        model, tok = load_policy(name, cache_dir=no_builds)
        assert model.config.p3o_base == stamp(name) and model.config.name_or_path == str(shipped_dir(name))
        assert tok.eos_token == "<|im_end|>"
    model, tok = load_policy("tiny-random")  # the shipped main base's tokenizer, random weights
    assert len(tok) == model.config.vocab_size and not hasattr(model.config, "p3o_base")
    assert ensure_tokenizer() == shipped_dir("tiny")
    assert not no_builds.exists() or not any(no_builds.iterdir())  # nothing written to the cache


def test_a_run_records_its_base(no_builds: Path, tmp_path: Path) -> None:
    """A run's checkpoints name the shipped base and its weights' sha256 (config.json's ``p3o_base``); the grid
    runner's DONE record reads it (``base_key``)."""
    from p3o.experiments.grid.runner import base_key

    run_dir = tmp_path / "run"
    argv = ["train", "--run_dir", str(run_dir), "--model.name", "tiny", "--steps", "1", "--log.progress", "false"]
    small = ["--rollout.prompts_per_step", "2", "--rollout.group_size", "2", "--rollout.max_new_tokens", "8"]
    assert p3o_main([*argv, *small, "--task.n_eval", "2", "--log.plot", "false"]) == 0
    saved = json.loads((run_dir / "final" / "config.json").read_text())
    assert saved["p3o_base"] == stamp("tiny") and saved["p3o_base"]["sha256"] == manifest("tiny")["sha256"]
    assert base_key(run_dir, "tiny") == base_id(stamp("tiny")) == f"tiny@{manifest('tiny')['sha256'][:12]}"
    assert base_key(tmp_path / "nowhere", "tiny-agent") == base_id(stamp("tiny-agent"))  # no checkpoint yet


def test_ship_writes_a_manifest_that_verify_checks(tmp_path: Path) -> None:
    built = tmp_path / "cache" / "tiny-1m-arithmetic-d2-s0-c0123456789"
    shutil.copytree(SHIPPED_ROOT / "tiny", built, ignore=shutil.ignore_patterns("manifest.json"))
    info = ship("tiny", built, tmp_path / "shipped")
    assert info["key"] == built.name and info["sha256"] == manifest("tiny")["sha256"]
    assert json.loads((tmp_path / "shipped" / "tiny" / "manifest.json").read_text()) == info
    noted = json.loads((built / "sft.json").read_text())["stats"]  # what p3o sft prints when it finds the entry
    assert noted["shipped"] == {"name": "tiny", "shipped": base_id(info), "equal": True}
    assert verify("tiny", str(tmp_path / "shipped")) == ()
    (tmp_path / "shipped" / "tiny" / "tokenizer.json").write_text("{}")
    verify.cache_clear()
    assert verify("tiny", str(tmp_path / "shipped")) == ("tokenizer.json",)
    assert drift("tiny", tmp_path / "shipped") == drift("tiny")  # the same sources and recipe


def test_a_rebuild_is_compared_with_the_shipped_weights(tmp_path: Path) -> None:
    weights = SHIPPED_ROOT / "tiny" / WEIGHTS
    got = compare("tiny", weights, recipe("tiny"))
    assert got == {"name": "tiny", "shipped": base_id(stamp("tiny")), "equal": True}
    other = tmp_path / WEIGHTS
    other.write_bytes(weights.read_bytes()[:-1] + b"\0")
    assert compare("tiny-1m", other, recipe("tiny"))["equal"] is False
    assert compare("tiny", weights, {**recipe("tiny"), "steps": 3}) is None  # another recipe: no shipped one
    assert compare("tiny-5m", weights) is None


def test_old_lm_verdict_files_are_labelled_by_what_they_keep() -> None:
    """Issues 46, 53: the LM verdict files from per-CPU bases keep their status, labelled by what they keep (per-seed
    values: minpro-stale6; summary statistics only: lag); runs from the shipped base and the synthetic instrument are
    not labelled."""
    from p3o.experiments.stats.ledger import PER_CPU_BASE, PER_CPU_KEPT, base_label, study_instrument

    root = Path(__file__).resolve().parents[2] / "docs" / "results"
    assert study_instrument(root / "synthetic.verdicts.json") == "synthetic"
    assert study_instrument(root / "lag.verdicts.json") == "lm"
    kept = json.loads((root / "minpro-stale6.verdicts.json").read_text())
    assert base_label(kept, "lm") == PER_CPU_KEPT and PER_CPU_KEPT.startswith("per-CPU base, per-seed values kept")
    doc = json.loads((root / "lag.verdicts.json").read_text())
    assert base_label(doc, "lm") == PER_CPU_BASE and PER_CPU_BASE.startswith("summary statistics only")
    assert base_label({"runs": []}, "lm") == PER_CPU_BASE and base_label(doc, "synthetic") is None
    since = {"runs": [{"base_key": base_id(stamp("tiny"))}, {"base_key": base_id(stamp("tiny-pad"))}]}
    assert base_label(since, "lm") is None


def test_ship_keeps_a_current_base_and_a_rebuild_with_other_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`python -m p3o.models.ship` rebuilds only drifted bases; a forced rebuild of a current base whose weights differ
    (another CPU kind's kernels) is not shipped unless --replace says so."""
    from p3o.models import ship as ship_module

    root = tmp_path / "shipped"
    shutil.copytree(SHIPPED_ROOT / "tiny", root / "tiny")
    built = tmp_path / "cache" / f"tiny-1m-arithmetic-d2-s0-c{ship_module.fingerprints('tiny')['code_version']}"
    shutil.copytree(SHIPPED_ROOT / "tiny", built, ignore=shutil.ignore_patterns("manifest.json"))
    (built / WEIGHTS).write_bytes((built / WEIGHTS).read_bytes()[:-1] + b"\0")  # the same code, other kernels
    calls: list[str] = []
    monkeypatch.setattr(ship_module, "build", lambda name, cache_dir, force=False: calls.append(name) or built)
    shipped = manifest("tiny", root)["sha256"]
    assert ship_module.main(["tiny", "--root", str(root)]) == 0 and calls == []
    assert "tiny: current (tiny@" in capsys.readouterr().out
    assert ship_module.main(["tiny", "--root", str(root), "--force"]) == 0 and calls == ["tiny"]
    assert "kept the shipped one" in capsys.readouterr().out and manifest("tiny", root)["sha256"] == shipped
    assert ship_module.main(["tiny", "--root", str(root), "--force", "--replace"]) == 0
    assert manifest("tiny", root)["sha256"] == file_sha256(built / WEIGHTS) != shipped
