"""Watching a run, in one place: writing and reading its metrics (`logger`), the console progress bar
(`progress`), curves and plots with ``p3o plot`` (`plot`), the off-policy monitor any trainer can feed
(`monitor.OffPolicyMonitor`: ESS, lag buckets, position drift, ratio tails, findings) and ``p3o doctor``, which
reads those findings back from a run's metrics (`doctor`). The monitor and the doctor are imported from their
modules (they need torch; this package's own names do not).

    logger = MetricsLogger("runs/x", config=to_dict(cfg))
    logger.log(1, {"reward_mean": 0.4, "ess": 0.93})   # appends {"step": 1, "reward_mean": 0.4, ...}
    logger.close()
    plot_run("runs/x")                                  # -> runs/x/plot.png

Command line: ``p3o plot RUN_DIR [--out PNG]`` (`p3o.metrics.plot.main`).
"""

from __future__ import annotations

import importlib
from typing import Any

# imported on first use (PEP 562): `p3o train --help` and `p3o doctor` read p3o.metrics.rules without numpy or rich
_WHERE = {
    "METRICS_FILE": "p3o.metrics.logger",
    "MetricsLogger": "p3o.metrics.logger",
    "format_metrics": "p3o.metrics.logger",
    "read_metrics": "p3o.metrics.logger",
    "CAPTIONS": "p3o.metrics.plot",
    "PANELS": "p3o.metrics.plot",
    "SmoothMode": "p3o.metrics.plot",
    "plot_run": "p3o.metrics.plot",
    "smooth": "p3o.metrics.plot",
    "ProgressBar": "p3o.metrics.progress",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'p3o.metrics' has no attribute {name!r}")


__all__ = [
    "CAPTIONS",
    "METRICS_FILE",
    "PANELS",
    "MetricsLogger",
    "ProgressBar",
    "SmoothMode",
    "format_metrics",
    "plot_run",
    "read_metrics",
    "smooth",
]
