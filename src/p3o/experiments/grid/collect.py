"""A finished (or partly finished) grid read back into numbers: each run's curves, config, evaluation and summary
metrics (final / peak reward, collapse, ESS statistics, pass@1), by (regime, objective, seed)."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from p3o.errors import DataError
from p3o.experiments.grid.analysis import (
    CollapseInfo,
    Curves,
    detect_collapse,
    final_value,
    mean_std,
    read_curves,
    smooth,
)
from p3o.experiments.grid.peak import read_peak
from p3o.experiments.grid.runner import is_finished
from p3o.experiments.grid.spec import Experiment, RunSpec, expand, flatten

REWARD_KEY = "reward_mean"
METRIC_LABELS = {
    "final_reward": "final reward",
    "peak_reward": "peak reward",
    "pass@1": "final pass@1",
    "final_accuracy": "final accuracy",
    "collapsed": "collapse rate",
    "late_eval": "held-out accuracy over the last third",
    "eval_peak": "peak held-out pass@1 (best in-loop evaluation after step 0; selection-biased: chosen and scored on "
    "the same evaluations)",
    "eval_peak_test": "peak held-out pass@1, unbiased (the step chosen on the in-loop evaluations, its checkpoint "
    "scored on disjoint test problems)",
    "eval_final": "final held-out pass@1 (last in-loop evaluation)",
}
#: The per-step statistics averaged over a run's steps into its summary (with min_/max_/p10_ companions): the ESS
#: and clip / truncation shares, and MinPRO's diagnostics (the MinPRO paper's tables 7 and 8: the prefix factor m_t
#: and the effective weight per relative-position decile, logged by the minpro objective) beside the monitor's
#: ``offpolicy/m_mean`` (the same m_t of the data, logged for every objective).
STEP_KEYS: tuple[str, ...] = (
    "ess",
    "kl_weight",
    "capped_frac",
    "band_frac",
    "clipfrac",
    "trunc_frac",
    "approx_kl",
    "ratio_max",
    "lag_mean",
    "m_mean",
    "m_frac_above_0_5",
    "m_frac_below_0_1",
    "m_median",
    "m_frac_above_0.5",
    "m_frac_above_0.2",
    "m_frac_above_0.1",
    "m_frac_above_0.05",
    *(f"weight_decile_{d}" for d in range(10)),
    "offpolicy/m_mean",
    "offpolicy/m_frac_above_0_5",
    "offpolicy/m_frac_below_0_1",
)
#: The fields of a run's record (DONE, written by the runner), in the order the verdict files list them.
RECORD_FIELDS = ("started_at", "ended_at", "wall_s", "cpu", "base_key")


@dataclass
class RunSummary:
    """The numbers of one finished (or partly finished) run."""

    spec: RunSpec
    curves: Curves
    config: dict[str, Any]
    eval: dict[str, Any] | None
    collapse: CollapseInfo | None
    metrics: dict[str, float] = field(default_factory=dict)
    seconds: float = math.nan
    evals: list[tuple[int, float]] = field(default_factory=list)
    """The in-loop held-out pass@1 at every evaluation, (step, value), step 0 = the starting policy."""
    done: dict[str, Any] = field(default_factory=dict)
    """The run's DONE record (command, ``started_at``, ``ended_at``, ``wall_s``, ``cpu``, ``base_key``)."""
    finished: bool = True
    """False for a run the grid runner started (its log exists) that has neither DONE nor final/: interrupted or
    still training; such a run is in no cell."""

    def record(self) -> dict[str, Any]:
        """One run's entry of a verdict file's ``runs``: regime, objective, seed, the DONE record's fields (None
        where the runner did not write them), every evaluation, the peak and final pass@1."""
        out: dict[str, Any] = {"regime": self.spec.regime, "objective": self.spec.objective, "seed": self.spec.seed}
        out.update({k: self.done.get(k) for k in RECORD_FIELDS})
        out["evals"] = [[step, value] for step, value in self.evals]
        for key in ("eval_peak", "eval_peak_step", "eval_peak_test", "eval_peak_test_step", "eval_final", "pass@1"):
            value = self.metrics.get(key)
            out[key] = None if value is None or not math.isfinite(value) else value
        return out


@dataclass
class GridSummary:
    """All runs of an experiment, by (regime, objective)."""

    exp: Experiment
    runs: list[RunSummary]

    def cell(self, regime: str, objective: str) -> list[RunSummary]:
        """The test seeds of one (regime, objective) that have metrics (selection runs of baseline families are not
        test runs: see :meth:`selection`)."""
        seeds = set(self.exp.seeds)
        return [
            r
            for r in self.runs
            if r.spec.regime == regime
            and r.spec.objective == objective
            and r.curves
            and r.finished
            and r.spec.seed in seeds
        ]

    def selection(self, regime: str, objective: str, metric: str) -> list[float]:
        """`metric` of the runs of `objective` in `regime` on the selection seeds of the baseline families."""
        seeds = {s for f in self.exp.baselines.values() for s in f.selection_seeds} - set(self.exp.seeds)
        return [
            r.metrics.get(metric, math.nan)
            for r in self.runs
            if r.spec.regime == regime and r.spec.objective == objective and r.curves and r.spec.seed in seeds
        ]

    def stat(self, regime: str, objective: str, metric: str) -> tuple[float, float, int]:
        """Mean, sample std and count over seeds of a per-run metric."""
        return mean_std([r.metrics.get(metric, math.nan) for r in self.cell(regime, objective)])


