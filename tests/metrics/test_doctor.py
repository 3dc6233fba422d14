"""``p3o doctor PATH``: exit 0 on a healthy run, 1 when a finding fires, 2 on bad input; p3o run dirs, TRL
trainer_state.json and plain JSONL are read and their off-policy keys mapped onto the monitor's names; on real p3o
runs of the tiny model: an engine that ignores the weight sync, a one-step ESS collapse named by its step, and the
default job's settings staying healthy (the TRL runs: tests/integrations/test_trl_doctor.py)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from p3o.cli import main as p3o_main
from p3o.metrics.doctor import diagnose, load_rows, main
from p3o.metrics.monitor import OffPolicyMonitor


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
    assert main([str(out / "trainer_state.json"), "--no-plot"]) == 0  # 5 of 10 steps: too early to judge
    assert main([str(out / "trainer_state.json"), "--no-plot", "--window", "5"]) == 1


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


def test_long_run_slides_windows_and_names_the_collapsed_step(tmp_path: Path, capsys) -> None:
    rows = []
    for s in range(1, 61):  # fresh tokens clean throughout; the stale ones fall behind in steps 20-39, collapse at 45
        r = {"step": s, "ess": 0.99, "lag_mean": 1.0, "tokens_lag_0": 50, "tokens_stale": 50, "ess_lag_0": 1.0}
        r["ess_stale"] = 0.5 if 20 <= s < 40 else 0.05 if s == 45 else 0.98
        r["ess"] = 0.6 if 20 <= s < 40 else 0.1 if s == 45 else 0.99
        rows.append(r)
    path = _jsonl(tmp_path / "m.jsonl", rows)
    d = diagnose(path)
    assert d.windows == 41 and [(f.name, span, n) for f, span, n in d.findings] == [
        ("ess_collapse", "45", 0),
        ("low_ess", "11–30", 20),  # the first window with 11 of 20 low; 20 windows in all
    ]
    assert {f.cause for f, _, _ in d.findings} == {"staleness"} and d.trainer is None
    assert main([str(path), "--no-plot", "--window", "30"]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[:2] == [
        "unhealthy: staleness (ess_collapse, low_ess)",
        f"p3o doctor: JSONL {path}: 60 steps, 31 windows of 30 steps",
    ]
    assert "| whole run |" in out and "train on fresher data" in out  # no trainer detected: generic words


# ------------------------------------------------------------------------------------- real p3o training runs


def _even_tokens(ro) -> torch.Tensor:
    """Reward: the share of even token ids in a response. The random tiny model earns about half and the policy
    climbs it steadily, so its weights keep moving one way (the task's own verifier gives a random model 0)."""
    even = ((ro.response_ids % 2) == 0) & ro.mask
    return (even.sum(1) / ro.mask.sum(1).clamp(min=1)).float()


def _train(tmp_path: Path, name: str, *overrides: str, config: str = "quick") -> Path:
    """A real p3o run of the built-in tiny model (random init: no warm-start to build) with the even-token reward."""
    from p3o.config import load_config
    from p3o.train.loop import run
    from p3o.train.wiring import build_components

    torch.set_num_threads(1)
    args = ["--config", config, "--run_dir", str(tmp_path / name), "--model.name", "tiny-random"]
    args += ["--log.eval_every", "0", "--log.plot", "false", "--log.progress", "false", "--ckpt.every", "0"]
    args += ["--task.n_eval", "0"]  # no held-out evaluation: the doctor reads the training rows only
    cfg = load_config([*args, "--rollout.prompts_per_step", "8", "--update.micro_batch_size", "32", *overrides])
    comps = dataclasses.replace(build_components(cfg), reward_fn=_even_tokens)
    return run(cfg, components=comps)


def test_engine_that_ignores_the_weight_sync_is_reported(tmp_path: Path, monkeypatch, capsys) -> None:
    """The engine's weight copy is disabled by a test hook (the version still advances, as when LoRA adapters or a
    repacked layer silently miss the sync): fresh tokens' mismatch grows step by step -> weights not reaching the
    engine."""
    import p3o.rollout.hf as hf

    def version_only(self, state_dict, version) -> None:
        self.version = int(version)

    monkeypatch.setattr(hf.HFEngine, "load_weights", version_only)
    run = _train(tmp_path, "nosync", "--steps", "8", "--loop.mode", "sync", "--optim.lr", "1e-4",
                 "--optim.schedule", "constant")  # fmt: skip
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    fresh = [r["offpolicy/dlogp_mean_lag_0"] for r in rows]
    assert fresh[0] < 1e-5 < 0.02 < fresh[-1]  # the engine starts with the trainer's weights, then stays behind
    assert (
        rows[-1]["offpolicy/finding_weights_not_synced"] == 1.0 and rows[-1]["offpolicy/cause_weights_not_synced"] == 4
    )
    assert main([str(run), "--no-plot"]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("unhealthy: weights not reaching the engine (weights_not_synced")
    assert "8 steps, too early to judge by the window rules, which need 10" in out and "load_weights" in out


def test_one_step_ess_collapse_is_named_by_its_step(tmp_path: Path, monkeypatch, capsys) -> None:
    """A 12-step run whose engine glitches once (step 7's recorded log-probs off by N(0, 1.8²): an ESS near 0.05) fires
    the collapse rule at once, naming step 7, although the window rule (ESS < 0.9 on more than half the steps) stays
    silent; the tokens are fresh (sync mode), so the cause is the engine."""
    import p3o.rollout.hf as hf

    generate, calls = hf.HFEngine.generate, []

    def glitch_once(self, *args, **kwargs):
        ro = generate(self, *args, **kwargs)
        calls.append(1)
        if len(calls) == 7:  # sync mode, no evaluation: the 7th generation is step 7's batch
            noise = 1.8 * torch.randn(ro.rollout_logp.shape, generator=torch.Generator().manual_seed(0))
            ro = dataclasses.replace(ro, rollout_logp=ro.rollout_logp + noise.to(ro.rollout_logp) * ro.mask)
        return ro

    monkeypatch.setattr(hf.HFEngine, "generate", glitch_once)
    run = _train(tmp_path, "glitch", "--steps", "12", "--loop.mode", "sync")
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    ess = {int(r["step"]): r["offpolicy/ess"] for r in rows}
    assert ess[7] < 0.2 and min(v for s, v in ess.items() if s != 7) > 0.9, ess
    assert rows[6]["offpolicy/finding_ess_collapse"] == 1.0 and rows[6]["offpolicy/cause_ess_collapse"] == 2  # live
    d = diagnose(run)
    names = [f.name for f, _, _ in d.findings]
    assert names[0] == "ess_collapse" and "low_ess" not in names  # ratio_tails: that one step's tails, 1 % over 12
    assert {f.cause for f, _, _ in d.findings} == {"engine"}  # sync mode: every token fresh
    (f, _, _) = d.findings[0]
    assert "step 7 " in f.message and f"ESS {ess[7]:.3f}" in f.evidence and f.cause == "engine"
    assert main([str(run), "--no-plot"]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[0] == f"unhealthy: engine mismatch ({', '.join(names)})"
    assert "12 steps, shorter than the 20-step window: judged on its own 12 steps" in out


def test_the_default_run_stays_healthy(tmp_path: Path, capsys) -> None:
    """The default job's settings (async, loop.max_lag 2, P3O, fp32 engine, lr 2e-4) on a 12-step run: healthy."""
    run = _train(tmp_path, "default", "--steps", "12", "--rollout.max_new_tokens", "16", config="default")
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert max(r["lag_max"] for r in rows) == 2 and min(r["offpolicy/ess"] for r in rows) < 0.999  # off-policy
    assert main([str(run), "--out", str(tmp_path / "d.png")]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "healthy" and "12 steps" in out
    assert all(r[f"offpolicy/cause_{n}"] == 0 for r in rows for n in OffPolicyMonitor.FINDINGS)


def test_sync_run_with_four_mini_batches_names_staleness_not_the_engine(tmp_path: Path, capsys) -> None:
    """Issue 40's `p3o train --loop.mode sync --update.num_mini_batches 4 --steps 4 --optim.lr 1e-3 --optim.schedule
    constant` (lr 1e-2 here: the random tiny model moves less per step than the warm-started one) with an fp32
    engine: mini-batch k is scored after k optimizer updates on its own batch, so the monitor's lag is 0-3 and only
    mini-batch 0 is fresh; its tokens match the engine, so neither the live monitor nor the doctor blames the engine,
    and the doctor names staleness from mini-batches (before: "unhealthy: engine mismatch", fix rollout.precision)."""
    run = _train(tmp_path, "mb4", "--loop.mode", "sync", "--update.num_mini_batches", "4", "--steps", "4",
                 "--optim.lr", "1e-2", "--optim.schedule", "constant")  # fmt: skip
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for r in rows:
        assert r["lag_mean"] == 0.0 and r["offpolicy/lag_max"] == 3.0  # versions 0; updates 0-3
        assert r["offpolicy/lag_in_batch_mean"] == pytest.approx(r["offpolicy/lag_mean"])
        assert r["offpolicy/dlogp_mean_lag_0"] < 1e-4 < r["offpolicy/dlogp_mean_stale"]  # fp32 engine: fresh is clean
        assert r["offpolicy/finding_engine_mismatch"] == 0.0
        assert all(r[f"offpolicy/cause_{n}"] in (0, 1) for n in OffPolicyMonitor.FINDINGS)  # live: staleness or none
    assert main([str(run), "--no-plot"]) == 0  # 4 of 20 steps: too early to judge, low_ess an early sign
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("too early to judge: 4 of the 10 steps the window rules need; early signs:")
    assert "low_ess" in out.splitlines()[0] and "engine mismatch" not in out and "rollout.precision" not in out
    assert main([str(run), "--no-plot", "--window", "4"]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("unhealthy: staleness from mini-batches (low_ess")
    assert "lower update.num_mini_batches" in out and "this run: loop.mode sync, update.num_mini_batches 4" in out
    assert "engine" not in out.splitlines()[0] and "rollout.precision" not in out


def test_engine_finding_names_the_trainer_compute_precision() -> None:
    """A bf16 trainer (mixed precision over fp32 weights, or all-bf16) against an fp32 engine is a mismatch of both
    sides: the suggestion says what the trainer computes in, not only the engine's precision."""
    from p3o.metrics.doctor import _suggestion
    from p3o.metrics.rules import Finding

    f = Finding("engine_mismatch", "m", "e", "record rollout log-probs in fp32", "engine")
    mixed = {"train": {"mixed_precision": "bf16"}, "model": {"dtype": "float32"}, "rollout": {"precision": "fp32"}}
    assert "trainer computes in bf16" in _suggestion(f, mixed)
    assert "trainer computes in bfloat16" in _suggestion(f, {"model": {"dtype": "bfloat16"}, "train": {}})
    plain = {"train": {"mixed_precision": "no"}, "model": {"dtype": "float32"}, "rollout": {"precision": "fp32"}}
    assert "trainer computes" not in _suggestion(f, plain)
