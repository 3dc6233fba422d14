"""``p3o doctor PATH``: exit 0 on a healthy run, 1 when a finding fires, 2 on bad input; p3o run dirs, TRL
trainer_state.json and plain JSONL are read and their off-policy keys mapped onto the monitor's names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from p3o.cli import main as p3o_main
from p3o.metrics.doctor import diagnose, load_rows, main


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _healthy(n: int = 25) -> list[dict]:
    return [
        {"step": s, "ess": 0.999, "lag_mean": 0.0, "ratio_frac_above_2": 0.0, "dlogp_pos_0": 0.001} for s in range(n)
    ]


def test_healthy_jsonl_exits_0_and_writes_the_plot(tmp_path: Path, capsys) -> None:
    path = _jsonl(tmp_path / "m.jsonl", _healthy())
    assert main([str(path), "--out", str(tmp_path / "d.png")]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "healthy" and "25 steps, 6 windows of 20 steps" in out
    assert (tmp_path / "d.png").stat().st_size > 0


def test_a_finding_exits_1_with_evidence_and_suggestion(tmp_path: Path, capsys) -> None:
    rows = _healthy(10) + [{"step": 10 + s, "ess": 0.6, "lag_mean": 3.0, "ess_lag_0": 0.99} for s in range(15)]
    run = tmp_path / "run"
    run.mkdir()
    _jsonl(run / "metrics.jsonl", rows)
    (run / "config.yaml").write_text("objective:\n  name: grpo\nloop:\n  max_lag: 8\n", encoding="utf-8")
    assert p3o_main(["doctor", str(run)]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "unhealthy: staleness (low_ess)"
    assert "loop.max_lag 8" in out and "hard clip 'grpo'" in out
    assert (run / "doctor.png").is_file()
    d = diagnose(run)
    (finding, span, windows) = d.findings[0]
    assert finding.name == "low_ess" and span == "1–20" and windows == 5  # the first window with 11 of 20 low


def test_trl_trainer_state_is_read_with_its_prefixes(tmp_path: Path) -> None:
    history = [{"step": s, "objective/ess": 0.5, "offpolicy/ess": 0.999, "loss": 0.1} for s in range(1, 6)]
    history.append({"train_runtime": 1.0})  # TRL's closing row has no off-policy key
    out = tmp_path / "out" / "checkpoint-5"
    out.mkdir(parents=True)
    (out / "trainer_state.json").write_text(json.dumps({"log_history": history}), encoding="utf-8")
    source, rows, _, trainer = load_rows(tmp_path / "out")
    assert source.startswith("TRL") and len(rows) == 5 and trainer == "trl"
    assert rows[0]["ess"] == 0.999  # the callback's offpolicy/ess wins over the objective's
    assert main([str(tmp_path / "out"), "--no-plot"]) == 0
    history = [{"step": s, "objective/ess": 0.5} for s in range(1, 6)]
    (out / "trainer_state.json").write_text(json.dumps({"log_history": history}), encoding="utf-8")
    assert main([str(out / "trainer_state.json"), "--no-plot"]) == 1


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("missing", None, "no such file"),
        ("empty_dir", "", "neither a p3o run dir"),
        ("no_keys.jsonl", '{"loss": 1.0}\n{"loss": 2.0}\n', "no off-policy metrics"),
        ("bad.jsonl", '{"ess": 1.0}\nnot json\n{"ess": 1.0}\n', "bad.jsonl:2: not JSON"),
        ("state.json", '{"nothing": 1}', "no log_history"),
        ("notes.txt", "hello", "expected a run dir"),
    ],
)
def test_bad_input_exits_2_with_one_line(tmp_path: Path, capsys, name: str, content: str | None, message: str) -> None:
    path = tmp_path / name
    if content == "":
        path.mkdir()
    elif content is not None:
        path.write_text(content, encoding="utf-8")
    assert main([str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err


def test_bad_window_exits_2(tmp_path: Path) -> None:
    assert main([str(_jsonl(tmp_path / "m.jsonl", _healthy())), "--window", "0"]) == 2
