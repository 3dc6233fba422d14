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

from p3o.lazy import lazy_exports

# imported on first use (PEP 562): `p3o train --help` and `p3o doctor` read p3o.metrics.rules without numpy or rich
__getattr__ = lazy_exports(
    __name__,
    {
        "p3o.metrics.logger": ("METRICS_FILE", "MetricsLogger", "format_metrics", "read_metrics"),
        "p3o.metrics.plot": ("CAPTIONS", "PANELS", "SmoothMode", "plot_run", "smooth"),
        "p3o.metrics.progress": ("ProgressBar",),
    },
)


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
