"""Advice that fits the run (issue 47): every suggestion of the monitor and the doctor is checked against the run's
own config (a table: finding × objective × loop mode → the advice printed), and the no-signal finding (groups with no
advantage) with its cause, live and in ``p3o doctor``; a run shorter than a finding's window is too early to judge."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from p3o.metrics.doctor import diagnose, main
from p3o.metrics.progress import finding_line
from p3o.metrics.rules import CAUSES, find, suggest

# (finding, cause) pairs the monitor can print, the objectives people train with, and every loop mode
FINDINGS = [
    ("low_ess", "staleness"),
    ("ratio_tails", "staleness"),
    ("low_ess", "engine"),
    ("engine_mismatch", "engine"),
    ("position_drift", "both"),
    ("prefix_decay", "staleness"),
]
OBJECTIVES = ["p3o", "minpro", "cispo", "grpo", "dapo", "gspo"]
MODES = {
    "sync": {"mode": "sync"},
    "async": {"mode": "async", "max_lag": 2},
    "stale": {"mode": "stale", "staleness": 4},
    "reuse": {"mode": "reuse", "reuse_epochs": 2},
}


def _config(objective: str, mode: str, **update: int) -> dict:
    return {
        "objective": {"name": objective},
        "loop": MODES[mode],
        "update": {"num_mini_batches": 1, "epochs": 1, **update},
        "rollout": {"precision": "fp32", "kv_cache_dtype": "auto", "temperature": 1.0, "group_size": 4},
        "train": {"temperature": 1.0, "mixed_precision": "no"},
    }


@pytest.mark.parametrize(("name", "cause"), FINDINGS)
@pytest.mark.parametrize("objective", OBJECTIVES)
@pytest.mark.parametrize("mode", list(MODES))
def test_no_advice_contradicts_the_runs_config(name: str, cause: str, objective: str, mode: str) -> None:
    """The table: what is printed for each finding × objective × loop mode never asks for what the run does."""
    config = _config(objective, mode)
    text = suggest(name, cause, "p3o", config=config)
    assert text, (name, cause, objective, mode)
    if objective in ("p3o", "minpro", "cispo"):  # already a soft objective: never "train with a soft objective"
        assert "soft objective" not in text
    else:
        assert ("soft objective" in text) == (cause in ("staleness", "both"))
        assert f"'{objective}'" in text  # it names the hard clip the run uses
    if objective == "p3o":
        assert "use P3O" not in text
    if mode != "async":
        assert "loop.max_lag" not in text
    if mode != "stale":
        assert "loop.staleness" not in text
    assert "update.num_mini_batches" not in text and "update.epochs" not in text  # one update per batch already
    if cause in ("engine", "both"):  # an fp32 engine at the trainer's temperature: nothing of its settings to change
        assert "rollout.precision fp32" not in text and "rollout.kv_cache_dtype auto" not in text
        assert "already matches" in text
    if cause == "staleness" and mode == "sync":
        assert "least lag" in text  # nothing left to lower: said, not a setting the run already has
    line = finding_line("p3o", 3, name, CAUSES[cause], config)  # the live line says the same
    assert line.endswith(text)


@pytest.mark.parametrize(
    ("config", "present", "absent"),
    [
        (
            _config("p3o", "async", num_mini_batches=4),
            ["loop.max_lag (this run: 2)", "num_mini_batches (this run: 4)"],
            [],
        ),
        (_config("grpo", "stale"), ["loop.staleness (this run: 4)", "hard clip 'grpo'"], ["loop.max_lag"]),
        (_config("p3o", "sync", epochs=2), ["update.epochs (this run: 2)"], ["loop.", "soft objective"]),
        (None, ["loop.max_lag", "soft objective"], []),  # no config: every setting, the generic objective advice
    ],
)
def test_staleness_advice_names_what_the_run_can_lower(config, present: list[str], absent: list[str]) -> None:
    text = suggest("low_ess", "staleness", "p3o", config=config)
    assert all(p in text for p in present), text
    assert not any(a in text for a in absent), text


def test_engine_advice_names_only_the_settings_that_differ() -> None:
    config = _config("grpo", "sync")
    config["rollout"].update(precision="bf16", temperature=1.2)
    text = suggest("engine_mismatch", "engine", "p3o", config=config)
    assert "rollout.precision fp32 (this run: bf16)" in text and "(this run: 1.0 vs 1.2)" in text
    assert "kv_cache_dtype" not in text and "use P3O or a wide clip" in text


# --------------------------------------------------------------------------------------------------------- no signal


def _rows(n: int, zero: int, groups: int = 8, reward: float = 0.0, start: int = 1) -> list[dict]:
    """p3o metrics rows: `zero` of `groups` groups with all-zero advantages, mean reward `reward`."""
    return [
        {"step": s, "offpolicy/ess": 1.0, "zero_adv_groups": zero, "num_groups": groups, "reward_mean": reward}
        for s in range(start, start + n)
    ]


@pytest.mark.parametrize(("reward", "cause"), [(0.0, "unsolved"), (1.0, "solved"), (0.5, "tied")])
def test_no_signal_fires_after_three_steps_with_its_cause(reward: float, cause: str) -> None:
    rows = [{k.removeprefix("offpolicy/"): v for k, v in r.items()} for r in _rows(3, 8, reward=reward)]
    assert find(rows[:2]) == []  # its own window: 3 steps
    (f,) = find(rows, source="p3o", config={"rollout": {"group_size": 4}})
    assert f.name == "no_signal" and f.cause == cause and "100% of groups" in f.message
    if cause == "unsolved":
        assert "easier task or a stronger base model" in f.suggestion and "rollout.group_size" in f.suggestion
        assert "(this run: 4 samples per prompt)" in f.suggestion
    assert find([{**r, "zero_adv_groups": 6} for r in rows]) == []  # 75 % < 90 %: signal enough


def test_trl_rows_carry_the_signal() -> None:
    rows = [{"step": s, "frac_reward_zero_std": 1.0, "reward": 0.0} for s in range(3)]
    (f,) = find(rows, source="trl")
    assert f.cause == "unsolved" and "GRPOConfig.num_generations" in f.suggestion


def _run_dir(tmp_path: Path, rows: list[dict], objective: str = "p3o") -> Path:
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    cfg = f"objective:\n  name: {objective}\nloop:\n  mode: async\n  max_lag: 2\nrollout:\n  group_size: 4\n"
    (run / "config.yaml").write_text(cfg, encoding="utf-8")
    return run


def test_doctor_names_no_signal_on_a_three_step_run(tmp_path: Path, capsys) -> None:
    """The own-data run of issue 47: 3 steps, 23 of 24 groups with zero advantage, reward 0: exit 1 naming it."""
    rows = _rows(3, 8)
    rows[1]["zero_adv_groups"] = 7
    run = _run_dir(tmp_path, rows)
    assert main([str(run), "--no-plot"]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "unhealthy: the model never solves the task (no_signal)"
    assert "96% of groups" in out and "p3o docs tasks" in out


def test_a_run_that_learns_is_not_flagged(tmp_path: Path) -> None:
    """Reward 0 at first, then the groups carry advantages: the last windows have signal, most windows too."""
    rows = _rows(3, 8) + _rows(9, 3, reward=0.4, start=4)
    assert [f.name for f, _, _ in diagnose(_run_dir(tmp_path, rows)).findings] == []
    stuck = _rows(3, 3, reward=0.4) + _rows(9, 8, start=4)  # the reverse: signal lost for good
    (f, span, windows) = diagnose(_run_dir(tmp_path, stuck)).findings[0]
    assert f.name == "no_signal" and span == "4–6" and windows == 7


def test_a_short_run_is_too_early_to_judge(tmp_path: Path, capsys) -> None:
    """Issue 47: a 3-step P3O run with heavy ratio tails printed 'unhealthy' and 'use a soft objective'; now the window
    rules wait for their window and their early signs are listed, fitted to the run (no soft-objective advice)."""
    rows = _rows(3, 2, reward=0.5)
    for r in rows:
        r.update({"offpolicy/ratio_frac_above_2": 0.05, "offpolicy/lag_mean": 1.0, "offpolicy/tokens_stale": 50.0})
        r.update(
            {"offpolicy/tokens_lag_0": 50.0, "offpolicy/ratio_tails_lag_0": 0.0, "offpolicy/ratio_tails_stale": 0.1}
        )
    run = _run_dir(tmp_path, rows)
    assert main([str(run), "--no-plot"]) == 0
    out = capsys.readouterr().out
    assert (
        out.splitlines()[0] == "too early to judge: 3 of the 10 steps the window rules need; early signs: ratio_tails"
    )
    assert "soft objective" not in out and "lower loop.max_lag (this run: 2)" in out
    assert main([str(run), "--no-plot", "--window", "3"]) == 1  # judged on a window of its length


def test_trl_state_without_per_step_logs_names_logging_steps(tmp_path: Path, capsys) -> None:
    state = {"log_history": [{"train_runtime": 3.0, "train_loss": 0.0, "step": 3}]}
    (tmp_path / "trainer_state.json").write_text(json.dumps(state), encoding="utf-8")
    assert main([str(tmp_path), "--no-plot"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "logging_steps=1" in err


def _fresh_mismatch_rows(n: int = 13) -> list[dict]:
    """Issue 51 item 12's run: lag-0 tokens with a mean |Δlogp| of ~0.013 nats, flat (no sync trend), some stale."""
    rows = []
    for s in range(1, n + 1):
        d = 0.0132 + 0.004 * ((-1) ** s)
        rows.append(
            {
                "step": s,
                "offpolicy/ess": 0.997,
                "offpolicy/lag_mean": 0.7,
                "offpolicy/tokens_lag_0": 300.0,
                "offpolicy/dlogp_mean_lag_0": d,
                "offpolicy/tokens_stale": 200.0,
                "offpolicy/ess_lag_0": 0.999,
                "offpolicy/ess_stale": 0.995,
            }
        )
    return rows


