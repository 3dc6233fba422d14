"""No litter from a failed start (issue 40): what a run can refuse is checked before its run directory exists, a
directory the failed start created is removed, and a directory with no completed step does not block the next
start; --overwrite also removes the old run's doctor.png."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from train_fakes import fake_components, fake_config

import p3o.train.loop as loop_mod
from p3o.errors import ConfigError
from p3o.train.cli import main as train_main
from p3o.train.loop import run
from p3o.train.run_dir import clear_run_outputs, earlier_run


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("missing", "neither a known task"),
        ("malformed", "line 2: invalid JSON"),
        ("verifier", "unknown verifier 'mathh'"),
    ],
)
def test_refused_start_exits_2_with_one_line_and_leaves_no_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, message: str
) -> None:
    data = tmp_path / "data.jsonl"
    data.write_text('{"question": "1+1", "answer": "2"}\n{"question": "2+2", "answer": \n', encoding="utf-8")
    options = {
        "missing": ["--task.name", str(tmp_path / "nope.jsonl")],
        "malformed": ["--task.name", str(data)],
        "verifier": ["--task.verifier", "mathh"],
    }[case]
    run_dir = tmp_path / "runs" / "r"
    argv = ["--run_dir", str(run_dir), "--model.name", "tiny-random", "--steps", "1", "--log.progress", "false"]
    assert train_main([*argv, *options]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("p3o train: error: ") and message in err[0], err
    assert not run_dir.exists() and not run_dir.parent.exists()


def test_a_start_failing_after_the_directory_was_made_removes_it(tmp_path: Path, monkeypatch) -> None:
    """An engine that fails to start (the batch source is built after the run directory): the directory this start
    created goes; one that existed before (the user's) stays, with what was in it."""

    def no_engine(self, start, state):
        raise ConfigError("rollout.precision: this machine cannot run it")

    monkeypatch.setattr(loop_mod.Trainer, "_make_source", no_engine)
    run_dir = tmp_path / "new"
    with pytest.raises(ConfigError, match="cannot run it"):
        run(fake_config(run_dir, steps=1), components=fake_components())
    assert not run_dir.exists()
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    with pytest.raises(ConfigError, match="cannot run it"):
        run(fake_config(mine, steps=1), components=fake_components())
    assert (mine / "notes.txt").read_text() == "keep"


def test_a_directory_with_no_completed_step_does_not_block_a_rerun(tmp_path: Path, capsys) -> None:
    """A start killed before its first step (e.g. while a base was being built for a new environment) leaves its
    config, an empty metrics.jsonl (or only the step-0 evaluation) and a tensorboard folder: not a run. The rerun
    starts without --overwrite and clears those leftovers; a directory with one logged step is still refused."""
    run_dir = tmp_path / "killed"
    (run_dir / "tensorboard").mkdir(parents=True)
    (run_dir / "tensorboard" / "events.out").write_text("x")
    (run_dir / "config.yaml").write_text("steps: 9\n")
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 0, "eval_accuracy": 0.1}) + '\n{"step": 1, ')
    assert earlier_run(run_dir) == []
    run(fake_config(run_dir, steps=2), components=fake_components())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and not (run_dir / "tensorboard").exists()
    assert "removed" in capsys.readouterr().err  # said what it cleared
    assert earlier_run(run_dir) == ["final", "metrics.jsonl"]
    with pytest.raises(ConfigError, match="holds an earlier run"):
        run(fake_config(run_dir, steps=2), components=fake_components())


def test_overwrite_removes_the_old_runs_doctor_plot(tmp_path: Path) -> None:
    for name in ("metrics.jsonl", "doctor.png", "notes.txt"):
        (tmp_path / name).write_text("x")
    assert set(clear_run_outputs(tmp_path)) == {"metrics.jsonl", "doctor.png"}
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]
