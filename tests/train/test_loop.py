"""The training loop on tiny fakes: metrics, stale delay, bounded async lag, crashes, dynamic sampling, reuse."""

from __future__ import annotations

import json
import random
import time

import pytest
import torch
import yaml
from train_fakes import fake_components, fake_config

from p3o.objectives.registry import Objective
from p3o.train.checkpoint import latest_checkpoint, load_checkpoint
from p3o.train.loop import run
from p3o.train.sources import GeneratorCrashed
from p3o.train.step import UpdateStep

CONTRACT_KEYS = [
    "step", "reward_mean", "accuracy", "ess", "kl_weight", "capped_frac", "band_frac", "ratio_max", "approx_kl",
    "entropy", "response_len_mean", "truncated_frac", "lag_min", "lag_mean", "lag_max", "zero_adv_groups",
    "tokens_per_s", "time_gen_s", "time_train_s", "time_s",
]  # fmt: skip


def _metrics(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_run_writes_metrics_config_checkpoints_and_final(tmp_path):
    cfg = fake_config(tmp_path / "r", steps=5, **{"ckpt.every": 2, "log.plot": True, "log.eval_every": 2})
    comps = fake_components()
    comps.eval_prompts, comps.eval_answers = comps.prompts[:5], comps.answers[:5]
    run_dir = run(cfg, components=comps)
    rows = _metrics(run_dir)
    # the starting policy (a step-0 row of its own, before any update), every 2 steps, and at the end
    assert [r["step"] for r in rows if "eval_accuracy" in r] == [0, 2, 4, 5]
    assert set(rows[0]) == {"step", "eval_accuracy", "eval_score", "eval_problems", "time_eval_s"}
    rows = rows[1:]
    assert 0.0 <= rows[-1]["eval_accuracy"] <= 1.0
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    for key in CONTRACT_KEYS:
        assert all(key in r for r in rows), key
    assert all(r["lag_max"] == 0 for r in rows)  # sync: on-policy
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["steps"] == 5 and saved["objective"]["name"] == "p3o"
    assert (run_dir / "final" / "model.safetensors").is_file() or any((run_dir / "final").glob("*.safetensors"))
    assert (run_dir / "plot.png").stat().st_size > 0
    ckpt = latest_checkpoint(run_dir)
    assert ckpt is not None and ckpt.name == "step_000005"  # every 2 steps and at the end; keep_last 2
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("step_*")) == ["step_000004", "step_000005"]
    state = load_checkpoint(ckpt, restore_rng=False)
    assert state["step"] == 5 and set(state["loop_state"]) == {"rank_source", "monitor"}  # all resume reads
    # resuming a finished run has nothing to redo
    before = (run_dir / "metrics.jsonl").read_text()
    run(fake_config(tmp_path / "r", steps=5, **{"ckpt.every": 2, "ckpt.resume": True}), components=fake_components())
    assert (run_dir / "metrics.jsonl").read_text() == before


def test_stale_lag_is_exactly_n(tmp_path):
    cfg = fake_config(tmp_path / "stale", steps=6, **{"loop.mode": "stale", "loop.staleness": 2})
    rows = _metrics(run(cfg, components=fake_components()))
    # trained at step s (0-based) = generated from version max(0, s - 2): the first two steps drain the prefill
    assert [(r["lag_min"], r["lag_max"]) for r in rows] == [(0, 0), (1, 1), (2, 2), (2, 2), (2, 2), (2, 2)]


def test_reuse_trains_one_batch_for_several_steps(tmp_path):
    cfg = fake_config(tmp_path / "reuse", steps=5, **{"loop.mode": "reuse", "loop.reuse_epochs": 2})
    rows = _metrics(run(cfg, components=fake_components()))
    assert [r["lag_max"] for r in rows] == [0, 1, 0, 1, 0]


def test_async_random_delays_never_exceed_max_lag(tmp_path, monkeypatch):
    max_lag = 2
    comps = fake_components()
    make_engine = comps.make_engine
    rng = random.Random(0)

    def slow_engine(model):
        engine = make_engine(model)
        generate = engine.generate

        def jittery(*a, **kw):
            time.sleep(rng.uniform(0.0, 0.05))
            return generate(*a, **kw)

        engine.generate = jittery
        return engine

    comps.make_engine = slow_engine
    consumed = []
    real_run = UpdateStep.run

    def checking_run(self, batch, version=0):
        version = len(consumed)  # the trainer's version = updates done so far
        tokens = batch.policy_version[batch.mask]
        assert tokens.numel() > 0 and bool((tokens >= version - max_lag).all()), (version, tokens.min())
        consumed.append(int(version - tokens.min()))
        time.sleep(rng.uniform(0.0, 0.1))  # a slow, jittery trainer lets the generator run ahead
        return real_run(self, batch, version)

    monkeypatch.setattr(UpdateStep, "run", checking_run)
    cfg = fake_config(tmp_path / "async", steps=10, **{"loop.mode": "async", "loop.max_lag": max_lag})
    rows = _metrics(run(cfg, components=comps))
    assert len(consumed) == 10 and max(consumed) <= max_lag
    assert max(consumed) > 0  # generation really ran ahead of training
    assert all(0 <= r["lag_min"] <= r["lag_max"] <= max_lag for r in rows)
    assert all(r["dropped_rows"] == 0 for r in rows)


