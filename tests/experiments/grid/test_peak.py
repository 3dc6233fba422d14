"""An unbiased peak (issue 46, item 4): the best checkpoint is chosen on the in-loop (validation) evaluations and
scored on disjoint test problems; the selection bias of a peak chosen and scored on the same evaluations is computed
and stated beside the old studies' peak verdicts."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from p3o.errors import ConfigError
from p3o.experiments.grid import peak
from p3o.experiments.stats.bias import peak_bias
from p3o.experiments.stats.check import check_file

ROOT = Path(__file__).resolve().parents[3]


def test_expected_best_of_k_is_the_mean_maximum_of_k_noisy_evaluations() -> None:
    assert peak.expected_max_normal(1) == 0.0
    assert peak.expected_max_normal(2) == pytest.approx(1 / np.sqrt(np.pi), abs=1e-9)
    assert peak.expected_max_normal(5) == pytest.approx(1.16296, abs=1e-4)
    # the number: 512 problems at 0.535, best of 5 -> +0.026
    assert peak.expected_best_of_k(0.535, 512, 5) == pytest.approx(0.0256, abs=2e-4)
    rng = np.random.default_rng(0)  # Monte Carlo: binomial pass@1 on 512 problems, no learning
    draws = rng.binomial(512, 0.535, size=(40_000, 5)) / 512
    assert draws.max(axis=1).mean() - 0.535 == pytest.approx(peak.expected_best_of_k(0.535, 512, 5), abs=1.5e-3)


def test_the_step_is_chosen_after_step_0_the_earliest_of_equal_ones() -> None:
    assert peak.choose_step([(0, 0.9), (10, 0.4), (20, 0.5), (30, 0.5)]) == (20, 0.5)
    assert peak.choose_step([(0, 0.9)]) is None


def test_a_study_scoring_the_unbiased_peak_must_keep_every_evaluated_checkpoint() -> None:
    base = {"steps": 50, "log.eval_every": 10}
    peak.check_peak_study(base, ["eval_peak"])  # the biased metric needs nothing (its reports state the bias)
    with pytest.raises(ConfigError, match=r"ckpt\.every"):
        peak.check_peak_study(base, ["eval_peak_test"])
    peak.check_peak_study({**base, "ckpt.every": 10, "ckpt.keep_last": 5}, ["eval_peak_test"])


def test_the_chosen_checkpoint_is_scored_on_test_problems_disjoint_from_validation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for step in (10, 20, 30):
        peak.checkpoint_of(tmp_path, step).mkdir(parents=True)
    problem = SimpleNamespace
    validation = [problem(question=f"v{i}") for i in range(4)]
    monkeypatch.setattr("p3o.train.wiring._task_problems", lambda cfg: ([], validation))
    drawn = [problem(question=q) for q in ("v1", "t1", "v2", "t2", "t3", "t4")]
    monkeypatch.setattr("p3o.tasks.load_eval_problems", lambda task, seed, n: drawn)
    scored = {}

    def evaluate_on(model: str, problems: list) -> float:
        scored["model"], scored["questions"] = model, [p.question for p in problems]
        return 0.61

    cfg = SimpleNamespace(seed=7, task=None)
    record = peak.score_peak(tmp_path, cfg, [(0, 0.9), (10, 0.5), (20, 0.7), (30, 0.6)], evaluate_on, 3)
    assert record["step"] == 20 and record["validation"] == 0.7 and record["test"] == 0.61
    assert scored["model"].endswith("checkpoints/step_000020/policy")
    assert scored["questions"] == ["t1", "t2", "t3"]  # no validation question
    assert peak.read_peak(tmp_path) == {"eval_peak_test": 0.61, "eval_peak_val": 0.7, "eval_peak_test_step": 20.0}
    assert json.loads((tmp_path / peak.PEAK_FILE).read_text())["test_seed"] == 7 + peak.TEST_SEED_OFFSET


def test_minpro_stale5_and_6_peak_verdicts_are_marked_selection_biased() -> None:
    for name in ("minpro-stale5", "minpro-stale6"):
        path = ROOT / "docs" / "results" / f"{name}.verdicts.json"
        problems, notes = check_file(path)
        assert problems == []
        note = next(n for n in notes if "selection-biased" in n)
        assert "best of 5 in-loop evaluations on 512 problems" in note and "+0.026 above step 0" in note
    assert peak_bias({"runs": []}, {"selection_bias": {"n_problems": 512}}) is None
    claims = (ROOT / "docs" / "paper-claims.md").read_text()
    assert "peak selection-biased: +0.026 expected under no learning (best of 5)" in claims
