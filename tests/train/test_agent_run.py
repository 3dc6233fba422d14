"""`p3o train` with an agent environment (issue 44): the loop, its async source and the held-out evaluation run
episodes unchanged (`p3o.envs.EpisodeEngine`), the episode metrics reach metrics.jsonl, and bad agent settings are
one line with exit 2 before the run directory exists."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from p3o.config import load_config
from p3o.train.cli import main as train_main
from p3o.train.loop import run

BASE = [
    "--model.name", "tiny-random", "--steps", "2", "--rollout.prompts_per_step", "2", "--rollout.group_size", "2",
    "--task.n_eval", "4", "--log.eval_every", "2", "--log.progress", "false", "--log.plot", "false",
    "--log.tensorboard", "false", "--ckpt.every", "0", "--update.micro_batch_size", "4",
]  # fmt: skip


def test_guess_episodes_train_and_log_their_metrics(tmp_path: Path) -> None:
    """guess-a-number (user feedback turns, no stop strings) on the random tiny model, async loop: two steps of
    episodes, every episode key logged, the model tokens (not the observations) counted as the run's tokens."""
    argv = [*BASE, "--run_dir", str(tmp_path / "r"), "--agent.env", "guess", "--task.name", "guess"]
    argv += ["--agent.max_turns", "3", "--agent.max_turn_tokens", "6", "--agent.max_total_tokens", "64"]
    out = run(load_config(argv))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    last = rows[-1]
    for key in ("turns", "tool_calls", "tool_errors", "parse_errors", "obs_share", "multi_version", "cut"):
        assert f"episode/{key}" in last, key
    assert 1 <= last["episode/turns"] <= 3
    assert last["tokens"] == pytest.approx(last["episode/model_tokens"] * 4)  # 2 prompts × 2 episodes, model tokens
    assert "eval_accuracy" in last and rows[0]["step"] == 0
    assert (out / "final").is_dir()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--agent.env", "nosuch", "--task.name", "calc"], "environment 'nosuch': unknown"),
        (
            ["--agent.env", "calc", "--task.name", "calc"],
            "stop string '</calc>' is",
        ),  # tiny-random has no </calc> token
        (["--agent.env", "guess", "--agent.env_kwargs.colour", "red"], "environment 'guess'"),
        (["--agent.max_turns", "0"], "agent.max_turns"),
    ],
)
def test_bad_agent_settings_exit_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], options: list[str], message: str
) -> None:
    run_dir = tmp_path / "r"
    assert train_main([*BASE, "--run_dir", str(run_dir), *options]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not run_dir.exists()
