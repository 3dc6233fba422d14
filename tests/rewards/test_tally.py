"""Verifier timeouts and worker restarts are counted, warned about once above 1 %, and reach metrics.jsonl."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_lm import make_tiny_lm

from p3o.rewards import Tally, make_reward_fn, math_reward, safe_for_sympy, score, tally
from p3o.rewards.sandbox import Worker
from p3o.rewards.tally import record
from p3o.rewards.verifiers import _worker
from p3o.types import Rollouts

HANGS = """
import time


def slow_on_hang(completion, answer):
    if "hang" in completion:
        time.sleep(60)
    return float(completion.strip().endswith(answer))
"""


@pytest.fixture
def slow_verifier(tmp_path: Path) -> str:
    path = tmp_path / "slow_rewards.py"
    path.write_text(HANGS)
    return f"{path}:slow_on_hang"


def test_tallies_nest_and_stay_in_their_thread() -> None:
    record("timeouts")  # no tally open: nothing to count, no error
    with tally() as outer:
        record("verifications", 3)
        with tally() as inner:
            record("timeouts")
            other = threading.Thread(target=record, args=("timeouts", 5))  # another thread: not ours
            other.start()
            other.join()
        record("restarts")
    assert (outer.verifications, outer.timeouts, outer.restarts) == (3, 1, 1)
    assert (inner.verifications, inner.timeouts, inner.restarts) == (0, 1, 0)
    assert outer.metrics() == {"reward/timeouts": 1.0, "reward/restarts": 1.0, "reward/errors": 0.0}
    total = Tally()
    total.add(outer)
    total.add(inner)
    assert total.timeouts == 2 and total.timeout_rate == pytest.approx(2 / 3)


def test_worker_counts_a_timeout_and_the_restart() -> None:
    w = Worker()
    try:
        assert w.call({"op": "ping"}, timeout_s=60.0) is True  # the one-time start-up is not a call's
        with tally() as t:
            assert w.call({"op": "sleep", "s": 30}, timeout_s=0.2) is None
            assert w.call({"op": "bogus"}, timeout_s=30.0) is None  # an error reply: the worker keeps serving
        assert (t.timeouts, t.restarts, t.errors) == (1, 1, 1)
        assert (w.timeouts, w.restarts) == (1, 1)
    finally:
        w.close()


def test_a_pathological_math_answer_times_out_and_is_counted() -> None:
    """`\\binom{10^{100}}{10^{50}}` passes the cost filter (3-digit exponents) and no machine can evaluate it: the
    worker is killed at the limit, and the timeout and the restart are counted."""
    pathological = "\\binom{10^{100}}{10^{50}}"
    assert safe_for_sympy(pathological)
    _worker().call({"op": "ping"}, timeout_s=60.0)
    with tally() as t:
        assert score([f"so \\boxed{{{pathological}}}"], ["7"], "math", timeout_s=0.3) == [0.0]
    assert (t.verifications, t.timeouts, t.restarts) == (1, 1, 1)
    _worker().call({"op": "ping"}, timeout_s=60.0)  # let the spare come up before the next test scores
    assert math_reward("\\boxed{3!}", "6", timeout_s=30.0) == 1.0


def _rollouts(texts: list[str], answers: list[str]) -> Rollouts:
    n = len(texts)
    return Rollouts(
        prompt_ids=torch.ones(n, 2, dtype=torch.long),
        prompt_mask=torch.ones(n, 2, dtype=torch.bool),
        response_ids=torch.ones(n, 2, dtype=torch.long),
        mask=torch.ones(n, 2, dtype=torch.bool),
        rollout_logp=torch.zeros(n, 2),
        policy_version=torch.zeros(n, 2, dtype=torch.long),
        group_ids=torch.zeros(n, dtype=torch.long),
        rewards=torch.zeros(n),
        truncated=torch.zeros(n, dtype=torch.bool),
        texts=texts,
        answers=answers,
    )


def test_reward_fn_counts_and_warns_once_above_one_percent(slow_verifier: str, capsys: Any) -> None:
    reward_fn = make_reward_fn(slow_verifier, timeout_s=0.5)

    def hang_last(k: int, i: int) -> Rollouts:  # k answers that score 1, then one that hangs
        return _rollouts([f"answer {i}"] * k + [f"hang {i}"], [str(i)] * (k + 1))

    def warm_spare() -> None:  # the killed worker's spare up before the next batch (not a counted verification)
        assert reward_fn.verifier("warm up", "up", timeout_s=60.0) == 1.0

    assert reward_fn(_rollouts([f"answer {i}" for i in range(100)], [str(i) for i in range(100)])).sum() == 100
    assert "verifications" not in capsys.readouterr().err
    assert reward_fn(hang_last(2, 1)).tolist() == [1.0, 1.0, 0.0]  # 1 timeout in 103 verifications: < 1 %
    warm_spare()
    assert (reward_fn.tally.timeouts, reward_fn.tally.restarts, reward_fn.tally.verifications) == (1, 1, 103)
    assert "verifications" not in capsys.readouterr().err  # (the custom verifier's own first-timeout line aside)
    reward_fn(hang_last(1, 2))  # 2 in 105: above 1 %
    warm_spare()
    err = capsys.readouterr().err
    assert err.count("verifications") == 1 and "2 of 105 verifications (1.9%)" in err, err
    reward_fn(hang_last(0, 3))
    assert "verifications" not in capsys.readouterr().err  # once per run
    assert (reward_fn.tally.timeouts, reward_fn.tally.restarts) == (3, 3)
    reward_fn.verifier.close()


class _TextEngine:
    """An HFEngine whose completions read as `texts` (the fakes have no tokenizer): row i says texts[i % len]."""

    def __init__(self, engine: Any, texts: list[str]) -> None:
        self.engine, self.texts = engine, texts

    def generate(self, prompts: list[list[int]], group_size: int, **kw: Any) -> Rollouts:
        r = self.engine.generate(prompts, group_size, **kw)
        r.texts = [self.texts[i % len(self.texts)] for i in range(len(r))]
        return r

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)


def test_timeouts_reach_metrics_jsonl(tmp_path: Path, slow_verifier: str) -> None:
    from p3o.config import TrainConfig, apply_overrides
    from p3o.rollout import HFEngine
    from p3o.train.loop import run
    from p3o.train.wiring import Components

    texts = ["so 1", "so 1", "so 2", "so 1", "so 1", "so 2", "so 1", "hang"]  # the last of each step's 8 hangs
    reward_fn = make_reward_fn(slow_verifier, timeout_s=0.5)

    def make_engine(model: torch.nn.Module) -> _TextEngine:
        engine = HFEngine(model, None, max_new_tokens=4, temperature=1.0, seed=0, pad_token_id=0)
        return _TextEngine(engine, texts)

    g = torch.Generator().manual_seed(0)
    comps = Components(
        policy=make_tiny_lm(seed=0),
        tokenizer=None,
        prompts=[torch.randint(3, 64, (4,), generator=g).tolist() for _ in range(4)],
        answers=["1"] * 4,
        reward_fn=reward_fn,
        make_engine=make_engine,
    )
    cfg = apply_overrides(
        TrainConfig(),
        {
            "run_dir": str(tmp_path / "run"),
            "steps": 2,
            "rollout.prompts_per_step": 2,
            "rollout.group_size": 4,
            "rollout.max_new_tokens": 4,
            "update.micro_batch_size": 4,
            "loop.mode": "sync",
            "ckpt.every": 0,
            "log.progress": False,
            "log.tensorboard": False,
            "log.wandb": False,
            "log.plot": False,
            "log.eval_every": 0,
        },
    )
    run_dir = run(cfg, components=comps)
    rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "reward_mean" in r]
    assert len(rows) == 2
    # each step's hang, and any call that found the killed worker's spare not up yet (a loaded machine)
    assert all(r["reward/timeouts"] >= 1.0 and r["reward/restarts"] >= 1.0 and r["reward/errors"] == 0 for r in rows)
    assert sum(r["reward/timeouts"] for r in rows) == reward_fn.tally.timeouts  # no evaluation in this run
    assert sum(r["reward/restarts"] for r in rows) == reward_fn.tally.restarts
    assert reward_fn.tally.verifications == 16
    reward_fn.verifier.close()
