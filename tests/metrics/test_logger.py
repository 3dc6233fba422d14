"""p3o.metrics: JSONL logging, optional sinks, reading back, progress bar, plots and `p3o plot`."""

from __future__ import annotations

import importlib.util
import io
import json
import math
import sys

import pytest
import torch

from p3o.cli import main as p3o_main
from p3o.errors import DataError, P3OError
from p3o.metrics import METRICS_FILE, MetricsLogger, ProgressBar, format_metrics, plot_run, read_metrics
from p3o.metrics.plot import main

HAS_WANDB = importlib.util.find_spec("wandb") is not None


def _synthetic(run_dir, steps=12, keys=None):
    """Write a metrics file the way the training loop does, with every plotted key unless ``keys`` is given."""
    with MetricsLogger(run_dir, tensorboard=False, wandb=False) as log:
        for s in range(1, steps + 1):
            m = {
                "reward_mean": s / steps,
                "accuracy": s / (2 * steps),
                "ess": 1 - 0.01 * s,
                "kl_weight": 0.02 * s,
                "lag_min": 0,
                "lag_mean": 1.5,
                "lag_max": 3,
                "response_len_mean": 30 - s,
            }
            log.log(s, {k: v for k, v in m.items() if keys is None or k in keys})


def test_jsonl_lines_are_flushed_strict_json(tmp_path):
    log = MetricsLogger(tmp_path, config={"seed": 0}, tensorboard=False, wandb=False)
    assert log.backends == ["jsonl"]
    rec = log.log(1, {"reward_mean": torch.tensor(0.25), "ess": float("nan"), "x": float("inf"), "n": 3, "ok": True})
    # Readable before close: every line is flushed.
    lines = (tmp_path / METRICS_FILE).read_text().splitlines()
    assert len(lines) == 1
    assert json.loads(lines[0]) == {"step": 1, "reward_mean": 0.25, "ess": None, "x": None, "n": 3, "ok": 1}
    assert rec["ess"] is None
    assert "NaN" not in lines[0] and "Infinity" not in lines[0]
    log.log(2, {"reward_mean": 0.5})
    log.close()
    log.close()  # idempotent
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]
    with pytest.raises(TypeError, match="metric 'v'"):
        MetricsLogger(tmp_path / "b", tensorboard=False, wandb=False).log(1, {"v": torch.ones(2)})


def test_disabled_logger_writes_nothing(tmp_path):
    log = MetricsLogger(tmp_path / "rank1", enabled=False)
    log.log(1, {"reward_mean": 1.0})
    log.close()
    assert log.backends == []
    assert not (tmp_path / "rank1").exists()


def test_tensorboard_auto_writes_events(tmp_path):
    pytest.importorskip("tensorboard")
    with MetricsLogger(tmp_path, config={"optim": {"lr": 1e-4}}, wandb=False) as log:
        assert "tensorboard" in log.backends
        log.log(1, {"reward_mean": 0.5})
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


@pytest.mark.skipif(HAS_WANDB, reason="checks the behaviour without wandb installed")
def test_wandb_auto_is_silent_and_true_names_the_extra(tmp_path):
    with MetricsLogger(tmp_path, tensorboard=False, wandb="auto") as log:
        assert log.backends == ["jsonl"]
    with pytest.raises(P3OError, match=r"p3o\[wandb\]"):
        MetricsLogger(tmp_path / "w", tensorboard=False, wandb=True)


class _FakeWandb:
    """Stands in for the wandb module: records init kwargs and logged rows."""

    def __init__(self):
        self.inits, self.rows, self.finished = [], [], 0

    def init(self, **kwargs):
        self.inits.append(kwargs)
        return self

    def log(self, row, step):
        self.rows.append((step, row))

    def finish(self):
        self.finished += 1


