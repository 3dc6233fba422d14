"""``p3o doctor PATH``: off-policy findings from a finished (or running) training run, for CI or a human.

    p3o doctor runs/default                   # a p3o run directory (metrics.jsonl, config.yaml)
    p3o doctor out/trl-grpo                   # a TRL output dir (trainer_state.json, or its latest checkpoint-*/)
    p3o doctor metrics.jsonl --out doctor.png # any JSONL of metric rows (one JSON object per step)

It reads the metric rows, maps the off-policy keys of every source onto the monitor's names (``offpolicy/ess``
from the TRL callback, ``actor/offpolicy/ess`` from verl, ``objective/ess`` from ``P3OGRPOTrainer``, p3o's own
``ess``, ``lag_*``, ``kl_clamped``, ...), applies the rules of :func:`p3o.metrics.monitor.find` to every window of
``--window`` consecutive steps, and prints one row per finding: what fired (with its threshold), the evidence, the
first steps it fired on, and a suggestion (which objective suits the regime, from the study's verdicts; whether to
lower ``loop.max_lag``; whether to record log-probs in fp32). It writes a plot (ESS, lag, ratio tails, position
deciles) next to the input or to ``--out``.

Exit status: 0 healthy, 1 at least one finding fired, 2 bad input (no such path, nothing readable, no off-policy
metric in it) — CI can gate on it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from p3o.metrics.monitor import N_POSITION_BUCKETS, Finding, find, lag_bucket_names, strip_prefixes

__all__ = ["PREFIXES", "Diagnosis", "diagnose", "load_rows", "main"]

#: Key prefixes mapped onto the monitor's names, first match wins (TRL callback, verl plug-in, P3OGRPOTrainer).
PREFIXES = ("offpolicy/", "train/offpolicy/", "actor/offpolicy/", "objective/", "train/objective/")
#: The keys that make a row an off-policy row.
OFFPOLICY_KEYS = ("ess", "ratio_min", "ratio_max", "dlogp_mean", "lag_mean", "kl_clamped")


class BadInput(Exception):
    """The path is missing, unreadable or has no off-policy metrics (exit status 2)."""


@dataclass
class Diagnosis:
    """What ``p3o doctor`` found.

    Attributes:
        source: what was read (``p3o run``, ``TRL trainer_state.json``, ``JSONL``) and its path.
        rows: the normalised metric rows, in step order.
        findings: (finding, first window's steps as "a–b", number of windows it fired in), one per rule.
        windows: how many windows were checked.
        config: the run's config (p3o run dirs: config.yaml as a dict), else {}.
    """

    source: str
    rows: list[dict[str, Any]]
    findings: list[tuple[Finding, str, int]]
    windows: int
    config: dict[str, Any]

    @property
    def healthy(self) -> bool:
        """True when no finding fired."""
        return not self.findings


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    lines = path.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError as err:
            if i == len(lines):
                break  # a torn last line of a running job
            raise BadInput(f"{path}:{i}: not JSON ({err})") from None
        if not isinstance(rec, dict):
            raise BadInput(f"{path}:{i}: not a JSON object")
        rows.append(rec)
    return rows


def _trl_state(path: Path) -> Path | None:
    if (path / "trainer_state.json").is_file():
        return path / "trainer_state.json"
    ckpts = sorted(path.glob("checkpoint-*/trainer_state.json"), key=lambda p: int(p.parent.name.split("-")[-1]))
    return ckpts[-1] if ckpts else None


def load_rows(path: str | Path) -> tuple[str, list[dict[str, Any]], dict[str, Any]]:
    """(source description, metric rows with normalised keys, run config) of a run dir, TRL dir/state or JSONL.

    Raises BadInput (one line naming the path) when there is nothing to read.
    """
    p = Path(path)
    config: dict[str, Any] = {}
    if not p.exists():
        raise BadInput(f"{p}: no such file or directory")
    if p.is_dir():
        if (p / "metrics.jsonl").is_file():
            source, raw = f"p3o run {p}", _read_jsonl(p / "metrics.jsonl")
            if (p / "config.yaml").is_file():
                import yaml

                loaded = yaml.safe_load((p / "config.yaml").read_text(encoding="utf-8"))
                config = loaded if isinstance(loaded, dict) else {}
        elif (state := _trl_state(p)) is not None:
            source, raw = f"TRL {state}", _read_trl(state)
        else:
            raise BadInput(f"{p}: neither a p3o run dir (metrics.jsonl) nor a TRL output dir (trainer_state.json)")
    elif p.name.endswith(".json"):
        source, raw = f"TRL {p}", _read_trl(p)
    elif p.suffix == ".jsonl":
        source, raw = f"JSONL {p}", _read_jsonl(p)
    else:
        raise BadInput(f"{p}: expected a run dir, a TRL trainer_state.json or a .jsonl file of metric rows")
    rows = [_normalise(r) for r in raw]
    rows = [r for r in rows if any(k in r for k in OFFPOLICY_KEYS)]
    if not rows:
        raise BadInput(f"{p}: no off-policy metrics in it (none of {', '.join(OFFPOLICY_KEYS)})")
    return source, rows, config


def _read_trl(path: Path) -> list[dict[str, Any]]:
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as err:
        raise BadInput(f"{path}: not JSON ({err})") from None
    if not isinstance(state, dict) or not isinstance(state.get("log_history"), list):
        raise BadInput(f"{path}: no log_history (not a TRL/transformers trainer_state.json)")
    return [r for r in state["log_history"] if isinstance(r, dict)]


def _normalise(row: dict[str, Any]) -> dict[str, Any]:
    out = strip_prefixes(row, PREFIXES)
    return {k: (math.nan if v is None else v) for k, v in out.items()}


def diagnose(path: str | Path, *, window: int = 20) -> Diagnosis:
    """Apply :func:`p3o.metrics.monitor.find` to every window of ``window`` consecutive rows (all rows when fewer)."""
    source, rows, config = load_rows(path)
    w = min(window, len(rows))
    first: dict[str, tuple[Finding, str]] = {}
    count: dict[str, int] = {}
    starts = range(len(rows) - w + 1)
    for s in starts:
        chunk = rows[s : s + w]
        for f in find(chunk):
            count[f.name] = count.get(f.name, 0) + 1
            if f.name not in first:
                steps = [r.get("step") for r in chunk]
                span = f"{_step(steps[0], s)}–{_step(steps[-1], s + w - 1)}"
                first[f.name] = (f, span)
    findings = [(f, span, count[name]) for name, (f, span) in first.items()]
    return Diagnosis(source, rows, findings, len(starts), config)


def _step(value: Any, index: int) -> str:
    return str(int(value)) if isinstance(value, int | float) and math.isfinite(value) else f"row {index + 1}"


def _suggestion(f: Finding, config: dict[str, Any]) -> str:
    text = f.suggestion
    objective = (config.get("objective") or {}).get("name") if isinstance(config.get("objective"), dict) else None
    loop = config.get("loop") if isinstance(config.get("loop"), dict) else {}
    rollout = config.get("rollout") if isinstance(config.get("rollout"), dict) else {}
    extra = []
    if f.cause in ("staleness", "mismatch", "ratio_tails") and objective in ("grpo", "dapo", "gspo"):
        extra.append(f"this run uses the hard clip '{objective}': the study favours P3O here")
    if f.cause == "staleness" and loop.get("max_lag") is not None:
        extra.append(f"this run: loop.max_lag {loop['max_lag']}")
    if f.cause in ("mismatch", "position_drift") and rollout.get("precision") not in (None, "fp32"):
        extra.append(f"this run: rollout.precision {rollout['precision']}")
    return text + ("; " + "; ".join(extra) if extra else "")


def report(d: Diagnosis) -> str:
    """The table ``p3o doctor`` prints."""
    lines = [f"p3o doctor: {d.source}: {len(d.rows)} steps, {d.windows} windows checked"]
    if d.healthy:
        lines.append("healthy: no finding fired (rules: docs/metrics.md, 'Off-policy findings')")
        return "\n".join(lines)
    lines += ["", "| finding | evidence | first fired (steps) | windows | suggestion |", "|---|---|---|---:|---|"]
    for f, span, n in d.findings:
        lines.append(f"| {f.message} | {f.evidence} | {span} | {n} | {_suggestion(f, d.config)} |")
    return "\n".join(lines)


def plot(d: Diagnosis, out: Path) -> Path:
    """ESS (global and per lag bucket), lag band, ratio tails and |Δlogp| by position decile, to ``out`` (PNG)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = d.rows
    x = [float(r["step"]) if isinstance(r.get("step"), int | float) else float(i + 1) for i, r in enumerate(rows)]

    def series(key: str) -> list[float]:
        return [float(r[key]) if isinstance(r.get(key), int | float) else math.nan for r in rows]

    fig = Figure(figsize=(11, 7), constrained_layout=True)
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, 2)
    ax = axes[0][0]
    ax.plot(x, series("ess"), label="ESS (all tokens)", color="black")
    for name in lag_bucket_names():
        s = series(f"ess_lag_{name}")
        if any(not math.isnan(v) for v in s):
            ax.plot(x, s, label=f"ESS, lag {name.replace('_plus', '+').replace('_', '–')}", lw=1)
    ax.axhline(0.9, ls=":", color="grey", label="threshold 0.9")
    ax.set(title="Effective sample size", xlabel="step", ylabel="ESS")
    ax.legend(fontsize=7)
    ax = axes[0][1]
    lo, mean, hi = series("lag_min"), series("lag_mean"), series("lag_max")
    if any(not math.isnan(v) for v in mean):
        ax.fill_between(x, lo, hi, alpha=0.3, label="min–max")
        ax.plot(x, mean, label="mean")
        ax.legend(fontsize=7)
    ax.set(title="Policy lag", xlabel="step", ylabel="versions")
    ax = axes[1][0]
    for key, label in (
        ("ratio_frac_above_2", "ρ > 2"),
        ("ratio_frac_below_0_5", "ρ < 0.5"),
        ("band_frac", "|ρ−1|>0.2"),
    ):
        s = series(key)
        if any(not math.isnan(v) for v in s):
            ax.plot(x, s, label=label)
    ax.set(title="Ratio tails (share of tokens)", xlabel="step", ylabel="share")
    if ax.lines:
        ax.legend(fontsize=7)
    ax = axes[1][1]
    last = rows[-min(20, len(rows)) :]
    dec = []
    for k in range(N_POSITION_BUCKETS):
        v = [float(r[f"dlogp_pos_{k}"]) for r in last if isinstance(r.get(f"dlogp_pos_{k}"), int | float)]
        v = [u for u in v if math.isfinite(u)]
        dec.append(sum(v) / len(v) if v else math.nan)
    if any(not math.isnan(v) for v in dec):
        ax.plot(range(N_POSITION_BUCKETS), dec, marker="o")
    ax.set(
        title="Mismatch by decode position (last 20 steps)",
        xlabel="position decile",
        ylabel="mean |Δlogp| (nats)",
    )
    status = "healthy" if d.healthy else "findings: " + ", ".join(f.name for f, _, _ in d.findings)
    fig.suptitle(f"p3o doctor — {status}", fontsize=10)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """``p3o doctor PATH [--window W] [--out PNG] [--no-plot]``: exit 0 healthy, 1 findings, 2 bad input."""
    ap = argparse.ArgumentParser(prog="p3o doctor", description=__doc__.splitlines()[0])
    ap.add_argument("path", help="a p3o run dir, a TRL output dir / trainer_state.json, or a JSONL of metric rows")
    ap.add_argument("--window", type=int, default=20, help="steps per window of the rules (default 20)")
    ap.add_argument("--out", default=None, help="the plot's path (default: doctor.png beside the input)")
    ap.add_argument("--no-plot", action="store_true", help="print the findings only")
    try:
        args = ap.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    if args.window < 1:
        print("p3o doctor: error: --window must be ≥ 1", file=sys.stderr)
        return 2
    try:
        d = diagnose(args.path, window=args.window)
    except BadInput as err:
        print(f"p3o doctor: error: {err}", file=sys.stderr)
        return 2
    print(report(d))
    if not args.no_plot:
        src = Path(args.path)
        out = Path(args.out) if args.out else (src if src.is_dir() else src.parent) / "doctor.png"
        print(f"plot: {plot(d, out)}")
    return 0 if d.healthy else 1


if __name__ == "__main__":
    sys.exit(main())
