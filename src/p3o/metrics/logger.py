"""Run metrics, written and read back: one JSON line per step (always), TensorBoard / W&B when available.

    logger = MetricsLogger("runs/x", config=to_dict(cfg))
    logger.log(1, {"reward_mean": 0.4, "ess": 0.93})   # appends {"step": 1, "reward_mean": 0.4, ...}
    logger.close()
    records = read_metrics("runs/x")                    # [{"step": 1, "reward_mean": 0.4, ...}, ...]

``metrics.jsonl`` is strict JSON: NaN and ±inf are written as ``null``. TensorBoard (``torch.utils.tensorboard``)
is used when importable; Weights & Biases only when installed *and* configured (``WANDB_MODE`` or
``WANDB_API_KEY`` set, or a wandb entry in ``~/.netrc``) — it never prompts.
"""

from __future__ import annotations

import importlib
import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import yaml

from p3o.errors import DataError, P3OError

__all__ = ["METRICS_FILE", "MetricsLogger", "format_metrics", "read_metrics", "to_number"]

METRICS_FILE = "metrics.jsonl"

Switch = bool | Literal["auto"]


def to_number(value: Any) -> Any:
    """JSON-safe scalar: tensors / numpy scalars -> Python numbers; NaN and ±inf -> None; str and None pass."""
    if value is None or isinstance(value, str):
        return value
    if hasattr(value, "item") and callable(value.item):  # torch / numpy scalar
        if getattr(value, "numel", lambda: 1)() != 1:
            raise TypeError(f"metric is not a scalar (shape {tuple(getattr(value, 'shape', ()))})")
        value = value.item()
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    raise TypeError(f"metric value of type {type(value).__name__} is not a number")


def _wandb_configured() -> bool:
    """True when W&B can run without prompting: WANDB_MODE or WANDB_API_KEY set, or credentials in ~/.netrc."""
    if os.environ.get("WANDB_MODE") or os.environ.get("WANDB_API_KEY"):
        return True
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    try:
        return "api.wandb.ai" in netrc.read_text()
    except OSError:
        return False


def _optional(mode: Switch, module: str, key: str, what: str, extra: str) -> Any:
    """The optional sink's module, imported; None when `mode` is False, or "auto" and it is not installed. `mode`
    True without it: P3OError naming `key` and the extra to install."""
    if mode is False:
        return None
    try:
        return importlib.import_module(module)
    except ImportError:
        if mode is True:
            raise P3OError(f"{key}: true needs {what}: pip install 'p3o[{extra}]'") from None
        return None