def test_an_inflight_run_is_not_called_an_engine_fault(tmp_path: Path, capsys) -> None:
    """Issue 51 item 12: the same fresh-token mismatch is 'engine mismatch' on a run without in-flight updates and
    'in-flight weight updates' (advice: measure the engine without them) on a run with rollout.inflight_updates."""
    rows = _fresh_mismatch_rows()
    run = _run_dir(tmp_path, rows)
    assert main([str(run), "--no-plot"]) == 1
    assert capsys.readouterr().out.splitlines()[0] == "unhealthy: engine mismatch (engine_mismatch)"
    cfg = (run / "config.yaml").read_text() + "  inflight_updates: true\n  workers: 1\n"  # under rollout:
    (run / "config.yaml").write_text(cfg, encoding="utf-8")
    assert main([str(run), "--no-plot"]) == 1
    out = capsys.readouterr().out
    first = out.splitlines()[0]
    assert first.startswith("unhealthy: in-flight weight updates") and "engine mismatch" not in first
    assert "rollout.inflight_updates false" in out and "already matches the trainer" not in out
    plain = [{k.removeprefix("offpolicy/"): v for k, v in r.items()} for r in rows]
    (f,) = find(plain, config={"rollout": {"inflight_updates": True}}, only=("engine_mismatch",))
    assert f.cause == "inflight" and CAUSES["inflight"] == 9


