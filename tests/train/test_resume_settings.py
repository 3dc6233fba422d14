"""`p3o train --resume` keeps the run's settings (issue 32): experiment changes are refused in one line naming each,
operational ones are noted, `--allow-changes` records every change in config_history.jsonl and keeps config.yaml;
a finished run says so; damaged checkpoints are skipped (issue 30 item 7). The fakes stand in for the model (the
command line is the real one)."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from train_fakes import fake_components

import p3o.train.loop as loop_mod
from p3o.cli import main as p3o_main
from p3o.config import load_config
from p3o.train.checkpoint import list_checkpoints
from p3o.train.resume import HISTORY_FILE, read_history, run_config

BASE = [
    "--seed", "0", "--rollout.prompts_per_step", "2", "--rollout.group_size", "4", "--rollout.max_new_tokens", "6",
    "--update.micro_batch_size", "8", "--optim.lr", "1e-2", "--log.progress", "false", "--log.tensorboard", "false",
    "--log.wandb", "false", "--log.plot", "false", "--task.n_eval", "0",
]  # fmt: skip


@pytest.fixture
def built(monkeypatch) -> list:
    """The configs the loop built components for (fakes instead of the tiny model)."""
    seen: list = []

    def fake(cfg):
        seen.append(cfg)
        return fake_components(cfg.seed)

    monkeypatch.setattr(loop_mod, "build_components", fake)
    return seen


def _train(run_dir, *args: str) -> int:
    return p3o_main(["train", "--run_dir", str(run_dir), *BASE, *args])


def _rows(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture
def half_run(tmp_path, built):
    """A 4-step async run (max_lag 1, a constant or cosine schedule) stopped after 2 steps: its step-2 checkpoint
    and config.yaml as a SIGKILL would leave them (the run's own steps in config.yaml are 4)."""

    def make(schedule: str = "constant"):
        run_dir = tmp_path / f"run-{schedule}"
        args = ["--loop.mode", "async", "--loop.max_lag", "1", "--optim.schedule", schedule, "--ckpt.every", "2"]
        assert _train(run_dir, *args, "--steps", "2") == 0
        cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
        cfg["steps"] = 4  # as if the 4-step run had been killed right after its step-2 checkpoint
        (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg))
        built.clear()
        return run_dir

    return make


def test_an_experiment_change_is_refused_naming_each(half_run, built, capsys):
    run_dir = half_run()
    before = (run_dir / "config.yaml").read_text()
    code = _train(run_dir, "--resume", "--loop.max_lag", "2", "--objective.name", "grpo")
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "loop.max_lag: 1 in the run, 2 given" in err[0] and "objective.name: p3o in the run, grpo given" in err[0]
    assert "--allow-changes" in err[0]
    assert not built and (run_dir / "config.yaml").read_text() == before and not (run_dir / HISTORY_FILE).exists()


def test_resume_without_flags_continues_with_the_runs_settings(half_run, built, capsys):
    run_dir = half_run()
    assert p3o_main(["train", "--run_dir", str(run_dir), "--resume"]) == 0  # no other flag: all from config.yaml
    cfg = built[-1]
    assert (cfg.loop.mode, cfg.loop.max_lag, cfg.steps, cfg.ckpt.every) == ("async", 1, 4, 2)
    assert (cfg.rollout.prompts_per_step, cfg.optim.lr, cfg.log.progress) == (2, 1e-2, False)
    assert [r["step"] for r in _rows(run_dir)] == [1, 2, 3, 4]
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["steps"] == 4
    assert not (run_dir / HISTORY_FILE).exists()  # nothing changed, nothing recorded
    out = capsys.readouterr().out  # where it continues: the checkpoint it took and the next step (issue 47)
    assert f"resuming {run_dir} from checkpoint step_000002 (2 of 4 steps done); next step: 3" in out


def test_config_of_the_run_itself_resumes_as_today(half_run, built):
    run_dir = half_run()
    assert p3o_main(["train", "--config", str(run_dir / "config.yaml"), "--run_dir", str(run_dir), "--resume"]) == 0
    assert built[-1].loop.max_lag == 1 and [r["step"] for r in _rows(run_dir)] == [1, 2, 3, 4]


def test_extending_steps_under_cosine_needs_allow_changes(half_run, built, capsys):
    run_dir = half_run("cosine")
    assert _train(run_dir, "--resume", "--steps", "6") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "steps: 4 in the run, 6 given" in err[0] and "cosine" in err[0], err
    assert not built


def test_extending_steps_under_a_constant_schedule_is_noted(half_run, built, capsys):
    run_dir = half_run("constant")
    assert _train(run_dir, "--resume", "--steps", "5", "--ckpt.every", "1") == 0
    err = capsys.readouterr().err
    assert "resuming at step 2 with steps 4 -> 5, ckpt.every 2 -> 1 (in config_history.jsonl)" in err
    [entry] = read_history(run_dir)
    assert entry["step"] == 2 and entry["allowed"] is False
    assert entry["changes"] == {"steps": [4, 5], "ckpt.every": [2, 1]}
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["steps"] == 4  # the run's first config
    assert [r["step"] for r in _rows(run_dir)] == [1, 2, 3, 4, 5]
    assert run_config(run_dir).steps == 5 and run_config(run_dir).ckpt.every == 1


