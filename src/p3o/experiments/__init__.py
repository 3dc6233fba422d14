"""Experiment grids: objectives × off-policy regimes × seeds, run resumably and aggregated into reports.

Usage:

    exp = load_experiment("configs/experiments/lm.yaml")
    run_grid(expand(exp), log_root=exp.out_dir / "logs", jobs=2); write_report(collect(exp), exp.out_dir / "report.md")
"""

from p3o.experiments.analysis import aggregate_seeds, detect_collapse, read_curves, smooth
from p3o.experiments.regimes import OBJECTIVE_PRESETS, REGIMES, objective_overrides, regime_overrides
from p3o.experiments.report import collect, render_report, write_report
from p3o.experiments.runner import is_finished, run_grid, train_argv
from p3o.experiments.spec import Experiment, RunSpec, expand, load_experiment, parse_experiment

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
