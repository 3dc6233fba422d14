"""``p3o doctor PATH``: off-policy findings of a training run, each with its cause, for CI or a human.

    p3o doctor runs/default                   # a p3o run directory (metrics.jsonl, config.yaml)
    p3o doctor out/trl-grpo                   # a TRL output dir (trainer_state.json, or its latest checkpoint-*/)
    p3o doctor metrics.jsonl --out doctor.png # any JSONL of metric rows (one JSON object per step)

It reads the metric rows, maps the off-policy keys of every source onto the monitor's names (``offpolicy/ess``
from the TRL callback, ``actor/offpolicy/ess`` from verl, ``objective/ess`` from ``P3OGRPOTrainer``, p3o's own
``ess``, ``lag_*``, ``kl_clamped``, ...) and applies the rules of :func:`p3o.metrics.monitor.find`: the window rules
(low ESS, ratio tails, position drift, prefix decay) to every window of ``--window`` consecutive steps — a run
shorter than the window is judged on its own length —, the single-step and trend rules (an ESS collapse at any one
step, weights not reaching the engine, NaN log-probs) to the whole run.

Each finding is attributed, from the lag buckets, to **staleness** (the stale tokens carry it, lag 0 is clean), the
**engine** (the fresh, lag-0 tokens carry it), **both**, or **weights not reaching the engine** (lag-0 mismatch
growing step by step after each weight push). A token's lag is the number of optimizer updates since it was sampled
(p3o: the earlier mini-batches of its own update included), so a sync run's later mini-batches are stale, and a
staleness finding names its origin when the rows say (``lag_in_batch_mean``): mini-batches, the policy lag or both
(:func:`p3o.metrics.rules.staleness_origin`). Its suggestion names the setting in the words of the trainer the
metrics came from (detected from the keys: TRL ``GRPOConfig.steps_per_generation`` / ``num_iterations``, p3o
``loop.max_lag`` / ``update.epochs``, verl ``async_training.staleness_threshold``).

Output: one verdict line first (``healthy`` or ``unhealthy: <cause>``, for scripts), then what was read and how many
steps, then one table row per finding: what fired (with its threshold), its cause, the evidence (the fresh and stale
tokens' shares), the steps, how many windows it fired in, and a suggestion. It writes a plot (ESS overall, per lag
bucket and of the stale tokens, lag, ratio tails, position deciles) next to the input or to ``--out``.

A run shorter than 10 steps (or than ``--window``, when that is shorter) is **too early to judge** by the window
rules that follow training (low ESS, ratio tails, position drift, prefix decay; the engine's mismatch is judged): the
verdict line says so, what they would say so far is listed as early signs, and the exit status stays 0 unless another
rule fires. The **no-signal** rule has a window of its own (3 steps): a run whose groups carry no advantage (≥ 90 % of
the groups with one reward for all samples: the model never solves the task, always solves it, or ties) is unhealthy
after 3 steps. Every suggestion is checked against the run's own config: no "use P3O" on a P3O run, no "lower
loop.max_lag" on a sync run.

Exit status: 0 healthy (or too early to judge), 1 at least one finding fired, 2 bad input (no such path, nothing
readable, no off-policy metric in it; a TRL run without per-step logs is told to set ``logging_steps``) — CI can gate
on it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import textwrap
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from p3o.errors import ConfigError
from p3o.metrics import rules
from p3o.metrics.rules import (  # not monitor: it imports torch, the doctor needs none
    CAUSE_TEXT,
    N_POSITION_BUCKETS,
    RULES,
    Finding,
    cause_text,
    find,
    lag_bucket_names,
    signal_of,
    staleness_origin,
    strip_prefixes,
)
from p3o.options import config_field as _f
from p3o.options import parse_or_help

__all__ = ["PREFIXES", "Diagnosis", "detect_source", "diagnose", "load_rows", "main", "verdict"]

#: Key prefixes mapped onto the monitor's names, first match wins (TRL callback, verl plug-in, P3OGRPOTrainer).
PREFIXES = ("offpolicy/", "train/offpolicy/", "actor/offpolicy/", "objective/", "train/objective/")
#: The keys that make a row an off-policy row.
OFFPOLICY_KEYS = ("ess", "ratio_min", "ratio_max", "dlogp_mean", "lag_mean", "kl_clamped")
#: The order causes are named in the verdict line (the most specific first; no learning signal before all).
_CAUSE_ORDER = ("unsolved", "solved", "tied", "sync", "inflight", "both", "engine", "staleness", "undetermined")


class BadInput(Exception):
    """The path is missing, unreadable or has no off-policy metrics (exit status 2)."""


@dataclass
class Diagnosis:
    """What ``p3o doctor`` found.

    Attributes:
        source: what was read (``p3o run``, ``TRL trainer_state.json``, ``JSONL``) and its path.
        rows: the normalised metric rows, in step order.
        findings: (finding, the steps it concerns: "a–b" (its first window, or the whole run) or the collapsed
            steps, number of windows it fired in; 0 for the whole-run rules), one per rule.
        windows: how many windows the window rules were applied to.
        config: the run's config (p3o run dirs: config.yaml as a dict), else {}.
        trainer: the trainer the metrics came from (``p3o``, ``trl``, ``verl``; None: unknown), whose settings the
            suggestions name.
        window: the window length used (the run's length when it is shorter than ``--window``).
        early: the window rules that fire on a run shorter than the window (too early to judge: reported, not
            counted), in the form of ``findings``.
    """

    source: str
    rows: list[dict[str, Any]]
    findings: list[tuple[Finding, str, int]]
    windows: int
    config: dict[str, Any]
    trainer: str | None = None
    window: int = 20
    requested_window: int = field(default=20)
    early: list[tuple[Finding, str, int]] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        """True when no finding fired (a run too short for the window rules can be healthy: see ``too_early``)."""
        return not self.findings

    @property
    def needed(self) -> int:
        """The steps the window rules need: ``RULES["min_steps"]`` (10), or ``--window`` when it is shorter."""
        return min(self.requested_window, int(RULES["min_steps"]))

    @property
    def too_early(self) -> bool:
        """True when the run is shorter than the window rules need, so they could not judge it."""
        return len(self.rows) < self.needed

    @property
    def causes(self) -> list[str]:
        """The distinct causes of the findings, most specific first (keys of ``CAUSE_TEXT``)."""
        seen = {f.cause for f, _, _ in self.findings}
        return [c for c in _CAUSE_ORDER if c in seen]


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


def detect_source(raw: Sequence[dict[str, Any]], hint: str | None = None) -> str | None:
    """The trainer that logged ``raw`` (un-normalised rows): ``verl`` (``actor/`` keys), ``p3o`` (its own
    ``version`` and ``reward_mean`` columns), ``trl`` (``offpolicy/`` or ``objective/`` keys beside TRL's ``reward``
    / ``completions/*``), else ``hint`` (how the file was found: a TRL trainer_state.json, a p3o run dir)."""
    keys = {k for r in raw for k in r}
    if any(k.startswith("actor/") for k in keys):
        return "verl"
    if {"version", "reward_mean"} <= keys:
        return "p3o"
    if any(k.startswith(("offpolicy/", "objective/")) for k in keys) and (
        "reward" in keys or any(k.startswith(("completions/", "rewards/")) for k in keys)
    ):
        return "trl"
    return hint


def load_rows(path: str | Path) -> tuple[str, list[dict[str, Any]], dict[str, Any], str | None]:
    """(source description, metric rows with normalised keys, run config, trainer) of a run dir, TRL dir/state or
    JSONL; trainer is ``p3o`` / ``trl`` / ``verl`` (:func:`detect_source`) or None.

    Raises BadInput (one line naming the path) when there is nothing to read.
    """
    p = Path(path)
    config: dict[str, Any] = {}
    hint: str | None = None
    if not p.exists():
        raise BadInput(f"{p}: no such file or directory")
    if p.is_dir():
        if (p / "metrics.jsonl").is_file():
            source, raw, hint = f"p3o run {p}", _read_jsonl(p / "metrics.jsonl"), "p3o"
            if (p / "config.yaml").is_file():
                loaded = yaml.safe_load((p / "config.yaml").read_text(encoding="utf-8"))
                config = loaded if isinstance(loaded, dict) else {}
        elif (state := _trl_state(p)) is not None:
            source, raw, hint = f"TRL {state}", _read_trl(state), "trl"
        else:
            raise BadInput(f"{p}: neither a p3o run dir (metrics.jsonl) nor a TRL output dir (trainer_state.json)")
    elif p.name.endswith(".json"):
        source, raw, hint = f"TRL {p}", _read_trl(p), "trl"
    elif p.suffix == ".jsonl":
        source, raw = f"JSONL {p}", _read_jsonl(p)
    else:
        raise BadInput(f"{p}: expected a run dir, a TRL trainer_state.json or a .jsonl file of metric rows")
    trainer = detect_source(raw, hint)
    rows = [_normalise(r) for r in raw]
    rows = [r for r in rows if any(k in r for k in OFFPOLICY_KEYS)]
    if not rows:
        raise BadInput(f"{p}: {_why_no_rows(raw, trainer)}")
    return source, rows, config, trainer


def _why_no_rows(raw: Sequence[dict[str, Any]], trainer: str | None) -> str:
    """The one line for a file with no off-policy rows, saying what to set (a TRL run: ``logging_steps``)."""
    what = f"no off-policy metrics in it (none of {', '.join(OFFPOLICY_KEYS)})"
    if trainer != "trl":
        return what
    steps = [r for r in raw if "loss" in r or "reward" in r]
    if len(steps) <= 1:
        return (
            f"{what}: its log_history has {len(steps)} per-step entr{'y' if len(steps) == 1 else 'ies'}; set "
            "logging_steps=1 in GRPOConfig so the trainer logs every step (transformers logs every 500 by default), "
            "with the off-policy callback added (p3o.integrations.trl.add_offpolicy_monitor; p3o docs integrations)"
        )
    return (
        f"{what}: the trainer logged {len(steps)} steps without them; add the off-policy callback "
        "(p3o.integrations.trl.add_offpolicy_monitor, or P3OGRPOTrainer; p3o docs integrations)"
    )


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
    """Apply the window rules of :func:`p3o.metrics.monitor.find` to every window of ``window`` consecutive rows,
    the whole-run rules (``RUN_RULES``: a collapse at any single step, weights not reaching the engine, NaN log-probs)
    to all rows, and the no-signal rule to every window of its own length (``RULES["signal_steps"]``).

    A run shorter than the window rules need (``RULES["min_steps"]``, 10, or ``window`` when shorter) is too early to
    judge for those that follow training (``PATIENT_RULES``; ``engine_mismatch`` judges the engine at once): what they
    would say on its rows is kept in ``Diagnosis.early`` and does not make the run unhealthy; a longer run shorter than
    ``window`` is judged on its own length. A window rule that fires in several windows is reported once, from the
    first window it fired in, with the number of windows; when its cause differs between windows, the most frequent one
    is reported and the others are named in the evidence. The no-signal rule counts when it fires on the run's last
    window or on more than half of its windows (a run that starts at reward 0 and then learns is not flagged). Every
    suggestion is fitted to the run's own config (p3o runs: config.yaml).
    """
    source, rows, config, trainer = load_rows(path)
    fit = config or None
    w = min(window, len(rows))
    findings: list[tuple[Finding, str, int]] = []
    whole = f"{_step(rows[0].get('step'), 0)}–{_step(rows[-1].get('step'), len(rows) - 1)}"
    for f in find(rows, source=trainer, only=rules.RUN_RULES, config=fit):
        findings.append((f, ", ".join(f.steps) if f.steps else whole, 0))
    findings += _signal_findings(rows, trainer, fit)
    windowed = _window_findings(rows, w, trainer, fit)
    too_early = len(rows) < min(window, int(RULES["min_steps"]))
    early = [x for x in windowed if too_early and x[0].name in rules.PATIENT_RULES]
    findings += [x for x in windowed if x not in early]
    return Diagnosis(source, rows, findings, len(rows) - w + 1, config, trainer, w, window, early)


def _signal_findings(
    rows: list[dict[str, Any]], trainer: str | None, config: dict[str, Any] | None
) -> list[tuple[Finding, str, int]]:
    """The no-signal finding over every window of its own length, when it fires on the last one or on more than half
    of them (reported from the first window it fired in, with the count)."""
    n = int(RULES["signal_steps"])
    have = [r for r in rows if signal_of(r) is not None]
    if len(have) < n:
        return []
    fired = []
    for s in range(len(have) - n + 1):
        got = find(have[s : s + n], source=trainer, only=rules.SIGNAL_RULES, config=config)
        fired.append((s, got[0]) if got else None)
    hits = [x for x in fired if x is not None]
    if not hits or not (fired[-1] is not None or len(hits) > len(fired) / 2):
        return []
    s, f = hits[0]
    span = f"{_step(have[s].get('step'), s)}–{_step(have[s + n - 1].get('step'), s + n - 1)}"
    return [(f, span, len(hits))]


def _window_findings(
    rows: list[dict[str, Any]], w: int, trainer: str | None, config: dict[str, Any] | None
) -> list[tuple[Finding, str, int]]:
    """The window rules over every window of ``w`` consecutive rows, each reported once (see :func:`diagnose`)."""
    first: dict[str, tuple[Finding, str]] = {}
    count: dict[str, int] = {}
    causes: dict[str, Counter[str]] = {}
    starts = range(len(rows) - w + 1)
    for s in starts:
        chunk = rows[s : s + w]
        for f in find(chunk, source=trainer, only=rules.WINDOW_RULES, config=config):
            count[f.name] = count.get(f.name, 0) + 1
            causes.setdefault(f.name, Counter())[f.cause] += 1
            if f.name not in first:
                steps = [r.get("step") for r in chunk]
                first[f.name] = (f, f"{_step(steps[0], s)}–{_step(steps[-1], s + w - 1)}")
    out: list[tuple[Finding, str, int]] = []
    for name, (f, span) in first.items():
        tally = causes[name]
        top = tally.most_common(1)[0][0]
        if top != f.cause or len(tally) > 1:
            # the cause of most windows, re-worded for it by the same rule on the first window that had it
            for s in starts:
                again = [
                    g for g in find(rows[s : s + w], source=trainer, only=(name,), config=config) if g.cause == top
                ]
                if again:
                    f = again[0]
                    break
            others = ", ".join(f"{CAUSE_TEXT[c]} in {n}" for c, n in tally.items() if c != top)
            if others:
                f = dataclasses.replace(f, evidence=f"{f.evidence}; other windows: {others}")
        out.append((f, span, count[name]))
    return out


def _step(value: Any, index: int) -> str:
    return str(int(value)) if isinstance(value, int | float) and math.isfinite(value) else f"row {index + 1}"


def _suggestion(f: Finding, config: dict[str, Any]) -> str:
    """The finding's suggestion (already fitted to the run's config by :func:`p3o.metrics.rules.suggest`) plus what
    the run's own config.yaml (p3o runs) says about the settings behind it."""
    text = f.suggestion
    sections = {k: (config.get(k) if isinstance(config.get(k), dict) else {}) for k in ("loop", "rollout", "update")}
    loop, rollout, update = sections["loop"], sections["rollout"], sections["update"]
    extra = []
    stale, engine = f.cause in ("staleness", "both"), f.cause in ("engine", "both")
    if stale:
        mode = loop.get("mode")
        key = "staleness" if mode == "stale" else "max_lag"
        mine = [f"loop.mode {mode}"] if mode is not None else []
        if mode in (None, "async", "stale") and loop.get(key) is not None:
            mine.append(f"loop.{key} {loop[key]}")
        for k in ("epochs", "num_mini_batches"):
            if update.get(k) not in (None, 1):
                mine.append(f"update.{k} {update[k]}")
        if mine:
            extra.append("this run: " + ", ".join(mine))
    train = config.get("train") if isinstance(config.get("train"), dict) else {}
    model = config.get("model") if isinstance(config.get("model"), dict) else {}
    compute = train.get("mixed_precision") if train.get("mixed_precision") not in (None, "no") else None
    if compute is None and model.get("dtype") not in (None, "float32"):
        compute = model["dtype"]
    if engine and compute is not None:  # the trainer's side of the mismatch: its compute precision
        extra.append(
            f"this run's trainer computes in {compute} (train.mixed_precision / model.dtype), the engine in "
            f"{rollout.get('precision', 'fp32')}: the ratios see both"
        )
    return text + ("; " + "; ".join(extra) if extra else "")


def verdict(d: Diagnosis) -> str:
    """The first line ``p3o doctor`` prints: ``healthy``, ``unhealthy: <cause>[; <cause>...]`` with the findings
    of each cause in brackets, or ``too early to judge: ...`` for a run shorter than the window with no finding."""
    if d.healthy:
        if d.too_early:
            signs = f"; early signs: {', '.join(f.name for f, _, _ in d.early)}" if d.early else ""
            return f"too early to judge: {len(d.rows)} of the {d.needed} steps the window rules need{signs}"
        return "healthy"
    parts = []
    origin = staleness_origin(d.rows)  # staleness from mini-batches / the policy lag, when the rows say
    for c in d.causes:
        names = [f.name for f, _, _ in d.findings if f.cause == c]
        parts.append(f"{cause_text(c, origin)} ({', '.join(names)})")
    return "unhealthy: " + "; ".join(parts)


def report(d: Diagnosis) -> str:
    """What ``p3o doctor`` prints: the verdict line, what was read, then one table row per finding (and, on a run
    too short for the window rules, what they would say so far)."""
    n = len(d.rows)
    if d.too_early:
        how = (
            f"too early to judge by the window rules, which need {d.needed} (engine_mismatch, the single-step rules "
            f"and the {RULES['signal_steps']:g}-step no-signal rule are judged)"
        )
    elif n < d.requested_window:
        how = f"shorter than the {d.requested_window}-step window: judged on its own {n} steps"
    else:
        how = f"{d.windows} windows of {d.window} steps"
    trainer = f" (metrics from {d.trainer})" if d.trainer else ""
    lines = [verdict(d), f"p3o doctor: {d.source}{trainer}: {n} steps, {how}"]
    if d.healthy and not d.early:
        lines.append("no finding fired (rules: p3o docs metrics, 'Off-policy findings')")
        return "\n".join(lines)
    origin = staleness_origin(d.rows)
    for title, table in (("", d.findings), (f"early signs over {n} steps (not counted: too early to judge)", d.early)):
        if not table:
            continue
        lines += ["", title] if title else [""]
        lines += ["| finding | cause | evidence | steps | windows | suggestion |", "|---|---|---|---|---:|---|"]
        for f, span, k in table:
            windows = str(k) if k else "whole run"
            lines.append(
                f"| {f.message} | {cause_text(f.cause, origin)} | {f.evidence} | {span} | {windows} "
                f"| {_suggestion(f, d.config)} |"
            )
    return "\n".join(lines)


def _lines(ax: Any, x: list[float], series: Any, specs: Sequence[tuple[str, str]], points: Sequence[str] = ()) -> None:
    """One line per (key, label) of `specs` that has any value (markers for `points`), and a legend if any."""
    for key, label in specs:
        s = series(key)
        if any(not math.isnan(v) for v in s):
            ax.plot(x, s, label=label, marker="." if key in points else None)
    if ax.lines:
        ax.legend(fontsize=7)


def _ess_panel(ax: Any, x: list[float], series: Any) -> None:
    """ESS of all tokens, per lag bucket and of the stale tokens, the low_ess threshold, the collapse floor and the
    steps below it."""
    ess = series("ess")
    ax.plot(x, ess, label="ESS (all tokens)", color="black")
    for name in lag_bucket_names():
        s = series(f"ess_lag_{name}")
        if any(not math.isnan(v) for v in s):
            ax.plot(x, s, label=f"ESS, lag {name.replace('_plus', '+').replace('_', '–')}", lw=1)
    s = series("ess_stale")
    if any(not math.isnan(v) for v in s):
        ax.plot(x, s, label="ESS, stale (lag ≥ 1)", lw=1, ls="--")
    ax.axhline(0.9, ls=":", color="grey", label="low_ess threshold 0.9")
    ax.axhline(RULES["ess_floor"], ls=":", color="red", label=f"collapse floor {RULES['ess_floor']:g}")
    low = [(xi, e) for xi, e in zip(x, ess) if not math.isnan(e) and e < RULES["ess_floor"]]
    if low:
        ax.scatter([a for a, _ in low], [b for _, b in low], color="red", marker="x", zorder=5, label="collapse")
    ax.set(title="Effective sample size", xlabel="step", ylabel="ESS")
    ax.legend(fontsize=7)


def plot(d: Diagnosis, out: Path) -> Path:
    """ESS (all tokens, per lag bucket, stale tokens; collapse steps marked), lag band, ratio tails (all, fresh,
    stale), mean |Δlogp| of fresh and stale tokens per step, and |Δlogp| by position decile, to ``out`` (PNG)."""
    # heavy: matplotlib start-up (~0.8 s), only when a plot is drawn
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = d.rows
    x = [float(r["step"]) if isinstance(r.get("step"), int | float) else float(i + 1) for i, r in enumerate(rows)]

    def series(key: str) -> list[float]:
        return [float(r[key]) if isinstance(r.get(key), int | float) else math.nan for r in rows]

    fig = Figure(figsize=(15, 7), constrained_layout=True)
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, 3)
    _ess_panel(axes[0][0], x, series)
    ax = axes[0][1]
    lo, mean, hi = series("lag_min"), series("lag_mean"), series("lag_max")
    if any(not math.isnan(v) for v in mean):
        ax.fill_between(x, lo, hi, alpha=0.3, label="min–max")
        ax.plot(x, mean, label="mean")
        ax.legend(fontsize=7)
    ax.set(title="Lag", xlabel="step", ylabel="optimizer updates since sampled")
    ax = axes[0][2]
    dlogp = (("dlogp_mean", "all tokens"), ("dlogp_mean_lag_0", "fresh (lag 0)"), ("dlogp_mean_stale", "stale"))
    _lines(ax, x, series, dlogp, points=("dlogp_mean_lag_0",))
    ax.set(title="Mismatch per step, fresh vs stale tokens", xlabel="step", ylabel="mean |Δlogp| (nats)")
    ax = axes[1][0]
    tails = (
        ("ratio_frac_above_2", "ρ > 2"),
        ("ratio_frac_below_0_5", "ρ < 0.5"),
        ("ratio_tails_lag_0", "ρ > 2 or < 0.5, fresh"),
        ("ratio_tails_stale", "ρ > 2 or < 0.5, stale"),
        ("band_frac", "|ρ−1|>0.2"),
    )
    _lines(ax, x, series, tails, points=("ratio_tails_lag_0", "ratio_tails_stale"))  # points: NaN gaps show
    ax.set(title="Ratio tails (share of tokens)", xlabel="step", ylabel="share")
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
    axes[1][2].set_axis_off()
    origin = staleness_origin(rows)
    text = [verdict(d), ""] + [f"{f.name}: {cause_text(f.cause, origin)}" for f, _, _ in d.findings]
    axes[1][2].text(0, 1, "\n".join(_wrap(t, 60) for t in text), va="top", fontsize=8, family="monospace")
    fig.suptitle(f"p3o doctor — {d.source}: {len(rows)} steps", fontsize=10)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    return out


def _wrap(text: str, width: int) -> str:
    return "\n".join(textwrap.wrap(text, width)) or text


@dataclass
class DoctorOptions:
    """Options of ``p3o doctor`` (parsed, typed and documented by the same mechanism as ``p3o train``)."""

    path: str = _f("", "a p3o run dir, a TRL output dir / trainer_state.json, or a JSONL of metric rows (PATH)")
    window: int = _f(20, "steps per window of the rules", ge=1)
    out: str | None = _f(None, "the plot's path (null: doctor.png beside the input)")
    no_plot: bool = _f(False, "print the findings only")


USAGE = "usage: p3o doctor PATH [--window W] [--out PNG] [--no-plot]"


def parse_args(argv: Sequence[str] | None) -> DoctorOptions | None:
    """``p3o doctor PATH [--option value ...]`` -> validated options (one-line ConfigError on bad input), or None
    after printing ``--help``."""
    about = __doc__.splitlines()[0].split(": ", 1)[1]
    opts = parse_or_help(argv, DoctorOptions, USAGE, about, arguments=[("PATH", "= --path")], positional=["path"])
    if opts is None:
        return None
    if not opts.path:
        raise ConfigError("expected a run directory or metrics file (p3o doctor PATH)")
    return opts


def main(argv: Sequence[str] | None = None) -> int:
    """``p3o doctor PATH [--window W] [--out PNG] [--no-plot]``: exit 0 healthy, 1 findings, 2 bad input."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = parse_args(argv)
        if args is None:
            return 0
        d = diagnose(args.path, window=args.window)
    except (BadInput, ConfigError) as err:
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
