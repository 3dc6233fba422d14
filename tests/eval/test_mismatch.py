"""``p3o mismatch``: the engine-vs-trainer report on the tiny random model, its per-position table and plot, and
its findings on an engine whose log-probs drift along the response."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import p3o.rollout
from p3o.cli import main as p3o_main
from p3o.errors import ConfigError
from p3o.eval.mismatch import encode_prompts, measure
from p3o.eval.mismatch_cli import main
from p3o.models import load_policy

ARGS = ["--model", "tiny-random", "--num-prompts", "3", "--group", "2", "--max-new-tokens", "10", "--threads", "1"]


def test_fp32_engine_matches_and_writes_the_report(tmp_path: Path, capsys) -> None:
    assert main([*ARGS, "--precision", "fp32,fp8", "--out", str(tmp_path)]) == 1  # fp8: the engine_mismatch rule
    out = capsys.readouterr().out
    assert "| HFEngine fp32 |" in out and "| HFEngine fp8 |" in out and "- none:" not in out
    assert "- HFEngine fp8: the engine and the trainer disagree on fresh (lag-0) tokens" in out
    assert "- HFEngine fp32:" not in out
    data = json.loads((tmp_path / "mismatch.json").read_text())
    fp32, fp8 = data
    assert fp32["findings"] == [] and fp8["stats"]["tokens_lag_0"] == fp8["stats"]["tokens"]  # every token fresh
    assert fp32["stats"]["dlogp_max"] < 1e-4 and fp32["stats"]["ess"] == pytest.approx(1.0, abs=1e-6)
    assert fp32["greedy_agreement"] == 1.0
    assert fp8["stats"]["dlogp_mean"] > 10 * fp32["stats"]["dlogp_mean"]
    assert len(fp8["positions"]) == 10 and fp8["positions"][0]["first"] == 0 and fp8["positions"][9]["last"] == 9
    assert sum(p["tokens"] for p in fp8["positions"]) == fp8["stats"]["tokens"]
    assert (tmp_path / "mismatch.png").stat().st_size > 0 and (tmp_path / "mismatch.md").is_file()


class DriftingEngine(p3o.rollout.HFEngine):
    """An HFEngine whose recorded log-probs are off by ±0.05·t² nats at decode position t (an engine that drifts)."""

    def generate(self, prompt_ids, n, **kw):
        ro = super().generate(prompt_ids, n, **kw)
        t = torch.arange(ro.rollout_logp.shape[1], dtype=torch.float32)
        sign = torch.where(torch.arange(ro.rollout_logp.shape[0]) % 2 == 0, 1.0, -1.0)[:, None]
        ro.rollout_logp = ro.rollout_logp + sign * 0.05 * t**2
        return ro


def test_drifting_engine_fires_findings(monkeypatch, capsys) -> None:
    monkeypatch.setattr(p3o.rollout, "HFEngine", DriftingEngine)
    assert main([*ARGS, "--precision", "fp32", "--no-greedy", "--max-new-tokens", "10"]) == 1
    out = capsys.readouterr().out
    assert "mismatch grows with position" in out and "ESS below 0.9" in out


def test_bad_options() -> None:
    model, tok = load_policy("tiny-random")
    res = measure(model, tok, [[1, 2, 3]], engine="hf", precision="bf16", kv_cache_dtype="fp8", max_new_tokens=2)
    assert "needs --engine vllm" in res.error and res.label == "HFEngine bf16 + KV fp8"
    with pytest.raises(ConfigError, match="--prompts: no such file"):
        encode_prompts(tok, "/nonexistent/prompts.txt", 2)
    assert p3o_main(["mismatch", "--model", "tiny-random", "--group", "0"]) == 2


def test_prompts_file(tmp_path: Path) -> None:
    _, tok = load_policy("tiny-random")
    (tmp_path / "p.txt").write_text("1+1=\n\n2+2=\n3+3=\n", encoding="utf-8")
    (tmp_path / "p.jsonl").write_text('{"prompt": "1+1="}\n', encoding="utf-8")
    assert len(encode_prompts(tok, str(tmp_path / "p.txt"), 2)) == 2
    assert len(encode_prompts(tok, str(tmp_path / "p.jsonl"), 5)) == 1


def test_mismatch_judges_an_engine_as_the_training_monitor_does(tmp_path: Path, capsys) -> None:
    """Issue 40: `p3o mismatch --precision fp8` said "none" at a mean |Δlogp| of 4.79e-3 while training with that
    engine fired `engine_mismatch` (threshold 5e-4) at step 1. Both now judge with the same rules and thresholds: an
    fp8 engine fires engine_mismatch in a 2-step sync run and in `p3o mismatch`; an fp32 one fires in neither."""
    from p3o.config import load_config
    from p3o.metrics.rules import RULES
    from p3o.train.loop import run

    torch.set_num_threads(1)
    flagged = {}
    for precision in ("fp32", "fp8"):
        options = f"--steps 2 --loop.mode sync --rollout.precision {precision} --log.eval_every 0 --log.plot false "
        options += "--log.progress false --ckpt.every 0 --rollout.prompts_per_step 4 --rollout.max_new_tokens 10"
        where = ["--config", "quick", "--run_dir", str(tmp_path / precision), "--model.name", "tiny-random"]
        cfg = load_config([*where, *options.split()])
        rows = [json.loads(line) for line in (run(cfg) / "metrics.jsonl").read_text().splitlines()]
        train_fires = rows[0]["offpolicy/finding_engine_mismatch"] == 1.0  # at step 1, as in the issue
        assert train_fires == (rows[0]["offpolicy/dlogp_mean_lag_0"] >= RULES["fresh_dlogp"])
        code = main([*ARGS, "--precision", precision, "--no-greedy"])
        out = capsys.readouterr().out
        mismatch_fires = "the engine and the trainer disagree on fresh (lag-0) tokens" in out
        assert code == (1 if mismatch_fires else 0)
        assert train_fires == mismatch_fires, (precision, out)
        flagged[precision] = mismatch_fires
    assert flagged == {"fp32": False, "fp8": True}


def test_top_p_shows_the_kept_mass_and_the_ratio_with_and_without_replay(tmp_path: Path, capsys) -> None:
    argv = [*ARGS, "--precision", "fp32", "--top-p", "0.8", "--no-greedy", "true", "--out", str(tmp_path)]
    assert main(argv) == 0  # replayed: the fp32 engine matches the trainer, no engine_mismatch
    out = capsys.readouterr().out
    assert "Sampling-mask replay" in out and "top-p 0.8" in out
    (fp32,) = json.loads((tmp_path / "mismatch.json").read_text())
    x = fp32["replay"]
    assert x["recorded"] == 1.0 and x["outside"] is None  # the HF engine's own sets
    assert abs(x["ratio_mean_replay"] - 1) < 1e-5 and x["ratio_out_replay"] == 0.0
    assert x["ratio_mean_full"] == pytest.approx(x["kept_mass"], abs=1e-5) and x["kept_mass"] < 0.95
    assert main([*argv[:-2], "--replay-sampling-mask", "false"]) == 1  # the kept mass in every ratio: a finding
