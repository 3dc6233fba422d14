"""Safe run directories: a fresh run never deletes an earlier run's outputs; --resume or --overwrite is explicit."""

from __future__ import annotations

import json

import pytest
import yaml
from train_fakes import fake_components, fake_config

import p3o.train.loop as loop_mod
from p3o.cli import main as p3o_main
from p3o.config import load_config
from p3o.errors import ConfigError
from p3o.train.checkpoint import list_checkpoints
from p3o.train.loop import run
from p3o.train.run_dir import clear_run_outputs, run_outputs


def _snapshot(run_dir) -> dict[str, bytes]:
    """Every file under run_dir with its bytes (to prove nothing was touched)."""
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


@pytest.fixture
def finished_run(tmp_path):
    """A finished 3-step run of the fakes with checkpoints, metrics and final/."""
    run_dir = tmp_path / "r"
    run(fake_config(run_dir, steps=3, **{"ckpt.every": 1}), components=fake_components())
    assert set(run_outputs(run_dir)) == {"checkpoints", "final", "metrics.jsonl"}
    return run_dir


def test_fresh_run_refuses_a_run_dir_with_checkpoints(finished_run, capsys, monkeypatch):
    before = _snapshot(finished_run)
    built = []
    monkeypatch.setattr(loop_mod, "build_components", lambda cfg: built.append(cfg) or fake_components())
    code = p3o_main(["train", "--config", "quick", "--run_dir", str(finished_run), "--log.progress", "false"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1, err
    assert str(finished_run) in err and "--resume" in err and "--overwrite" in err
    assert not built  # refused before loading anything
    assert _snapshot(finished_run) == before  # nothing deleted or rewritten


def test_fresh_run_refusal_in_python(finished_run):
    before = _snapshot(finished_run)
    with pytest.raises(ConfigError, match="holds an earlier run"):
        run(fake_config(finished_run, steps=2), components=fake_components())
    assert _snapshot(finished_run) == before


def test_overwrite_replaces_the_old_run(finished_run):
    (finished_run / "notes.txt").write_text("mine")  # not a p3o output: left alone
    cfg = fake_config(finished_run, steps=2, overwrite=True)  # no checkpoints this time
    run(cfg, components=fake_components())
    rows = [json.loads(line) for line in (finished_run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert list_checkpoints(finished_run) == []  # the old run's checkpoints are gone (a later --resume is safe)
    assert not (finished_run / "checkpoints").exists()
    assert (finished_run / "final").is_dir()
    assert (finished_run / "notes.txt").read_text() == "mine"
    saved = yaml.safe_load((finished_run / "config.yaml").read_text())
    assert saved["steps"] == 2 and saved["overwrite"] is False  # rerunning the saved config deletes nothing


def test_overwrite_on_the_command_line(finished_run, monkeypatch, capsys):
    monkeypatch.setattr(loop_mod, "build_components", lambda cfg: fake_components())
    args = ["train", "--config", "quick", "--run_dir", str(finished_run), "--log.progress", "false"]
    assert p3o_main([*args, "--log.plot", "false", "--ckpt.every", "0", "--overwrite"]) == 0
    assert "removed checkpoints" in capsys.readouterr().err
    assert not (finished_run / "checkpoints").exists()


def test_resume_and_overwrite_are_exclusive():
    with pytest.raises(ConfigError, match="pick one"):
        load_config(["--resume", "--overwrite"])


def test_empty_or_config_only_dir_is_fine(tmp_path):
    (tmp_path / "empty").mkdir()
    run(fake_config(tmp_path / "empty", steps=1), components=fake_components())
    only_cfg = tmp_path / "cfg"
    only_cfg.mkdir()
    (only_cfg / "config.yaml").write_text("steps: 1\n")
    (only_cfg / "checkpoints").mkdir()  # an empty folder is not a run either
    run(fake_config(only_cfg, steps=1), components=fake_components())
    assert (only_cfg / "metrics.jsonl").is_file()


def test_resume_over_a_finished_run_without_checkpoints_refuses(tmp_path):
    run_dir = tmp_path / "r"
    run(fake_config(run_dir, steps=2), components=fake_components())  # ckpt.every 0: only final/
    before = _snapshot(run_dir)
    with pytest.raises(ConfigError, match="no checkpoint to resume"):
        run(fake_config(run_dir, steps=2, **{"ckpt.resume": True}), components=fake_components())
    assert _snapshot(run_dir) == before


def test_resume_without_checkpoint_is_refused_and_overwrite_restarts(tmp_path):
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text('{"step": 1}\n')  # interrupted before its first checkpoint
    before = _snapshot(run_dir)
    with pytest.raises(ConfigError, match=r"no checkpoint to resume from .*--overwrite"):
        run(fake_config(run_dir, steps=2, **{"ckpt.resume": True}), components=fake_components())
    assert _snapshot(run_dir) == before
    run(fake_config(run_dir, steps=2, overwrite=True), components=fake_components())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and "reward_mean" in rows[0]


@pytest.mark.parametrize("where", ["missing", "empty"])
def test_resume_with_nothing_to_resume_is_one_line_exit_2(tmp_path, capsys, where, monkeypatch):
    built = []
    monkeypatch.setattr(loop_mod, "build_components", lambda cfg: built.append(cfg) or fake_components())
    (tmp_path / "async").mkdir()
    run_dir = tmp_path / ("asnyc" if where == "missing" else "async")  # a mistyped name, or an empty directory
    assert p3o_main(["train", "--run_dir", str(run_dir), "--resume"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nothing to resume" in err[0], err
    if where == "missing":
        assert f"did you mean {tmp_path / 'async'}" in err[0]
        assert not run_dir.exists()
    assert not built


def test_clear_run_outputs_removes_only_p3o_outputs(tmp_path):
    for name in ("checkpoints/step_000001", "final", "tensorboard"):
        (tmp_path / name).mkdir(parents=True)
    for name in ("metrics.jsonl", "plot.png", "config.yaml", "config_history.jsonl", "DONE",
                 "checkpoints/step_000001/x", "keep.txt"):  # fmt: skip
        (tmp_path / name).write_text("x")
    assert set(clear_run_outputs(tmp_path)) == {"checkpoints", "final", "tensorboard", "metrics.jsonl", "plot.png",
                                                 "config.yaml", "config_history.jsonl", "DONE"}  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]


def test_refusal_is_the_only_line_even_for_a_warned_config(finished_run, capsys):
    # the default shape (micro-batches of 16 of 64 sequences) would warn about P3O's ESS scope; refused, it is silent
    assert p3o_main(["train", "--run_dir", str(finished_run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds an earlier run" in err[0]
