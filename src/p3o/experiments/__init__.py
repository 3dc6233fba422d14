"""Experiments: studies of objectives × off-policy regimes × seeds, decided by pre-registered paired statistics.

Four rooms, one job each, and the pages they feed:

- :mod:`p3o.experiments.grid`: the language-model study — experiment files, regimes, the resumable runner, the
  report, ``p3o compare``;
- :mod:`p3o.experiments.stats`: how a claim is decided — paired intervals, TOST, Holm, verdicts, pre-registration;
- :mod:`p3o.experiments.synthetic`: the tabular toy with an exact J(θ), its training loop and its studies
  (``p3o synthetic``; ``p3o compare`` of an ``instrument: synthetic`` file);
- :mod:`p3o.experiments.probe`: each objective's stale-batch gradient against the on-policy one (``p3o probe``);
- :mod:`p3o.experiments.summary`: the results pages rendered from the verdict files.

Usage:

    exp = load_experiment("configs/experiments/lm.yaml")
    run_grid(expand(exp), log_root=exp.out_dir / "logs", jobs=2); write_report(collect(exp), exp.out_dir / "report.md")
"""

from p3o.experiments.grid.analysis import aggregate_seeds, detect_collapse, read_curves, smooth
from p3o.experiments.grid.collect import collect
from p3o.experiments.grid.regimes import OBJECTIVE_PRESETS, REGIMES, objective_overrides, regime_overrides
from p3o.experiments.grid.report import render_report, write_report
from p3o.experiments.grid.runner import is_finished, run_grid, train_argv
from p3o.experiments.grid.spec import Experiment, RunSpec, expand, load_experiment, parse_experiment

__all__ = [
    "OBJECTIVE_PRESETS",
    "REGIMES",
    "Experiment",
    "RunSpec",
    "aggregate_seeds",
    "collect",
    "detect_collapse",
    "expand",
    "is_finished",
    "load_experiment",
    "objective_overrides",
    "parse_experiment",
    "read_curves",
    "regime_overrides",
    "render_report",
    "run_grid",
    "smooth",
    "train_argv",
    "write_report",
]
