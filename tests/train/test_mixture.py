"""Task mixtures (`task.mixture`, issue 44 item 7): the weighted prompt pool, per-task verifiers and metrics, one-line
errors, and a run without a mixture left exactly as it was."""

from __future__ import annotations

import hashlib
import json
from collections import Counter

import pytest
import torch

from p3o.cli import main as cli_main
from p3o.config import load_config
from p3o.errors import ConfigError, P3OError
from p3o.tasks.mixture import TASK_KEY, MixtureReward, build_pool, task_labels, task_metrics
from p3o.train.sources import PromptStream
from p3o.train.wiring import build_rollout_side
from p3o.types import Rollouts


def _tiny_tokenizer():
    from p3o.models import load_policy

    return load_policy("tiny-random")[1]


# -- the pool and the stream: no model -------------------------------------------------------------------------------


def test_pool_slots_follow_the_weights_and_hold_every_problem():
    # L = ceil(max(10 / 0.25, 10 / 0.75)) = 40 slots: 10 of task 0 (each problem once), 30 of task 1 (each 3 times)
    pool = build_pool([10, 10], [1.0, 3.0])
    counts = Counter(k for k, _ in pool)
    assert (len(pool), counts[0], counts[1]) == (40, 10, 30)
    assert Counter(j for k, j in pool if k == 1) == {j: 3 for j in range(10)}
    # a task of weight 0 fills no slot (evaluated, never trained on); a sampled task keeps every problem
    pool = build_pool([50, 1000, 7, 30], [0.7, 0.2, 0.1, 0.0])
    assert {k for k, _ in pool} == {0, 1, 2}
    for k, n in enumerate([50, 1000, 7]):
        assert {j for t, j in pool if t == k} == set(range(n))


def test_the_stream_draws_each_task_with_its_weight_over_many_steps():
    weights = [0.7, 0.2, 0.1]
    pool = build_pool([50, 1000, 7], weights)
    slot_task = [k for k, _ in pool]
    stream = PromptStream(len(pool), 16, seed=3)
    for round_ in (0, 1):  # epoch walks, and the refill rounds of dynamic sampling
        drawn = Counter(slot_task[i] for b in range(300) for i in stream.global_indices(b, round_))
        total = sum(drawn.values())
        for k, w in enumerate(weights):
            # 4800 draws: a binomial's sd is ≤ 0.0072; round 0 is closer still (each epoch holds exact shares)
            assert abs(drawn[k] / total - w) < 0.03, (round_, k, drawn)
    # a pure function of (seed, step, round, rank): a fresh stream (a resumed run) draws the same batches
    again = PromptStream(len(pool), 16, seed=3)
    assert [again.global_indices(b) for b in (7, 0, 250)] == [stream.global_indices(b) for b in (7, 0, 250)]


def test_labels_are_short_and_unique():
    assert task_labels(["arithmetic", "calc", "data/own.jsonl", "gsm8k:/x/y.jsonl", "other/own.jsonl"]) == [
        "arithmetic",
        "calc",
        "own",
        "gsm8k",
        "own_2",
    ]


def _rows(n: int, tasks: list[int]) -> Rollouts:
    z = torch.zeros(n, 2, dtype=torch.long)
    return Rollouts(
        prompt_ids=z,
        prompt_mask=z.bool(),
        response_ids=z,
        mask=z.bool(),
        rollout_logp=z.float(),
        policy_version=z,
        group_ids=torch.arange(n),
        rewards=torch.zeros(n),
        truncated=torch.zeros(n, dtype=torch.bool),
        texts=[str(i) for i in range(n)],
        answers=[str(i) for i in range(n)],
        extras={TASK_KEY: torch.tensor(tasks, dtype=torch.float32)},
    )


def test_each_row_is_scored_by_its_own_tasks_verifier_and_counted_under_its_task():
    reward = MixtureReward([lambda r: torch.full((len(r),), 1.0), lambda r: torch.full((len(r),), 0.25)])
    r = _rows(4, [1, 0, 1, 0])
    scores = reward(r)
    assert scores.tolist() == [0.25, 1.0, 0.25, 1.0]
    info = task_metrics(["a", "b"], r.extras[TASK_KEY], scores, r.extras[TASK_KEY], scores)
    assert info == {
        "task/a/share": 0.5,
        "task/a/reward_mean": 1.0,
        "task/a/accuracy": 1.0,
        "task/b/share": 0.5,
        "task/b/reward_mean": 0.25,
        "task/b/accuracy": 0.0,
    }
    untagged = _rows(2, [0, 0])
    untagged.extras = {}
    with pytest.raises(P3OError, match=r"task\.mixture"):  # a row without its task has no verifier
        reward(untagged)


# -- bad input: one line naming task.mixture ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("arithmetic:-1,calc:1", "finite number >= 0"),
        ("arithmetic:0,calc:0", "sum to 0"),
        ("arithmetic:lots,calc:1", "is not a number"),
        ("arithmetic:1,arithmetic:2", "listed twice"),
        ("arithmetic:inf", "finite number"),
    ],
)
def test_bad_weights_are_one_line(value, says):
    with pytest.raises(ConfigError, match=says) as err:
        load_config(["--task.mixture", value])
    assert str(err.value).startswith("task.mixture: ") and "\n" not in str(err.value)