def test_wandb_only_when_configured_and_never_prompting(tmp_path, monkeypatch):
    fake = _FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    for var in ("WANDB_MODE", "WANDB_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    with MetricsLogger(tmp_path / "a", tensorboard=False) as log:  # installed but not configured: off
        assert log.backends == ["jsonl"]
    assert fake.inits == []
    with MetricsLogger(tmp_path / "b", tensorboard=False, wandb=True) as log:  # forced: offline, no login prompt
        assert log.backends == ["jsonl", "wandb"]
    assert fake.inits[-1]["mode"] == "offline"
    monkeypatch.setenv("WANDB_MODE", "offline")
    with MetricsLogger(tmp_path / "c", {"seed": 1}, tensorboard=False, wandb_project="proj") as log:
        assert log.backends == ["jsonl", "wandb"]
        log.log(3, {"reward_mean": 0.5, "note": "text", "ess": math.nan})
    assert "mode" not in fake.inits[-1] and fake.inits[-1]["project"] == "proj"
    assert fake.inits[-1]["config"] == {"seed": 1}
    assert fake.rows[-1] == (3, {"reward_mean": 0.5})  # numbers only; null (NaN) left out
    assert fake.finished == 2


def test_truncate_after_drops_steps_past_a_resumed_checkpoint(tmp_path):
    _synthetic(tmp_path, steps=6)
    with MetricsLogger(tmp_path, tensorboard=False, wandb=False, truncate_after=4) as log:
        log.log(5, {"reward_mean": 9.0})
    steps = [r["step"] for r in read_metrics(tmp_path)]
    assert steps == [1, 2, 3, 4, 5]
    assert read_metrics(tmp_path)[-1]["reward_mean"] == 9.0


def test_read_metrics_ignores_a_torn_last_line_only(tmp_path):
    path = tmp_path / METRICS_FILE
    path.write_text('{"step": 1, "reward_mean": 0.1}\n{"step": 2, "rew')
    assert read_metrics(tmp_path) == [{"step": 1, "reward_mean": 0.1}]
    assert read_metrics(path) == [{"step": 1, "reward_mean": 0.1}]  # the file itself is accepted too
    path.write_text('{"step": 1}\nnot json\n{"step": 3}\n')
    with pytest.raises(DataError, match=r"metrics.jsonl:2: malformed"):
        read_metrics(tmp_path)
    with pytest.raises(DataError, match="no metrics file"):
        read_metrics(tmp_path / "nothing")


def _png_size(path) -> tuple[int, int]:
    """(width, height) from the PNG header."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_plot_run_draws_all_panels(tmp_path):
    _synthetic(tmp_path)
    out = plot_run(tmp_path)
    assert out == tmp_path / "plot.png"
    # 4 panels in a 2 × 2 grid of 6 × 3.6 inch panels at 110 dpi.
    assert _png_size(out) == (1320, 792)


def test_plot_run_skips_absent_panels(tmp_path):
    _synthetic(tmp_path, keys={"reward_mean"})
    out = plot_run(tmp_path, tmp_path / "sub" / "r.png")
    assert _png_size(out) == (660, 396)  # one panel only
    # A panel whose metric is present but always null is skipped too.
    other = tmp_path / "nan"
    with MetricsLogger(other, tensorboard=False, wandb=False) as log:
        for s in range(3):
            log.log(s, {"reward_mean": 0.1 * s, "ess": math.nan, "response_len_mean": 5})
    assert _png_size(plot_run(other)) == (1320, 396)  # reward + length


def test_plot_run_errors(tmp_path):
    (tmp_path / METRICS_FILE).write_text("")
    with pytest.raises(DataError, match="no metrics recorded yet"):
        plot_run(tmp_path)
    (tmp_path / METRICS_FILE).write_text('{"step": 1, "foo": 1}\n')
    with pytest.raises(DataError, match="none of the plotted metrics"):
        plot_run(tmp_path)


def test_plot_command(tmp_path, capsys):
    _synthetic(tmp_path / "run")
    assert main([str(tmp_path / "run"), "--out", str(tmp_path / "o.png")]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "o.png")
    assert (tmp_path / "o.png").is_file()
    # Through the real `p3o` dispatcher: one-line errors, exit code 2.
    for bad, msg in [
        (tmp_path / "missing", "no such run directory"),
        (tmp_path, "no metrics.jsonl in this directory"),
    ]:
        assert p3o_main(["plot", str(bad)]) == 2
        err = capsys.readouterr().err.strip()
        assert msg in err and "\n" not in err
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / METRICS_FILE).write_text("")
    assert p3o_main(["plot", str(tmp_path / "empty")]) == 2
    assert "no metrics recorded yet" in capsys.readouterr().err


def test_progress_bar_disabled_off_terminal_and_live_on_one():
    off = ProgressBar(5)  # pytest captures stderr: not a terminal
    assert not off.enabled
    off.update(1, {"reward_mean": 0.5})
    off.close()
    assert not ProgressBar(5, enabled=False).enabled

    from rich.console import Console

    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=120)
    with ProgressBar(4, console=console, description="train") as bar:
        assert bar.enabled
        bar.update(2, {"reward_mean": torch.tensor(0.5), "ess": 0.875})
    text = buf.getvalue()
    assert "reward 0.500" in text and "ESS 0.875" in text and "2/4" in text


def test_progress_without_a_terminal_prints_a_line_every_few_steps():
    out = io.StringIO()
    bar = ProgressBar(20, description="p3o", every=5, stream=out)
    assert not bar.enabled and bar.lines
    evaluate = bar.wrap_evaluation(lambda version: {"eval_accuracy": 0.75, "eval_score": 0.8})
    assert evaluate(0)["eval_accuracy"] == 0.75
    for step in range(1, 21):
        row = {"reward_mean": 0.5, "ess": 0.9, "lag_mean": 1.0}
        if step == 10:
            row["eval_accuracy"] = 0.8
        bar.update(step, row)
    bar.close()
    lines = out.getvalue().splitlines()
    assert lines[0] == "p3o: held-out pass@1 0.750 before training"
    steps = [int(ln.split()[2].split("/")[0]) for ln in lines[1:]]
    assert steps == [1, 5, 10, 15, 20]  # the first step, every 5th, the last
    assert "reward 0.500  ESS 0.900  lag 1.00  pass@1 0.750" in lines[1] and "steps/s" in lines[1]
    assert "left" in lines[1] and "left" not in lines[-1]
    assert "pass@1 0.800" in lines[3] and "pass@1 0.800" in lines[-1]
    assert all(not ln.startswith("p3o p3o") for ln in lines)


@pytest.mark.parametrize("version", [4, 10])
def test_a_first_evaluation_after_steps_is_labelled_with_its_step(version: int) -> None:
    """`--log.eval_every 0` (the only evaluation at the end) or `--resume`: the first evaluation is not the starting
    policy's, so it is not "before training" (issue 40)."""
    out = io.StringIO()
    bar = ProgressBar(20, description="p3o", every=5, stream=out, start=version - 1)
    bar.wrap_evaluation(lambda version: {"eval_accuracy": 0.25})(version)
    bar.close()
    assert out.getvalue().splitlines()[0] == f"p3o: held-out pass@1 0.250 at step {version}"


def test_progress_prints_each_finding_once_with_its_cause():
    out = io.StringIO()
    bar = ProgressBar(5, description="p3o", every=100, stream=out)
    fire = {"offpolicy/finding_ratio_tails": 1.0, "offpolicy/cause_ratio_tails": 2.0, "offpolicy/finding_low_ess": 0.0}
    for step in (1, 2, 3):
        bar.update(step, fire)
    findings = [ln for ln in out.getvalue().splitlines() if "finding" in ln]
    assert len(findings) == 1
    assert findings[0].startswith("p3o: finding at step 1: ratio_tails (cause: engine mismatch): ")
    assert bar.findings == {"ratio_tails": 1}


def test_progress_bar_on_a_terminal_has_one_label_and_the_evaluation_phase():
    from rich.console import Console

    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=160)
    with ProgressBar(4, console=console, description="p3o") as bar:
        seen = []

        def evaluate(version):
            seen.append(bar._progress.tasks[0].fields["phase"])  # what the bar shows while it runs
            return {"eval_accuracy": 0.625}

        bar.wrap_evaluation(evaluate)(2)
        bar.update(2, {"reward_mean": 0.5})
        assert bar._progress.tasks[0].fields["phase"] == ""
    assert seen == ["evaluating held-out"]
    text = buf.getvalue()
    assert "p3o p3o" not in text and "pass@1 0.625" in text


def test_format_metrics():
    line = format_metrics(3, {"reward_mean": 0.41234, "n": 2, "name": "x"}, keys=["reward_mean", "n", "missing"])
    assert line == "step 3 reward_mean=0.4123 n=2"


def test_moving_average_centred_and_skips_nan():
    from p3o.metrics import smooth

    # window 3: (1+2)/2, (1+2+3)/3, (2+3+4)/3, (3+4)/2 ; a NaN in the window is skipped
    assert smooth([1.0, 2.0, 3.0, 4.0], 3, mode="centred").tolist() == [1.5, 2.0, 3.0, 3.5]
    assert smooth([1.0, math.nan, 3.0], 3, mode="centred").tolist() == [1.0, 2.0, 3.0]