def _load_yaml(path: Path) -> dict[str, Any]:
    try:
        raw = yaml.safe_load(path.read_text()) if path.is_file() else None
    except (yaml.YAMLError, OSError):
        raw = None
    return flatten(raw) if isinstance(raw, dict) else {}


def load_json(path: Path) -> dict[str, Any] | None:
    try:
        raw = json.loads(path.read_text()) if path.is_file() else None
    except (json.JSONDecodeError, OSError):
        return None
    return raw if isinstance(raw, dict) else None


def summarize_run(spec: RunSpec, exp: Experiment) -> RunSummary:
    """Read one run directory (metrics.jsonl, config.yaml, eval.json, DONE) and compute its summary numbers."""
    a = exp.analysis
    try:
        curves = read_curves(spec.run_dir / "metrics.jsonl")
    except DataError as err:  # a corrupt file (not a torn last line): this run is left out, loudly, not the report
        print(f"p3o compare: warning: {err}; run left out of the report", file=sys.stderr)
        curves = {}
    config = _load_yaml(spec.run_dir / "config.yaml")
    ev = load_json(spec.run_dir / "eval.json")
    done = load_json(spec.run_dir / "DONE") or {}
    log = exp.out_dir / "logs" / spec.regime / spec.objective / f"seed{spec.seed}.log"
    finished = is_finished(spec.run_dir) or not log.is_file()
    summary = RunSummary(spec, curves, config, ev, None, done=done, finished=finished)
    seconds = done.get("seconds")
    if isinstance(seconds, (int, float)):
        summary.seconds = float(seconds)
    elif "time_s" in curves and np.isfinite(curves["time_s"]).any():
        summary.seconds = float(np.nanmax(curves["time_s"]))
    if not curves:
        return summary
    m = summary.metrics
    m["steps"] = float(curves["step"].size)
    if REWARD_KEY in curves:
        reward = curves[REWARD_KEY]
        summary.collapse = detect_collapse(
            reward, drop=a.collapse_drop, window=a.smooth, min_peak=a.min_peak, noise_z=a.noise_z
        )
        m["final_reward"] = final_value(reward, a.final_frac)
        m["first_reward"] = float(smooth(reward, a.smooth)[min(a.smooth, reward.size) - 1])
        m["peak_reward"] = summary.collapse.peak
        m["collapsed"] = float(summary.collapse.collapsed)
    if "accuracy" in curves:
        m["final_accuracy"] = final_value(curves["accuracy"], a.final_frac)
    if "eval_accuracy" in curves:
        ev_curve = curves["eval_accuracy"]
        ok = np.isfinite(ev_curve)
        if ok.any():
            steps = curves["step"][ok]
            late = steps >= steps.max() * 2.0 / 3.0
            m["late_eval"] = float(ev_curve[ok][late].mean())
            m["first_eval"] = float(ev_curve[ok][0])
            m["delta_eval"] = float(ev_curve[ok][-1] - ev_curve[ok][0])
            summary.evals = [(int(st), float(v)) for st, v in zip(steps, ev_curve[ok])]
            m["eval_final"] = float(ev_curve[ok][-1])
            trained = [(v, st) for st, v in summary.evals if st > 0]
            if trained:  # the best evaluation of a trained policy (the MinPRO paper reports its best checkpoint)
                best, at = max(trained, key=lambda x: (x[0], -x[1]))  # the earliest of equal peaks
                m["eval_peak"], m["eval_peak_step"] = best, float(at)
            if "eval_problems" in curves and np.isfinite(curves["eval_problems"]).any():
                m["eval_problems"] = float(np.nanmax(curves["eval_problems"]))
    m.update(read_peak(spec.run_dir))  # eval_peak_test: the validation-chosen checkpoint on the test problems
    for key in STEP_KEYS:
        if key in curves and np.isfinite(curves[key]).any():
            m[key] = float(np.nanmean(curves[key]))
            m[f"min_{key}"] = float(np.nanmin(curves[key]))
            m[f"max_{key}"] = float(np.nanmax(curves[key]))
            m[f"p10_{key}"] = float(np.nanpercentile(curves[key], 10))
    if ev is not None:
        passk = ev.get("pass_at_k", {})
        if isinstance(passk, dict) and "1" in {str(k) for k in passk}:
            m["pass@1"] = float({str(k): v for k, v in passk.items()}["1"])
    return summary


def collect(exp: Experiment) -> GridSummary:
    """Summaries of every run of the grid (runs without metrics yet are kept, with empty curves)."""
    return GridSummary(exp, [summarize_run(spec, exp) for spec in expand(exp)])
