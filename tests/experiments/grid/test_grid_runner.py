"""The grid runner and `p3o compare` end to end with a fake training command: resumability, failures, --jobs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from p3o.cli import main as p3o_main
from p3o.experiments.grid.runner import format_value, is_finished, run_grid, train_argv
from p3o.experiments.grid.spec import expand, parse_experiment

FAKE = [sys.executable, str(Path(__file__).parents[1] / "fake_train.py")]


def experiment(tmp_path: Path, objectives: list, seeds: int = 2) -> dict:
    return {
        "name": "t",
        "base": {"steps": 12},
        "objectives": objectives,
        "regimes": ["on-policy", "stale-2"],
        "seeds": seeds,
        "out_dir": str(tmp_path / "out"),
        "eval": {"n_samples": 0},
        "analysis": {"smooth": 2},
    }


def test_train_argv_formats_values() -> None:
    exp = parse_experiment({"name": "t", "objectives": ["grpo-0.4"], "regimes": ["stale-4"], "base": {"x.flag": True}})
    argv = train_argv(expand(exp)[0], ["train"])
    pairs = dict(zip(argv[1::2], argv[2::2]))
    assert pairs["--x.flag"] == "true" and pairs["--loop.staleness"] == "4" and pairs["--objective.clip_eps"] == "0.4"
    assert pairs["--loop.mode"] == "stale" and pairs["--seed"] == "0"
    assert format_value(None) == "null" and format_value([1, 2]) == "[1, 2]"


def test_run_grid_is_resumable_and_reports_failures(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = tmp_path / "calls.jsonl"
    monkeypatch.setenv("FAKE_TRAIN_CALLS", str(calls))
    exp = parse_experiment(experiment(tmp_path, ["p3o", {"label": "boom", "overrides": {"objective.name": "boom"}}]))
    runs = expand(exp)
    outcomes = run_grid(runs, log_root=exp.out_dir / "logs", jobs=2, train_cmd=FAKE)
    assert [o.spec.key for o in outcomes] == [r.key for r in runs]  # order of `runs`
    status = {o.spec.key: o.status for o in outcomes}
    assert status[("on-policy", "p3o", 0)] == "done" and status[("stale-2", "boom", 1)] == "failed"
    failed = next(o for o in outcomes if o.status == "failed")
    assert "exit 3" in failed.message and "boom: objective exploded" in failed.message
    assert len(calls.read_text().splitlines()) == 8
    done = runs[0].run_dir
    assert is_finished(done) and json.loads((done / "DONE").read_text())["argv"][: len(FAKE)] == FAKE
    # The stale regime's overrides reached the training command.
    stale = yaml.safe_load((exp.out_dir / "runs/stale-2/p3o/seed1/config.yaml").read_text())
    assert stale["loop"] == {"mode": "stale", "staleness": 2} and stale["seed"] == 1

    # Second invocation: finished runs are skipped, only the failed ones run again.
    outcomes = run_grid(runs, log_root=exp.out_dir / "logs", jobs=1, train_cmd=FAKE)
    assert {o.status for o in outcomes if o.spec.objective == "p3o"} == {"skipped"}
    assert len(calls.read_text().splitlines()) == 8 + 4


def test_interrupted_run_is_restarted_from_scratch(tmp_path: Path) -> None:
    exp = parse_experiment(experiment(tmp_path, ["p3o"], seeds=1))
    spec = expand(exp)[0]
    # A run that an earlier grid started (its log exists) but that died: partial files, no DONE, no final/.
    spec.run_dir.mkdir(parents=True)
    (spec.run_dir / "stale-file").write_text("x")
    log = exp.out_dir / "logs" / spec.regime / spec.objective / "seed0.log"
    log.parent.mkdir(parents=True)
    log.write_text("$ train ...\n")
    [outcome] = run_grid([spec], log_root=exp.out_dir / "logs", train_cmd=FAKE)
    assert outcome.status == "done" and not (spec.run_dir / "stale-file").exists()


def test_compare_cli_end_to_end_with_fake_train(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    raw = experiment(tmp_path, ["p3o", {"label": "collapse", "overrides": {"objective.name": "collapse"}}], seeds=3)
    raw["claims"] = [
        {
            "id": "a",
            "title": "collapse vs stable",
            "kind": "collapse",
            "regimes": ["stale-2"],
            "objectives": ["p3o", "collapse"],
            "metric": "collapsed",
        },
        {"id": "b", "title": "t", "kind": "tracks", "regimes": ["on-policy"], "objectives": ["p3o", "collapse"]},
    ]
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(raw))
    report = tmp_path / "docs" / "results.md"
    argv = [
        "compare",
        str(path),
        "--jobs",
        "2",
        "--train-cmd",
        " ".join(FAKE),
        "--report",
        str(report),
        "--exploratory",
    ]
    assert p3o_main(argv) == 0
    out = capsys.readouterr().out
    assert "[12/12]" in out and f"report: {report}" in out
    text = report.read_text()
    assert (tmp_path / "docs/figures/t-on-policy.png").stat().st_size > 1000
    assert (tmp_path / "docs/figures/t-overview.png").is_file()
    assert "![on-policy](figures/t-on-policy.png)" in text
    assert "stale-2: runs that collapsed" in text.replace("**", "") and "collapse 3/3, " not in text
    assert "p3o 0/3, collapse 3/3" in text
    # p3o: reward 0.05·s + 0.01·seed, 12 steps; final = mean of the last ⌈0.2·12⌉ = 3 steps → 0.55 + 0.01·seed
    assert "| p3o | 3/3 | 0.560 ± 0.010 |" in text
    # Nothing re-runs the second time; --report-only just re-aggregates.
    assert (
        p3o_main(["compare", str(path), "--train-cmd", " ".join(FAKE), "--report", str(report), "--exploratory"]) == 0
    )
    assert "skipped" in capsys.readouterr().out
    assert p3o_main(["compare", str(path), "--report-only", "--report", str(report), "--exploratory"]) == 0


def test_compare_cli_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert p3o_main(["compare", str(tmp_path / "missing.yaml")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "missing.yaml" in err
    path = tmp_path / "e.yaml"
    path.write_text(yaml.safe_dump(experiment(tmp_path, ["p3o"])))
    assert p3o_main(["compare", str(path), "--jobs", "0"]) == 2
    assert "jobs: must be >= 1" in capsys.readouterr().err


def test_compare_exit_code_when_a_run_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "e.yaml"
    raw = experiment(tmp_path, [{"label": "boom", "overrides": {"objective.name": "boom"}}], seeds=1)
    raw["regimes"] = ["on-policy"]
    path.write_text(yaml.safe_dump(raw))
    assert p3o_main(["compare", str(path), "--train-cmd", " ".join(FAKE), "--exploratory"]) == 1
    assert "1 run(s) failed" in capsys.readouterr().err
    assert "Runs without metrics" in (tmp_path / "out" / "report.md").read_text()


def test_in_process_runs_call_the_train_cli_main(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    import p3o.train.cli

    spec_ = importlib.util.spec_from_file_location("fake_train", FAKE[1])
    fake = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(fake)  # type: ignore[union-attr]
    seen: list[list[str]] = []

    def train_main(argv: list[str]) -> int:
        seen.append(argv)
        print("training...")  # goes to the run's log, not the console
        return fake.main(argv)

    monkeypatch.setattr(p3o.train.cli, "main", train_main)
    raw = experiment(tmp_path, ["p3o", {"label": "boom", "overrides": {"objective.name": "boom"}}], seeds=1)
    raw["regimes"] = ["on-policy"]
    exp = parse_experiment(raw)
    ok, bad = run_grid(expand(exp), log_root=exp.out_dir / "logs", in_process=True)
    assert ok.status == "done" and bad.status == "failed" and bad.returncode == 3
    assert seen[0][:4] == ["--steps", "12", "--loop.mode", "sync"] and "training..." in ok.log_path.read_text()
    assert "boom: objective exploded" in bad.log_path.read_text()
    with pytest.raises(ValueError, match="jobs=1"):
        run_grid(expand(exp), log_root=exp.out_dir / "logs", in_process=True, jobs=2)


def test_after_hook_runs_per_finished_run_and_its_errors_do_not_fail_it(tmp_path: Path) -> None:
    exp = parse_experiment(experiment(tmp_path, ["p3o", {"label": "boom", "overrides": {"objective.name": "boom"}}]))
    seen: list[tuple] = []

    def after(spec) -> str:
        seen.append(spec.key)
        if spec.seed == 1:
            raise RuntimeError("eval broke")
        return "pass@1 0.5"

    outcomes = run_grid(expand(exp), log_root=exp.out_dir / "logs", jobs=2, train_cmd=FAKE, after=after)
    by_key = {o.spec.key: o for o in outcomes}
    assert sorted(seen) == sorted(k for k, o in by_key.items() if o.spec.objective == "p3o")  # not after failures
    assert by_key[("on-policy", "p3o", 0)].message == "pass@1 0.5"
    ok = by_key[("stale-2", "p3o", 1)]
    assert ok.status == "done" and ok.message == "after-run step failed: RuntimeError: eval broke"


def test_finished_run_with_other_settings_is_reported_not_reused(tmp_path: Path) -> None:
    raw = experiment(tmp_path, ["p3o"], seeds=1)
    raw["regimes"] = ["on-policy"]
    exp = parse_experiment(raw)
    [first] = run_grid(expand(exp), log_root=exp.out_dir / "logs", train_cmd=FAKE)
    assert first.status == "done"
    raw["base"]["steps"] = 20  # the grid changed after the run finished
    exp = parse_experiment(raw)
    [again] = run_grid(expand(exp), log_root=exp.out_dir / "logs", train_cmd=FAKE)
    assert again.status == "failed" and "finished with other settings (--steps)" in again.message
    assert len((first.spec.run_dir / "metrics.jsonl").read_text().splitlines()) == 12  # left as it was


@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_base_and_every_run_are_evaluated_on_the_grids_one_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine: str
) -> None:
    """A run trained with vLLM rollouts and the base (HF) are both evaluated on `eval.engine` (issue 20: one engine
    for every arm and the base), and eval.json records it."""
    import p3o.eval.runner as eval_runner
    from p3o.eval.runner import EvalResult
    from p3o.experiments.grid import compare as cli

    seen: list[str] = []

    def fake_eval(model: str, *args: object, engine: str = "?", **kwargs: object) -> EvalResult:
        seen.append(engine)
        return EvalResult("arithmetic", "test", 2, 1, 1.0, 8, {1: 0.5}, 0.5, 3.0, 0.0, [1, 0], 0.1)

    monkeypatch.setattr(eval_runner, "evaluate_checkpoint", fake_eval)
    raw = experiment(tmp_path, ["p3o"])
    raw["regimes"] = [{"label": "vllm-run", "overrides": {"rollout.engine": "vllm"}}]
    raw["eval"] = {"n_samples": 1, "n_problems": 2, "engine": engine}
    exp = parse_experiment(raw)
    spec = expand(exp)[0]
    (spec.run_dir / "final").mkdir(parents=True)
    assert cli._eval_run(spec, exp).startswith("pass@1")
    cli._eval_base(exp)
    assert seen == [engine, engine]
    assert json.loads((spec.run_dir / "eval.json").read_text())["engine"] == engine
    assert json.loads((exp.out_dir / "base_eval.json").read_text())["engine"] == engine


def test_done_records_when_and_where_a_run_ran(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from datetime import datetime

    from p3o.experiments.grid.runner import base_key, cpu_kind

    monkeypatch.setenv("P3O_CACHE", str(tmp_path / "cache"))
    exp = parse_experiment({**experiment(tmp_path, ["p3o"], seeds=1), "base": {"steps": 3, "model.name": "tiny"}})
    spec = expand(exp)[0]
    [outcome] = run_grid([spec], log_root=exp.out_dir / "logs", train_cmd=FAKE)
    assert outcome.status == "done"
    done = json.loads((spec.run_dir / "DONE").read_text())
    start, end = datetime.fromisoformat(done["started_at"]), datetime.fromisoformat(done["ended_at"])
    assert start.utcoffset() is not None and start.utcoffset().total_seconds() == 0 and start <= end
    assert 0 < done["wall_s"] <= (end - start).total_seconds() + 0.01
    assert done["cpu"] == cpu_kind() and "(" in done["cpu"]
    # the fake's final/config.json names no base: the shipped base's id (name @ its weights' sha256) for a shipped
    # name, the cache key of a built base when that entry exists, else the configured name
    from p3o.models.bases import base_id, stamp
    from p3o.models.tiny import base_dir

    assert done["base_key"] == base_id(stamp("tiny")) and done["base_key"].startswith("tiny@")
    base_dir("5m").mkdir(parents=True)
    assert base_key(spec.run_dir, "tiny-5m") == base_dir("5m").name and base_dir("5m").name.startswith("tiny-5m-")
    assert base_key(spec.run_dir, "tiny-random") == "tiny-random"
    (spec.run_dir / "final" / "config.json").write_text(json.dumps({"_name_or_path": "/c/models/tiny-1m-abc"}))
    assert base_key(spec.run_dir, "tiny") == "tiny-1m-abc"
    saved = {"_name_or_path": "/site/p3o/models/shipped/tiny", "p3o_base": stamp("tiny")}  # what a run saves
    (spec.run_dir / "final" / "config.json").write_text(json.dumps(saved))
    assert base_key(spec.run_dir, "tiny") == base_id(stamp("tiny"))
    assert base_key(tmp_path / "nowhere", None) is None