def test_the_objective_advice_asks_the_registry_what_the_objective_does() -> None:
    """The engine / staleness advice reads how an objective bounds its weights from the objective registry, not from
    its name: P3O with its ESS cap gets no objective advice, P3O run with objective.cap clip is told what a clip is."""
    from p3o.config.objective import objective_keys
    from p3o.metrics.advice import objective_bounds

    assert objective_keys(fresh=True) == objective_keys()  # the snapshot it reads is the registry's
    assert [objective_bounds(n) for n in ("p3o", "grpo", "dapo", "gspo", "minpro", "cispo", "nosuch")] == [
        "ess", "clip", "clip", "clip", "soft", "soft", None,
    ]  # fmt: skip
    ess = {"objective": {"name": "p3o"}, "rollout": {"precision": "fp32"}}
    clip = {"objective": {"name": "p3o", "cap": "clip"}, "rollout": {"precision": "fp32"}}
    assert "use P3O" not in suggest("engine_mismatch", "engine", "p3o", config=ess)
    assert "this run uses 'p3o'" in suggest("engine_mismatch", "engine", "p3o", config=clip)


def test_the_live_monitor_of_an_inflight_run_names_the_inflight_updates() -> None:
    """The trainer's monitor gets the run's config (train/loop.py): its live cause is 'inflight', as the doctor's."""
    from p3o.metrics.monitor import OffPolicyMonitor

    plain = [{k.removeprefix("offpolicy/"): v for k, v in r.items()} for r in _fresh_mismatch_rows()]
    causes = {}
    for inflight in (False, True):
        mon = OffPolicyMonitor(max_len=8, group=False, warn=False, config={"rollout": {"inflight_updates": inflight}})
        mon.window.extend(plain)
        causes[inflight] = {f.name: f.cause for f in mon._find()}
    assert causes == {False: {"engine_mismatch": "engine"}, True: {"engine_mismatch": "inflight"}}
