"""The agent calibration table (issue 53 item 5) from the runs of scripts/agent_calibration.sh.

    .venv/bin/python scripts/agent_calibration_table.py [RUNS_DIR]                        # the table, to stdout
    .venv/bin/python scripts/agent_calibration_table.py runs/agent-calibration --out docs/results/agent-calibration.md

One row per finished run (NAME/final exists; a study's seed directories work too), over all its training steps:

- step ESS: `ess`, P3O's Kong ESS (Σρ)² / (|B|·Σρ²) of ρ = π_θ / π_b over each micro-batch's model tokens (observation
  tokens excluded), averaged per step; its mean, minimum and the share of steps below 0.95;
- episodes over ≥ 2 versions: `episode/multi_version` (share of a step's episodes whose model tokens come from ≥ 2
  policy versions), its mean over steps and the share of steps where it exceeds one half;
- token lag: `lag_mean` in policy versions, `offpolicy/lag_mean` in optimizer updates (mini-batches count);
- train reward, first → last 5 steps; wall time of the run (NAME/wall_s, on the shared 2-core machine).

A run **bites** when its mean step ESS is ≤ 0.95 (the threshold the LM studies pre-register) and **spans** when the
mean share of its episodes over ≥ 2 versions is ≥ 0.5 ("most episodes").
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from p3o.metrics.logger import read_metrics

ESS_BITE = 0.95
SPAN_BITE = 0.5


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def row(run: Path) -> dict[str, float | str] | None:
    """The table row of one finished run (None when unfinished)."""
    metrics, wall = run / "metrics.jsonl", run / "wall_s"
    if not (run / "final").is_dir() or not metrics.is_file():
        return None
    rows = read_metrics(metrics)
    evals = [(int(r["step"]), float(r["eval_accuracy"])) for r in rows if r.get("eval_accuracy") is not None]
    rows = [r for r in rows if r.get("ess") is not None]  # training steps (an evaluation-only row has no ess)
    ess = [float(r["ess"]) for r in rows]
    multi = [float(r.get("episode/multi_version") or 0.0) for r in rows]
    return {
        "run": run.name,
        "steps": len(rows),
        "ess_mean": _mean(ess),
        "ess_min": min(ess) if ess else math.nan,
        "ess_low": _mean([float(e < ESS_BITE) for e in ess]),
        "multi": _mean(multi),
        "multi_steps": _mean([float(m > 0.5) for m in multi]),
        "versions": _mean([float(r.get("episode/versions") or 1.0) for r in rows]),
        "lag": _mean([float(r.get("lag_mean") or 0.0) for r in rows]),
        "lag_updates": _mean([float(r.get("offpolicy/lag_mean") or 0.0) for r in rows]),
        "model_tokens": _mean([float(r.get("episode/model_tokens") or 0.0) for r in rows]),
        "reward_first": _mean([float(r["reward_mean"]) for r in rows[:5]]),
        "reward_last": _mean([float(r["reward_mean"]) for r in rows[-5:]]),
        "evals": " → ".join(f"{v:.3f}" for _, v in evals) if evals else "–",
        "wall_s": float(wall.read_text()) if wall.is_file() else math.nan,
        "options": _options(run),
    }


def _options(run: Path) -> str:
    """The run's options after the common ones (the script's log line `run NAME: ...`), '' when unknown."""
    log = run.parent / "options" / run.name
    return log.read_text().strip() if log.is_file() else ""


def table(rows: list[dict[str, float | str]]) -> list[str]:
    """The markdown table of `rows`."""
    out = [
        "| run | steps | step ESS mean (min) | steps with ESS < 0.95 | episodes over ≥ 2 versions (steps with > half) "
        "| versions per episode | token lag, versions (updates) | model tokens per episode "
        "| train reward, first → last 5 steps | held-out pass@1 | bites / spans | wall |",
        "|---|---:|---|---:|---|---:|---|---:|---|---|---|---:|",
    ]
    for r in rows:
        bites = "bites" if float(r["ess_mean"]) <= ESS_BITE else "no"
        spans = "spans" if float(r["multi"]) >= SPAN_BITE else "no"
        out.append(
            f"| {r['run']} | {r['steps']} | {r['ess_mean']:.4f} ({r['ess_min']:.3f}) | {r['ess_low']:.0%} "
            f"| {r['multi']:.2f} ({r['multi_steps']:.0%}) | {r['versions']:.2f} "
            f"| {r['lag']:.2f} ({r['lag_updates']:.1f}) | {r['model_tokens']:.1f} "
            f"| {r['reward_first']:.3f} → {r['reward_last']:.3f} | {r['evals']} | {bites} / {spans} "
            f"| {r['wall_s']:.0f} s |"
        )
    return out


def options_list(rows: list[dict[str, float | str]]) -> list[str]:
    """One bullet per run: its name and options (after the common ones)."""
    return [f"- `{r['run']}`: `{r['options'] or '(see scripts/agent_calibration.sh)'}`" for r in rows]


def main(argv: list[str] | None = None) -> int:
    """Print the table of every finished run under RUNS_DIR, or write the page (--out) with the template's
    {table} and {options} filled in."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="?", default="runs/agent-calibration")
    parser.add_argument("--out", default=None, help="write the page (template: scripts/agent_calibration_page.md)")
    args = parser.parse_args(argv)
    root = Path(args.runs)
    rows = [r for r in (row(p) for p in sorted(root.iterdir()) if p.is_dir()) if r is not None]
    names = (root / "order").read_text().split() if (root / "order").is_file() else []
    order = {name: i for i, name in enumerate(names)}
    rows.sort(key=lambda r: order.get(str(r["run"]), len(order)))
    if args.out is None:
        print("\n".join(table(rows)))
        return 0
    template = (Path(__file__).parent / "agent_calibration_page.md").read_text()
    page = template.replace("{table}", "\n".join(table(rows))).replace("{options}", "\n".join(options_list(rows)))
    Path(args.out).write_text(page)
    print(f"wrote {args.out} ({len(rows)} runs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
