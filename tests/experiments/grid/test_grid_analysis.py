"""Collapse detection on synthetic curves, smoothing, metrics.jsonl reading and seed aggregation."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from p3o.experiments.grid.analysis import (
    aggregate_seeds,
    batch_noise,
    detect_collapse,
    final_value,
    read_curves,
    smooth,
)


def rise(n: int = 60, top: float = 0.8) -> np.ndarray:
    return top * (1 - np.exp(-np.arange(n) / 10))


def test_collapse_detected_and_located() -> None:
    # Rises to ~0.8 by step 40, then falls to 0.1 and stays there.
    y = np.concatenate([rise(40), np.full(30, 0.1)])
    info = detect_collapse(y, drop=0.3, window=5)
    assert info.collapsed and info.dipped
    assert 35 <= info.peak_index <= 40
    assert info.drop > 0.8
    # The smoothed curve crosses (1 − 0.3)·peak a few points after the fall at step 40.
    assert info.onset_index is not None and 40 <= info.onset_index <= 44


def test_recovery_is_not_a_collapse() -> None:
    # peak ≈ 0.76 at step 29; the dip to 0.1 comes back to 0.7 > (1 − 0.3)·peak
    y = np.concatenate([rise(30), np.full(15, 0.1), np.full(25, 0.7)])
    info = detect_collapse(y, drop=0.3, window=5)
    assert info.dipped and not info.collapsed and info.onset_index is None


def test_monotone_rise_is_not_a_collapse() -> None:
    info = detect_collapse(rise(80), drop=0.3, window=5)
    assert not info.collapsed and not info.dipped
    assert info.peak_index == 79


def test_noise_around_a_plateau_is_not_a_collapse() -> None:
    rng = np.random.default_rng(0)
    # Single-point spikes down to 0 would trip a raw-curve detector; the smoothed curve stays above 0.7·peak.
    y = np.clip(0.6 + rng.normal(0, 0.08, 200), 0, 1)
    y[rng.choice(200, 10, replace=False)] = 0.0
    assert not detect_collapse(y, drop=0.3, window=8).collapsed


def test_late_fall_on_last_points_counts_once_smoothed_mean_is_below() -> None:
    y = np.concatenate([np.full(50, 0.6), np.full(8, 0.05)])
    assert detect_collapse(y, drop=0.3, window=5).collapsed
    # one bad last point is not enough
    y = np.concatenate([np.full(50, 0.6), [0.0]])
    assert not detect_collapse(y, drop=0.3, window=5).collapsed


def test_small_peak_and_empty_curves() -> None:
    y = np.concatenate([np.full(10, 0.03), np.zeros(20)])
    assert not detect_collapse(y, drop=0.3, window=3, min_peak=0.05).collapsed
    info = detect_collapse(np.full(5, np.nan))
    assert not info.collapsed and math.isnan(info.peak)


def test_smooth_trailing_mean_ignores_nan() -> None:
    y = np.array([1.0, 3.0, np.nan, 5.0, 7.0])
    # windows of 2: [1], [1,3], [3,nan], [nan,5], [5,7]
    np.testing.assert_allclose(smooth(y, 2), [1.0, 2.0, 3.0, 5.0, 6.0])
    np.testing.assert_allclose(smooth(y, 1), y)


def test_final_value() -> None:
    y = np.arange(10, dtype=float)
    assert final_value(y, 0.2) == pytest.approx(8.5)  # last 2 points
    assert final_value(y, 0.01) == 9.0
    assert math.isnan(final_value(np.array([])))


def test_read_metrics_tolerates_partial_lines_and_missing_keys(tmp_path: Path) -> None:
    p = tmp_path / "metrics.jsonl"
    lines = [
        json.dumps({"step": 1, "reward_mean": 0.1, "ess": 0.9}),
        json.dumps({"step": 2, "reward_mean": 0.2}),
        "",
        json.dumps({"step": 3, "reward_mean": 0.3, "ess": 0.7, "note": "text is ignored"}),
        json.dumps({"step": 2, "reward_mean": 0.25, "ess": 0.8}),  # a resumed run re-logs step 2
        '{"step": 4, "reward_me',  # killed mid-write
    ]
    p.write_text("\n".join(lines))
    c = read_curves(p)
    np.testing.assert_allclose(c["step"], [1, 2, 3])
    np.testing.assert_allclose(c["reward_mean"], [0.1, 0.25, 0.3])
    np.testing.assert_allclose(c["ess"], [0.9, 0.8, 0.7])
    assert "note" not in c
    assert read_curves(tmp_path / "missing.jsonl") == {}


def test_aggregate_seeds_aligns_on_steps() -> None:
    a = {"step": np.array([1.0, 2.0, 3.0]), "r": np.array([0.0, 1.0, 2.0])}
    b = {"step": np.array([2.0, 3.0, 4.0]), "r": np.array([3.0, 4.0, 5.0])}
    agg = aggregate_seeds([a, b, {"step": np.array([1.0])}], "r")
    assert agg is not None
    np.testing.assert_allclose(agg.steps, [1, 2, 3, 4])
    np.testing.assert_allclose(agg.mean, [0.0, 2.0, 3.0, 5.0])
    np.testing.assert_allclose(agg.std, [0.0, 1.0, 1.0, 0.0])
    np.testing.assert_array_equal(agg.n, [1, 2, 2, 1])
    np.testing.assert_allclose(agg.low, [0.0, 1.0, 2.0, 5.0])
    assert aggregate_seeds([a], "missing") is None


def test_fall_within_batch_noise_is_not_a_collapse_but_a_large_one_is() -> None:
    rng = np.random.default_rng(1)
    # A flat 0.5 level with per-step noise σ = 0.12 (a small batch): its smoothed maximum sits ~0.1 above the level,
    # so the level itself is > 20% below the peak; with drop = 0.15 only the noise test keeps it from counting.
    flat = np.clip(0.5 + rng.normal(0, 0.12, 30), 0, 1)
    info = detect_collapse(flat, drop=0.15, window=5, noise_z=3.0)
    assert info.drop > 0.15 and not info.collapsed
    assert detect_collapse(flat, drop=0.15, window=5, noise_z=0.0).collapsed  # the plain rule would flag it
    # The same noise on top of a real fall from 0.6 to 0.1 is a collapse.
    fall = np.concatenate([np.full(15, 0.6), np.full(15, 0.1)]) + rng.normal(0, 0.12, 30)
    assert detect_collapse(fall, drop=0.15, window=5, noise_z=3.0).collapsed


def test_batch_noise_estimates_sigma_and_ignores_a_jump() -> None:
    rng = np.random.default_rng(0)
    y = rng.normal(0, 0.1, 4000)
    assert batch_noise(y) == pytest.approx(0.1, rel=0.05)
    y[2000:] -= 5.0  # one jump barely moves the robust estimate
    assert batch_noise(y) == pytest.approx(0.1, rel=0.05)
    assert batch_noise(np.array([1.0, 2.0])) == 0.0


def test_read_curves_raises_on_a_bad_line_that_is_not_the_last(tmp_path: Path) -> None:
    from p3o.errors import DataError

    p = tmp_path / "metrics.jsonl"
    p.write_text('{"step": 1, "reward_mean": 0.1}\n{"step": 2, "rew\n{"step": 3, "reward_mean": 0.3}\n')
    with pytest.raises(DataError, match=r"metrics.jsonl:2: malformed"):
        read_curves(p)


def test_smooth_modes_trailing_for_statistics_centred_for_figures() -> None:
    y = np.array([0.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    np.testing.assert_allclose(smooth(y, 3), [0, 0, 0, 1 / 3, 2 / 3, 1])  # trailing (the default): past points only
    np.testing.assert_allclose(smooth(y, 3, mode="centred"), [0, 0, 1 / 3, 2 / 3, 1, 1])
    with pytest.raises(ValueError, match="unknown mode"):
        smooth(y, 3, mode="causal")  # type: ignore[arg-type]