def _no_tokenizer():
    raise AssertionError("the tokenizer was loaded before the mixture was checked")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--task.mixture", "arithmetic:1,calcc:1"], "unknown task 'calcc' (did you mean 'calc'?)"),
        (["--task.mixture", "arithmetic:1,calc:1", "--agent.env", "calc"], "agent.env"),
        (["--task.mixture", "calc:1", "--task.name", "tests/data/own_task.jsonl"], "task.name"),
        (["--task.mixture", "calc:1", "--task.verifier", "math"], "task.verifier"),
        (["--task.mixture", "calc:1", "--task.eval_name", "tests/data/own_task.jsonl"], "task.eval_name"),
    ],
)
def test_unknown_tasks_and_conflicting_settings_are_one_line_before_any_model_loads(args, says):
    cfg = load_config(["--model.name", "tiny-random", "--task.n_train", "4", "--task.n_eval", "2", *args])
    with pytest.raises(ConfigError) as err:
        build_rollout_side(cfg, _no_tokenizer)
    message = str(err.value)
    assert message.startswith("task.mixture: ") and says in message and "\n" not in message, message


def test_the_command_line_exits_2_with_one_line(tmp_path, capsys):
    code = cli_main(["train", "--run_dir", str(tmp_path / "r"), "--task.mixture", "arithmetic:1,nosuch:2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "task.mixture: unknown task 'nosuch'" in err[0], err
    assert not (tmp_path / "r").exists()


# -- a run ---------------------------------------------------------------------------------------------------------


def test_a_two_step_mixture_run_logs_per_task_rewards_and_held_out_pass_at_1(tmp_path, monkeypatch):
    from matplotlib.axes import Axes

    from p3o.train.loop import run

    cfg = load_config(
        [
            "--config",
            "quick",
            "--run_dir",
            str(tmp_path / "run"),
            "--model.device",
            "cpu",
            "--loop.mode",
            "sync",
            "--rollout.prompts_per_step",
            "4",
            "--rollout.group_size",
            "2",
            "--task.mixture",
            "arithmetic:0.5,calc:0.5",
            "--task.n_train",
            "8",
            "--task.n_eval",
            "2",
            "--ckpt.every",
            "0",
        ]
    )
    titles: list[str] = []
    set_title = Axes.set_title
    monkeypatch.setattr(Axes, "set_title", lambda self, t, *a, **k: titles.append(t) or set_title(self, t, *a, **k))
    run_dir = run(cfg)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "reward_mean" in r]
    assert len(steps) == 2
    for r in steps:
        assert r["task/arithmetic/share"] + r["task/calc/share"] == pytest.approx(1.0)
        present = [name for name in ("arithmetic", "calc") if r[f"task/{name}/share"] > 0]
        assert present and all(f"task/{n}/reward_mean" in r and f"task/{n}/accuracy" in r for n in present)
    evals = [r for r in rows if "eval_accuracy" in r]
    assert evals, rows
    for r in evals:  # 2 held-out problems per task: the overall pass@1 is the mean of the two tasks'
        both = (r["task/arithmetic/eval_accuracy"] + r["task/calc/eval_accuracy"]) / 2
        assert r["eval_accuracy"] == pytest.approx(both)
    assert "Tasks" in titles and (run_dir / "plot.png").is_file()
    assert not any(k.startswith("episode/") for r in rows for k in r)  # the task index is no episode statistic


# -- no mixture: nothing changes -----------------------------------------------------------------------------------

# Recorded before task mixtures existed (commit dd27e98): the default task's prompts, answers and held-out set with
# the tiny tokenizer, and the stream's first batches over them.
GOLDEN_SIDE = "289cae5f8aad5968a2572ba589e38fbc3f8e4fb2d65ad3505d74dc7414132c02"
GOLDEN_STREAM = [
    [13, 24, 51, 38, 28, 23, 11, 63, 16, 35, 43, 22, 10, 41, 36, 25],
    [31, 50, 55, 47, 59, 1, 48, 45, 42, 12, 15, 6, 34, 60, 37, 17],
    [7, 30, 40, 26, 0, 27, 21, 9, 32, 46, 33, 2, 5, 4, 44, 57],
]
GOLDEN_REFILL = [1, 33, 23, 42, 32, 35, 39, 7, 8, 35, 6, 5, 14, 16, 59, 58]  # step 5, round 1


def test_without_a_mixture_the_prompts_and_the_stream_are_bit_identical():
    cfg = load_config(["--model.name", "tiny-random", "--task.n_train", "64", "--task.n_eval", "8"])
    assert cfg.task.mixture is None
    side = build_rollout_side(cfg, _tiny_tokenizer)
    assert side.mixture is None
    text = json.dumps([side.prompts, side.answers, side.eval_prompts, side.eval_answers])
    assert hashlib.sha256(text.encode()).hexdigest() == GOLDEN_SIDE
    stream = PromptStream(len(side.prompts), 16, cfg.seed)
    assert [stream.global_indices(b) for b in range(3)] == GOLDEN_STREAM
    assert stream.global_indices(5, 1) == GOLDEN_REFILL