def test_allow_changes_records_the_history_and_later_resumes_keep_it(half_run, built, capsys):
    run_dir = half_run("cosine")
    args = ["--resume", "--allow-changes", "--optim.lr", "5e-3", "--objective.name", "grpo", "--objective.clip_eps"]
    assert _train(run_dir, *args, "0.3", "--steps", "3") == 0
    capsys.readouterr()
    [entry] = read_history(run_dir)
    assert entry["step"] == 2 and entry["allowed"] is True
    assert entry["changes"]["optim.lr"] == [1e-2, 5e-3] and entry["changes"]["objective.name"] == ["p3o", "grpo"]
    assert entry["changes"]["objective.clip_eps"][1] == 0.3 and entry["changes"]["steps"] == [4, 3]
    cfg = built[-1]
    assert (cfg.optim.lr, cfg.objective.name, cfg.objective.hyper["clip_eps"], cfg.steps) == (5e-3, "grpo", 0.3, 3)
    first = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert first["optim"]["lr"] == 1e-2 and first["objective"]["name"] == "p3o"
    # the run's settings are now the changed ones: extending it (no cosine change needed here: same steps) resumes
    # with grpo and lr 5e-3 without repeating them, and "reached its steps" counts the changed steps
    assert p3o_main(["train", "--run_dir", str(run_dir), "--resume"]) == 0
    out = capsys.readouterr().out
    assert "has reached its 3 steps" in out and "--allow-changes" in out
    assert len(read_history(run_dir)) == 1


def test_a_finished_run_says_so_and_writes_nothing(tmp_path, built, capsys):
    run_dir = tmp_path / "done"
    assert _train(run_dir, "--steps", "2", "--ckpt.every", "1", "--loop.mode", "sync") == 0
    capsys.readouterr()
    before = (run_dir / "metrics.jsonl").read_text()
    built.clear()
    assert p3o_main(["train", "--run_dir", str(run_dir), "--resume"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "has reached its 2 steps" in out[0] and "--resume --steps 4" in out[0], out
    assert not built and (run_dir / "metrics.jsonl").read_text() == before


def test_allow_changes_needs_resume(tmp_path, built, capsys):
    assert _train(tmp_path / "x", "--allow-changes") == 2
    assert "needs --resume" in capsys.readouterr().err and not built


def _damage(ckpt, name: str = "policy/model.safetensors") -> None:
    path = ckpt / name
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])  # a copy cut short


def test_a_damaged_newest_checkpoint_is_skipped_with_one_warning(tmp_path, built, capsys):
    run_dir = tmp_path / "r"
    assert _train(run_dir, "--steps", "4", "--ckpt.every", "1", "--loop.mode", "sync") == 0
    reference = fake_components().policy  # the uninterrupted run's final weights, reloaded below
    from p3o.train.checkpoint import load_policy_weights

    load_policy_weights(reference, run_dir / "final")
    capsys.readouterr()
    ckpts = list_checkpoints(run_dir)
    assert [p.name for p in ckpts] == ["step_000003", "step_000004"]
    _damage(ckpts[-1])
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert p3o_main(["train", "--run_dir", str(run_dir), "--resume"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "skipping damaged checkpoint" in err[0] and "step_000004" in err[0], err
    assert "model.safetensors has" in err[0] and "resuming from step_000003" in err[0]
    assert [r["step"] for r in _rows(run_dir)] == [1, 2, 3, 4] and cfg["steps"] == 4
    resumed = fake_components().policy
    load_policy_weights(resumed, run_dir / "final")
    for (k, a), b in zip(reference.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b), k  # step 4 redone from the intact step 3: the same weights


def test_no_intact_checkpoint_is_exit_2_with_one_line(tmp_path, built, capsys):
    run_dir = tmp_path / "r"
    assert _train(run_dir, "--steps", "3", "--ckpt.every", "1", "--loop.mode", "sync") == 0
    for ckpt in list_checkpoints(run_dir):
        _damage(ckpt, "trainer_state.pt")
    capsys.readouterr()
    built.clear()
    assert p3o_main(["train", "--run_dir", str(run_dir), "--resume", "--steps", "5"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no intact checkpoint" in err[0] and "step_000002: trainer_state.pt has" in err[0], err
    assert not built


def test_ray_settings_need_workers():
    from p3o.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^ray.address: a Ray setting; it needs rollout.workers > 0"):
        load_config(["--ray.address", "auto"])


def test_a_run_that_died_while_finishing_gets_its_final_policy(tmp_path, built, capsys):
    import shutil

    run_dir = tmp_path / "done"
    assert _train(run_dir, "--steps", "2", "--ckpt.every", "1", "--loop.mode", "sync") == 0
    shutil.rmtree(run_dir / "final")  # killed after its last checkpoint, before final/ was written
    rows = _rows(run_dir)
    assert p3o_main(["train", "--run_dir", str(run_dir), "--resume"]) == 0
    assert (run_dir / "final" / "model.safetensors").is_file() and _rows(run_dir) == rows
    assert "reached its" not in capsys.readouterr().out