def test_async_generator_crash_surfaces_in_trainer(tmp_path):
    comps = fake_components()
    make_engine = comps.make_engine

    def breaking_engine(model):
        engine = make_engine(model)
        calls = {"n": 0}
        generate = engine.generate

        def generate_then_break(*a, **kw):
            calls["n"] += 1
            if calls["n"] == 3:
                raise RuntimeError("rollout engine lost its GPU")
            return generate(*a, **kw)

        engine.generate = generate_then_break
        return engine

    comps.make_engine = breaking_engine
    cfg = fake_config(tmp_path / "crash", steps=20, **{"loop.mode": "async", "loop.max_lag": 1})
    with pytest.raises(GeneratorCrashed, match="lost its GPU"):  # raised, not hung: the run stops at once
        run(cfg, components=comps)
    assert not (tmp_path / "crash" / "final").exists()


def test_dynamic_sampling_keeps_only_informative_groups(tmp_path, monkeypatch):
    comps = fake_components()

    def reward(r):  # prompts whose first token is odd (4 of 12): every completion scores 1 (zero advantage)
        odd_prompt = r.prompt_ids[torch.arange(len(r)), r.prompt_mask.long().argmax(-1)] % 2 == 1
        tok = ((r.response_ids % 2 == 0) & r.mask).sum(-1).float() / r.mask.sum(-1).clamp(min=1)
        return torch.where(odd_prompt, torch.ones(len(r)), tok)

    comps.reward_fn = reward
    seen = []
    real_run = UpdateStep.run

    def recording_run(self, batch, version=0):
        seen.append(batch)
        return real_run(self, batch, version)

    monkeypatch.setattr(UpdateStep, "run", recording_run)
    cfg = fake_config(
        tmp_path / "dyn", steps=4, **{"loop.dynamic_sampling": True, "loop.dynamic_sampling_max_tries": 4}
    )
    rows = _metrics(run(cfg, components=comps))
    for batch in seen:
        assert len(batch) <= 2 * 4  # never more than prompts_per_step × group_size
        for gid in batch.group_ids.unique():
            r = batch.rewards[batch.group_ids == gid]
            assert (r != r[0]).any(), "a zero-variance group was trained on"
    assert all(r["zero_adv_groups"] == 0 for r in rows)
    assert all(r["generated"] >= 8 for r in rows)
    assert any(r["gen_rounds"] > 1 for r in rows)  # some groups were dropped and refilled


def test_overlong_penalty_lowers_reward_of_long_responses(tmp_path):
    cfg = fake_config(
        tmp_path / "ol",
        steps=2,
        **{"loop.overlong_penalty": True, "loop.overlong_buffer": 4, "loop.overlong_factor": 1.0},
    )
    rows = _metrics(run(cfg, components=fake_components()))
    # responses of length 6 = max_new_tokens sit at the end of the 4-token buffer: penalty (2 - 6)/4 = -1
    assert all(r["truncated_frac"] > 0 for r in rows)
    assert all(r["reward_mean"] < r["score_mean"] for r in rows)


def test_reference_kl_and_epochs_run(tmp_path):
    cfg = fake_config(
        tmp_path / "ref",
        steps=2,
        **{"train.ref_model": True, "objective.ref_kl_coef": 0.05, "update.epochs": 2, "update.num_mini_batches": 2},
    )
    rows = _metrics(run(cfg, components=fake_components()))
    assert all(r["optimizer_steps"] == 4 for r in rows) and "ref_kl" in rows[-1]


def test_objective_hyper_parameters_are_resolved_once_per_run(tmp_path, monkeypatch):
    # resolving (defaults, spellings, checks) happens at setup, not per step or per micro-batch: the count of
    # resolutions does not grow with the number of steps
    real = Objective.resolve
    counts = []
    for steps in (1, 4):
        calls = {"n": 0}

        def counting(self, *a, _calls=calls, **kw):
            _calls["n"] += 1
            return real(self, *a, **kw)

        monkeypatch.setattr(Objective, "resolve", counting)
        cfg = fake_config(tmp_path / f"steps{steps}", steps=steps, **{"update.micro_batch_size": 2})
        run(cfg, components=fake_components())
        counts.append(calls["n"])
    assert counts[0] == counts[1] and counts[0] >= 1
