"""A declared study on the synthetic instrument: cells of objectives × regimes × many paired seeds, verdicts by code.

The file names its instrument (``instrument: synthetic``), the shared settings of the toy policy
(:class:`p3o.experiments.synthetic.SyntheticConfig` fields), the cells, the seeds, the pre-registered primary
metric and margins, and the claims (the same claim schema as ``p3o compare``: ``better`` / ``worse`` / ``tracks``
/ ``identical`` between two objectives in one or more regimes). ``p3o compare`` dispatches here when the file
says ``instrument: synthetic``:

    p3o compare configs/experiments/synthetic.yaml --report docs/results-synthetic.md --figures docs/figures

Each cell's result is cached as JSON under ``out_dir/cells/`` (resumable: a rerun only computes missing cells).
Seed k of every cell shares the task, the initial table and the noise streams, so cells are paired by seed.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from p3o.errors import ConfigError
from p3o.experiments.spec import DECISIVE_KINDS, PrimarySpec
from p3o.experiments.stats import KIND_TEXT, PairedResult, decide_family, paired

__all__ = ["SyntheticClaim", "SyntheticStudy", "load_study", "render", "run_study"]

_TOP = {"name", "instrument", "description", "base", "cells", "seeds", "out_dir", "primary", "claims"}


@dataclass
class SyntheticClaim:
    """A decisive claim: objectives[0] (A) vs objectives[1] (B), paired by seed, in each of `regimes`."""

    id: str
    title: str
    kind: str
    regimes: list[str]
    objectives: list[str]
    metric: str = ""
    margin: float | None = None
    text: str = ""


@dataclass
class SyntheticStudy:
    """A parsed synthetic study file."""

    name: str
    base: dict[str, Any]
    cells: list[tuple[str, list[str]]]
    """(regime, objective specs run there)."""
    seeds: int
    out_dir: Path
    primary: PrimarySpec
    claims: list[SyntheticClaim] = field(default_factory=list)
    description: str = ""
    source: Path | None = None


def load_study(path: str | Path) -> SyntheticStudy:
    """Parse and validate a study file; errors name the file and the field."""
    from p3o.experiments.synthetic import SyntheticConfig, parse_objective, parse_regime

    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"{path}: cannot read the study file: {str(err).splitlines()[0]}") from None
    where = str(path)
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping at the top level")
    unknown = set(raw) - _TOP
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)}; known: {', '.join(sorted(_TOP))}")
    if raw.get("instrument") != "synthetic":
        raise ConfigError(f"{where}: instrument: expected 'synthetic'")
    base = dict(raw.get("base") or {})
    names = {f.name for f in dataclasses.fields(SyntheticConfig)}
    bad = set(base) - names
    if bad:
        raise ConfigError(f"{where}: base: unknown key(s) {sorted(bad)}; known: {', '.join(sorted(names))}")
    cells: list[tuple[str, list[str]]] = []
    for i, entry in enumerate(raw.get("cells") or []):
        if not isinstance(entry, dict) or "regime" not in entry or not entry.get("objectives"):
            raise ConfigError(f"{where}: cells[{i}]: expected {{regime: ..., objectives: [...]}}")
        parse_regime(str(entry["regime"]))
        for spec in entry["objectives"]:
            parse_objective(str(spec))
        cells.append((str(entry["regime"]), [str(o) for o in entry["objectives"]]))
    if not cells:
        raise ConfigError(f"{where}: cells: expected a non-empty list")
    seeds = raw.get("seeds", 16)
    if not isinstance(seeds, int) or seeds < 2:
        raise ConfigError(f"{where}: seeds: expected a count ≥ 2, got {seeds!r}")
    prim = raw.get("primary") or {}
    if not isinstance(prim, dict) or set(prim) - {f.name for f in dataclasses.fields(PrimarySpec)}:
        raise ConfigError(f"{where}: primary: expected {{metric, alpha, margin, secondary}}")
    primary = PrimarySpec(**prim)
    study = SyntheticStudy(
        name=str(raw.get("name", path.stem)),
        base=base,
        cells=cells,
        seeds=seeds,
        out_dir=Path(str(raw.get("out_dir", f"runs/synthetic/{path.stem}"))),
        primary=primary,
        description=str(raw.get("description", "") or ""),
        source=path,
    )
    ran = {(r, o) for r, objs in cells for o in objs}
    for i, c in enumerate(raw.get("claims") or []):
        here = f"{where}: claims[{i}]"
        if not isinstance(c, dict):
            raise ConfigError(f"{here}: expected a mapping")
        allowed = {f.name for f in dataclasses.fields(SyntheticClaim)}
        if set(c) - allowed:
            raise ConfigError(f"{here}: unknown key(s) {sorted(set(c) - allowed)}")
        claim = SyntheticClaim(**c)
        if isinstance(claim.regimes, str):
            claim.regimes = [claim.regimes]
        if claim.kind not in DECISIVE_KINDS or len(claim.objectives) != 2:
            raise ConfigError(f"{here}: kind must be one of {', '.join(DECISIVE_KINDS)} with exactly two objectives")
        for regime in claim.regimes:
            for obj in claim.objectives:
                if (regime, obj) not in ran:
                    raise ConfigError(f"{here}: objective '{obj}' is not run in regime '{regime}'")
        claim.metric = claim.metric or primary.metric
        study.claims.append(claim)
    return study


def _cell_path(study: SyntheticStudy, regime: str, objective: str) -> Path:
    safe = f"{regime}__{objective}".replace("/", "_").replace(":", "_").replace("=", "-")
    return study.out_dir / "cells" / f"{safe}.json"


def run_study(study: SyntheticStudy, *, log: Any = print) -> dict[tuple[str, str], dict[str, Any]]:
    """Compute every missing cell (cached as JSON) and return {(regime, objective): cell result}."""
    from p3o.experiments.synthetic import SyntheticConfig, parse_objective, parse_regime, run_synthetic

    out: dict[tuple[str, str], dict[str, Any]] = {}
    total = sum(len(objs) for _, objs in study.cells)
    done = 0
    for regime, objectives in study.cells:
        knobs = parse_regime(regime)
        for spec in objectives:
            done += 1
            path = _cell_path(study, regime, spec)
            if path.is_file():
                out[(regime, spec)] = json.loads(path.read_text())
                continue
            name, hyper = parse_objective(spec)
            cfg = SyntheticConfig(**{**study.base, **knobs, "objective": name, "hyper": hyper, "seeds": study.seeds})
            cfg.per_seed_curves = False
            t0 = time.perf_counter()
            res = run_synthetic(cfg)
            res.update(regime=regime, objective_spec=spec)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(res))
            tmp.replace(path)  # atomic: an interrupted study never leaves a half-written cell
            out[(regime, spec)] = res
            sm = res["summary"]
            log(
                f"[{done}/{total}] {regime} / {spec}: {study.primary.metric} "
                f"{sm.get(study.primary.metric, math.nan):.3f}, mean ESS {sm.get('mean_ess', math.nan):.3f} "
                f"({time.perf_counter() - t0:.1f} s)"
            )
    return out


@dataclass
class _Decision:
    claim: SyntheticClaim
    regime: str
    result: PairedResult
    p_adj: float = math.nan
    verdict: str = "inconclusive"


def decide(study: SyntheticStudy, cells: dict[tuple[str, str], dict[str, Any]]) -> list[_Decision]:
    """Paired-by-seed results, Holm-adjusted over the whole study, and verdicts."""
    out = []
    for claim in study.claims:
        a, b = claim.objectives
        margin = claim.margin if claim.margin is not None else study.primary.margin
        for regime in claim.regimes:
            xa = cells[(regime, a)]["per_seed"][claim.metric]
            xb = cells[(regime, b)]["per_seed"][claim.metric]
            res = paired(xa, xb, margin=margin, alpha=study.primary.alpha, bootstrap=2000)
            out.append(_Decision(claim, regime, res))
    decided = decide_family([d.claim.kind for d in out], [d.result for d in out], alpha=study.primary.alpha)
    for d, (p_adj, v) in zip(out, decided):
        d.p_adj, d.verdict = p_adj, v
    return out


def _plot(study: SyntheticStudy, cells: dict[tuple[str, str], dict[str, Any]], path: Path) -> Path:
    """One row per regime: exact J (mean over seeds, p10–p90 band), batch ESS, P3O-style KL weight 1 − ESS and
    MinPRO's prefix factor m̄_t of the batch's ratios; one colour per objective across the whole figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    specs = list(dict.fromkeys(o for _, objs in study.cells for o in objs))
    cmap = plt.get_cmap("tab20")
    color = {o: cmap(i % 20) for i, o in enumerate(specs)}
    panels = [
        ("reward", "exact J(θ)"),
        ("ess", "batch ESS"),
        ("kl_weight", "KL weight 1 − ESS"),
        ("m_mean", "mean prefix factor m_t"),
    ]
    rows = len(study.cells)
    fig, axes = plt.subplots(rows, len(panels), figsize=(13, 2.1 * rows + 0.8), squeeze=False)
    for i, (regime, objectives) in enumerate(study.cells):
        for spec in objectives:
            c = cells[(regime, spec)]["curves"]
            for j, (key, _) in enumerate(panels):
                if key not in c:
                    continue
                axes[i][j].plot(c[key], lw=1.0, color=color[spec], label=spec)
                if key == "reward" and "reward_p10" in c:
                    x = range(len(c["reward_p10"]))
                    axes[i][j].fill_between(x, c["reward_p10"], c["reward_p90"], color=color[spec], alpha=0.08)
        axes[i][0].set_ylabel(regime, fontsize=9)
        for j, (_, title) in enumerate(panels):
            if i == 0:
                axes[i][j].set_title(title, fontsize=10)
            axes[i][j].tick_params(labelsize=7)
            axes[i][j].grid(alpha=0.3)
    for j in range(len(panels)):
        axes[-1][j].set_xlabel("step")
    handles = [plt.Line2D([], [], color=color[o], lw=2) for o in specs]
    fig.legend(handles, specs, loc="lower center", ncol=min(7, len(specs)), fontsize=8)
    fig.suptitle(
        "Synthetic instrument (tabular toy, not an LM): mean over seeds; band = 10th–90th percentile of seeds",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0.05, 1, 0.98))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def render(
    study: SyntheticStudy,
    cells: dict[tuple[str, str], dict[str, Any]],
    report: Path,
    figures: Path,
    command: str,
) -> tuple[str, list[dict[str, Any]]]:
    """Markdown report and the verdict records (written next to it as ``.verdicts.json`` by the caller)."""
    import os

    decisions = decide(study, cells)
    fig = _plot(study, cells, figures / f"{study.name}-curves.png")
    rel = os.path.relpath(fig.resolve(), report.parent.resolve())
    pr = study.primary
    lines = [f"# Study `{study.name}` (synthetic instrument)", "", f"Generated by `{command}`.", ""]
    if study.description.strip():
        lines += [study.description.strip(), ""]
    lines += [
        "## Settings",
        "",
        "- Shared: " + ", ".join(f"`{k}={v}`" for k, v in study.base.items()),
        f"- Seeds per cell: {study.seeds}, paired (seed k shares task, initial table and noise streams everywhere)",
        f"- Pre-registered primary metric: **{pr.metric}**; {1 - pr.alpha:.0%} paired-t intervals; Holm over "
        f"{sum(1 for d in decisions if d.claim.kind != 'identical')} tested verdicts at α = {pr.alpha:g}; "
        f"equivalence margin δ = {pr.margin:g} (TOST) for *tracks*.",
        "",
        "## Verdicts",
        "",
        "| claim | regime | A | B | test | mean A | mean B | A − B [95% CI] | p (Holm) | verdict |",
        "|---|---|---|---|---|---:|---:|---|---:|---|",
    ]
    records = []
    for d in decisions:
        r, (a, b) = d.result, d.claim.objectives
        test = KIND_TEXT[d.claim.kind] + (f", δ = {r.margin:g}" if d.claim.kind == "tracks" else "")
        ci = "exactly 0 on every seed" if r.identical else f"{r.diff:+.4f} [{r.ci[0]:+.4f}, {r.ci[1]:+.4f}]"
        p = "—" if math.isnan(d.p_adj) else ("< 1e-4" if d.p_adj < 1e-4 else f"{d.p_adj:.3g}")
        lines.append(
            f"| {d.claim.id} | {d.regime} | {a} | {b} | {test} | {r.mean_a:.4f} | {r.mean_b:.4f} | {ci} | {p} | "
            f"**{d.verdict}** |"
        )
        records.append(
            {
                "claim": d.claim.id,
                "title": d.claim.title,
                "kind": d.claim.kind,
                "regime": d.regime,
                "a": a,
                "b": b,
                "metric": d.claim.metric,
                "p_adj": d.p_adj,
                "verdict": d.verdict,
                **r.to_dict(),
            }
        )
    counts = {v: sum(1 for d in decisions if d.verdict == v) for v in ("supported", "contradicted", "inconclusive")}
    lines += ["", "Totals: " + ", ".join(f"{n} {v}" for v, n in counts.items()) + ".", ""]
    lines += ["## Claims", ""]
    for claim in study.claims:
        lines += [f"- **({claim.id}) {claim.title}.** {claim.text.strip()}".rstrip()]
    lines += ["", "## Cells", "", f"![reward and ESS per regime]({rel})", ""]
    lines += [
        "| regime | objective | J(θ₀) | final J | mean J | last-third J | mean ESS | p10 ESS | min ESS | KL weight | "
        "m̄ (MinPRO) | m > 0.5 | time (s) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def f(x: Any, digits: int = 3) -> str:
        return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"

    for regime, objectives in study.cells:
        for spec in objectives:
            sm = cells[(regime, spec)]["summary"]
            lines.append(
                f"| {regime} | {spec} | {f(sm.get('base_reward'))} | {f(sm.get('final_reward'))} | "
                f"{f(sm.get('mean_reward'))} | {f(sm.get('last_third_reward'))} | {f(sm.get('mean_ess'))} | "
                f"{f(sm.get('ess_p10_all'))} | {f(sm.get('min_ess'))} | {f(sm.get('kl_weight'), 4)} | "
                f"{f(sm.get('m_mean'))} | {f(sm.get('m_above_0.5'))} | {f(sm.get('wall_s'), 1)} |"
            )
    return "\n".join(lines).rstrip() + "\n", records


def main(path: str | Path, report: Path | None, figures: Path | None, command: str) -> int:
    """Run (resumably) and report a synthetic study; returns the exit code."""
    study = load_study(path)
    t0 = time.perf_counter()
    cells = run_study(study)
    report = report or study.out_dir / "report.md"
    figures = figures or report.parent / "figures"
    text, records = render(study, cells, report, figures, command)
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text(text)
    report.with_suffix(".verdicts.json").write_text(json.dumps(records, indent=1, default=float) + "\n")
    print(f"report: {report} ({time.perf_counter() - t0:.0f} s)", flush=True)
    return 0