class MetricsLogger:
    """Append-only metrics sink for one run directory.

    Args:
        run_dir: the run directory (created); metrics go to ``run_dir/metrics.jsonl``.
        config: the resolved config as a dict (sent to TensorBoard as text and to W&B as its config).
        enabled: False makes every method a no-op (e.g. on data-parallel ranks other than 0).
        tensorboard: "auto" (when installed), True (required; error when missing) or False.
        wandb: "auto" (installed and configured), True (required; offline mode when not configured) or False.
        wandb_project: W&B project name.
        truncate_after: when resuming from a checkpoint at this step, drop existing lines with ``step`` greater than it
            so the file has no duplicate steps; None keeps the file as it is.

    Each :meth:`log` call writes one line ``{"step": step, **metrics}`` and flushes it, so the file is readable while
    the run goes on and survives a crash up to the last completed step.
    """

    def __init__(
        self,
        run_dir: str | Path,
        config: Mapping[str, Any] | None = None,
        *,
        enabled: bool = True,
        tensorboard: Switch = "auto",
        wandb: Switch = "auto",
        wandb_project: str = "p3o",
        truncate_after: int | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / METRICS_FILE
        self.enabled = enabled
        self._fh = None
        self._tb = None
        self._wandb = None
        if not enabled:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if truncate_after is not None and self.path.exists():
            kept = [r for r in read_metrics(self.path) if int(r.get("step", 0)) <= truncate_after]
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
            tmp.replace(self.path)
        self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self._tb = self._open_tensorboard(tensorboard, config)
        self._wandb = self._open_wandb(wandb, config, wandb_project)

    def _open_tensorboard(self, mode: Switch, config: Mapping[str, Any] | None) -> Any:
        tensorboard = _optional(mode, "torch.utils.tensorboard", "log.tensorboard", "TensorBoard", "tensorboard")
        if tensorboard is None:
            return None
        writer = tensorboard.SummaryWriter(log_dir=str(self.run_dir / "tensorboard"))
        if config:
            text = yaml.safe_dump(dict(config), sort_keys=False)
            writer.add_text("config", "```\n" + text + "\n```", 0)
        return writer

    def _open_wandb(self, mode: Switch, config: Mapping[str, Any] | None, project: str) -> Any:
        wandb = _optional(mode, "wandb", "log.wandb", "Weights & Biases", "wandb")
        if wandb is None:
            return None
        configured = _wandb_configured()
        if mode == "auto" and not configured:
            return None
        kwargs: dict[str, Any] = {} if configured else {"mode": "offline"}  # never prompt for a login
        return wandb.init(
            project=project, dir=str(self.run_dir), name=self.run_dir.name, config=dict(config or {}), **kwargs
        )

    @property
    def backends(self) -> list[str]:
        """Active sinks, e.g. ["jsonl", "tensorboard"]."""
        if not self.enabled:
            return []
        return ["jsonl"] + (["tensorboard"] if self._tb else []) + (["wandb"] if self._wandb else [])

    def log(self, step: int, metrics: Mapping[str, Any]) -> dict[str, Any]:
        """Write one record ``{"step": step, **metrics}``; values are numbers (0-d tensors accepted), str or None.

        Returns the record as written (NaN / inf replaced by None).
        """
        record: dict[str, Any] = {"step": int(step)}
        for k, v in metrics.items():
            if k == "step":
                continue
            try:
                record[str(k)] = to_number(v)
            except TypeError as err:
                raise TypeError(f"metric '{k}': {err}") from None
        if not self.enabled or self._fh is None:
            return record
        self._fh.write(json.dumps(record) + "\n")
        self._fh.flush()
        numeric = {k: v for k, v in record.items() if k != "step" and isinstance(v, int | float)}
        if self._tb is not None:
            for k, v in numeric.items():
                self._tb.add_scalar(k, v, int(step))
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(numeric, step=int(step))
        return record

    def close(self) -> None:
        """Flush and close every sink (idempotent)."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """Records of ``run_dir/metrics.jsonl`` (or of that file given directly), in file order.

    A torn last line (a crash mid-write) is ignored; a malformed line elsewhere raises DataError naming the line.
    """
    path = Path(run_dir)
    if path.is_dir():
        path = path / METRICS_FILE
    if not path.is_file():
        raise DataError(f"{path}: no metrics file")
    lines = path.read_text(encoding="utf-8").splitlines()
    records: list[dict[str, Any]] = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            if not isinstance(rec, dict):
                raise ValueError("not a JSON object")
        except ValueError as err:
            if i == len(lines):
                break  # torn final line
            raise DataError(f"{path}:{i}: malformed metrics line ({err})") from None
        records.append(rec)
    return records


def format_metrics(step: int, metrics: Mapping[str, Any], keys: Sequence[str] | None = None) -> str:
    """One plain log line, e.g. ``step 12 reward_mean=0.412 ess=0.93`` (for logs when there is no progress bar)."""
    keys = list(keys) if keys is not None else [k for k in metrics if k != "step"]
    parts = [f"step {step}"]
    for k in keys:
        if k not in metrics:
            continue
        v = to_number(metrics[k]) if not isinstance(metrics[k], str) else metrics[k]
        parts.append(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}")
    return " ".join(parts)
