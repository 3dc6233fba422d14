"""A declared study on the synthetic instrument: cells of objectives × regimes × many paired seeds, verdicts by code.

The file names its instrument (``instrument: synthetic``), the shared settings of the toy policy
(:class:`p3o.experiments.synthetic.config.SyntheticConfig` fields), the cells, the seeds, the pre-registered primary
metric and margins, and the claims (the same claim schema as ``p3o compare``: ``better`` / ``worse`` / ``tracks``
/ ``identical`` between two objectives in one or more regimes). ``p3o compare`` dispatches here when the file
says ``instrument: synthetic``:

    p3o compare configs/experiments/synthetic.yaml --report docs/results/synthetic.md --figures docs/results/figures

Each cell's result is cached as JSON under ``out_dir/cells/`` (resumable: a rerun only computes missing cells).
Seed k of every cell shares the task, the initial table and the noise streams, so cells are paired by seed.

The same cells without a study file: ``p3o synthetic`` (:mod:`p3o.experiments.synthetic.cli`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from p3o.errors import ConfigError
from p3o.experiments.grid.runner import cpu_kind, utc_now
from p3o.experiments.grid.spec import DECISIVE_KINDS, Claim, PrimarySpec, claim_from
from p3o.experiments.stats.prereg import Preregistration, decision_digest, preregister, record, verdict_file
from p3o.experiments.stats.verdicts import Decision, decide, records_table, rule_text, verdict_counts
from p3o.experiments.synthetic.config import SyntheticConfig, parse_objective, parse_regime
from p3o.experiments.synthetic.train import run_synthetic

__all__ = ["SyntheticStudy", "load_study", "render", "run_and_report", "run_cells", "run_study", "study_decisions"]

_TOP = {"name", "instrument", "description", "base", "cells", "seeds", "out_dir", "primary", "claims"}


@dataclass
class SyntheticStudy:
    """A parsed synthetic study file."""

    name: str
    base: dict[str, Any]
    cells: list[tuple[str, list[str]]]
    """(regime, objective specs run there)."""
    seeds: list[int]
    """The seeds of every cell: ``seeds: N`` in the file is base.seed_offset .. base.seed_offset + N − 1 (0 ..
    N − 1 by default), ``seeds: [..]`` a list of fresh seeds."""
    out_dir: Path
    primary: PrimarySpec
    claims: list[Claim] = field(default_factory=list)
    description: str = ""
    source: Path | None = None


def load_study(path: str | Path) -> SyntheticStudy:
    """Parse and validate a study file; errors name the file and the field."""
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
    if {"seeds", "seed_ids"} & set(base):
        raise ConfigError(f"{where}: base: give the seeds at the top level (seeds: N or a list), not in base")
    seeds_raw = raw.get("seeds", 16)
    offset = base.pop("seed_offset", 0)
    if isinstance(seeds_raw, int) and not isinstance(seeds_raw, bool) and seeds_raw >= 2:
        seeds = list(range(int(offset), int(offset) + seeds_raw))
    elif (
        isinstance(seeds_raw, list)
        and len(seeds_raw) >= 2
        and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in seeds_raw)
        and len(set(seeds_raw)) == len(seeds_raw)
        and not offset
    ):
        seeds = [int(x) for x in seeds_raw]
    else:
        raise ConfigError(
            f"{where}: seeds: expected a count ≥ 2 (from base.seed_offset) or a list of ≥ 2 distinct seeds ≥ 0 "
            f"(without base.seed_offset), got {seeds_raw!r}"
        )
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
        claim = claim_from(c, here)
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


def run_cells(
    base: SyntheticConfig,
    cells: list[tuple[str, list[str]]],
    *,
    cache: Callable[[str, str], Path] | None = None,
    log: Callable[[str], Any] | None = print,
    metric: str = "mean_reward",
) -> dict[tuple[str, str], dict[str, Any]]:
    """Run every (regime, objective spec) cell on ``base`` (same seeds everywhere: paired by seed).

    Each result is :func:`p3o.experiments.synthetic.run_synthetic`'s dict plus ``regime`` and ``objective_spec``.
    With ``cache(regime, spec) -> path`` a cell found there is read instead of computed, and a computed one is
    written there atomically (an interrupted study never leaves a half-written cell).
    """
    out: dict[tuple[str, str], dict[str, Any]] = {}
    total = sum(len(objs) for _, objs in cells)
    done = 0
    for regime, objectives in cells:
        knobs = parse_regime(regime)
        for spec in objectives:
            done += 1
            path = cache(regime, spec) if cache is not None else None
            if path is not None and path.is_file():
                out[(regime, spec)] = json.loads(path.read_text())
                continue
            name, hyper = parse_objective(spec)
            t0, started_at = time.perf_counter(), utc_now()
            res = run_synthetic(dataclasses.replace(base, **knobs, objective=name, hyper=hyper))
            res.update(regime=regime, objective_spec=spec)
            # the cell's run record (p3o.experiments.stats.check compares started_at with the study's commit)
            res["run"] = {"started_at": started_at, "ended_at": utc_now(), "wall_s": time.perf_counter() - t0}
            res["run"].update(cpu=cpu_kind(), base_key="synthetic (the toy's per-seed initial table)")
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(".tmp")
                tmp.write_text(json.dumps(res))
                tmp.replace(path)
            out[(regime, spec)] = res
            if log is not None:
                sm = res["summary"]
                log(
                    f"[{done}/{total}] {regime} / {spec}: {metric} {sm.get(metric, math.nan):.3f}, mean ESS "
                    f"{sm.get('mean_ess', math.nan):.3f} (p10 {sm.get('ess_p10_all', math.nan):.3f}) "
                    f"({time.perf_counter() - t0:.1f} s)"
                )
    return out


def study_config(study: SyntheticStudy) -> SyntheticConfig:
    """The shared SyntheticConfig of the study's cells (a contiguous seed list is a count and an offset)."""
    seeds = study.seeds
    contiguous = seeds == list(range(seeds[0], seeds[0] + len(seeds)))
    where = {"seeds": len(seeds), "seed_offset": seeds[0]} if contiguous else {"seeds": len(seeds), "seed_ids": seeds}
    return SyntheticConfig(**{**study.base, **where, "per_seed_curves": False})


def run_study(study: SyntheticStudy, *, log: Any = print) -> dict[tuple[str, str], dict[str, Any]]:
    """Compute every missing cell of the study (cached as JSON under ``out_dir/cells``) and return them all.

    A cached cell made with other settings (seeds, steps, ...) is never mixed in: ConfigError naming it.
    """
    cells = run_cells(
        study_config(study),
        study.cells,
        cache=lambda r, o: _cell_path(study, r, o),
        log=log,
        metric=study.primary.metric,
    )
    for (regime, spec), res in cells.items():
        knobs = parse_regime(regime)
        name, hyper = parse_objective(spec)
        want = dataclasses.replace(study_config(study), **knobs, objective=name, hyper=hyper)
        if json.loads(json.dumps(res.get("config"))) != json.loads(json.dumps(dataclasses.asdict(want))):
            raise ConfigError(
                f"{_cell_path(study, regime, spec)} was computed with other settings (seeds, base): remove it or use "
                "another out_dir"
            )
    return cells


def study_decisions(
    study: SyntheticStudy, cells: dict[tuple[str, str], dict[str, Any]], *, exploratory: bool = False
) -> list[Decision]:
    """Paired-by-seed results, Holm-adjusted over the whole study, and verdicts
    (:func:`p3o.experiments.stats.verdicts.decide` on the cells' per-seed numbers)."""

    def values(regime: str, a: str, b: str, metric: str) -> tuple[list[float], list[float], list[int]]:
        return cells[(regime, a)]["per_seed"][metric], cells[(regime, b)]["per_seed"][metric], study.seeds

    return decide(study.claims, study.primary, values, exploratory=exploratory)


def _plot(study: SyntheticStudy, cells: dict[tuple[str, str], dict[str, Any]], path: Path) -> Path:
    """One row per regime: exact J (mean over seeds, p10–p90 band), batch ESS, P3O-style KL weight 1 − ESS and
    MinPRO's prefix factor m̄_t of the batch's ratios; one colour per objective across the whole figure."""
    import matplotlib  # heavy start-up: only when drawing

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # heavy start-up: only when drawing

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
    preregistration: Preregistration | None = None,
) -> tuple[str, list[dict[str, Any]]]:
    """Markdown report and the verdict records (written next to it as ``.verdicts.json`` by the caller)."""
    exploratory = preregistration is not None and preregistration.exploratory
    decisions = study_decisions(study, cells, exploratory=exploratory)
    fig = _plot(study, cells, figures / f"{study.name}-curves.png")
    rel = os.path.relpath(fig.resolve(), report.parent.resolve())
    lines = [f"# Study `{study.name}` (synthetic instrument)", "", f"Generated by `{command}`.", ""]
    if preregistration is not None:
        lines += preregistration.lines(study.source)
    if study.description.strip():
        lines += [study.description.strip(), ""]
    records = [d.to_dict() for d in decisions]
    lines += [
        "## Settings",
        "",
        "- Shared: " + ", ".join(f"`{k}={v}`" for k, v in study.base.items()),
        f"- Seeds per cell: {len(study.seeds)} ({_seed_text(study.seeds)}), paired (seed k shares task, initial "
        "table and noise streams everywhere)",
        "- The decision rule (the study file's): " + rule_text(records),
        "",
        "## Verdicts",
        "",
        records_table(records, 4),
    ]
    lines += ["", f"Totals (primary verdicts): {verdict_counts(decisions)}.", ""]
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


def _seed_text(seeds: list[int]) -> str:
    if seeds == list(range(seeds[0], seeds[0] + len(seeds))):
        return f"seeds {seeds[0]}–{seeds[-1]}"
    return "seeds " + ", ".join(map(str, seeds))


def run_and_report(
    path: str | Path, report: Path | None, figures: Path | None, command: str, *, exploratory: bool = False
) -> int:
    """Run (resumably) and report a synthetic study (``p3o compare`` of an ``instrument: synthetic`` file), under
    the pre-registration checks of :mod:`p3o.experiments.stats.prereg` (``exploratory`` lifts them and marks the
    verdicts)."""
    study = load_study(path)
    digest = decision_digest({"primary": study.primary, "claims": study.claims})
    cached = study.out_dir / "cells"
    pre = preregister(
        path,
        study.out_dir,
        study.name,
        digest,
        study.seeds,
        exploratory=exploratory,
        runs_exist=cached.is_dir() and any(cached.glob("*.json")),
        report=report or study.out_dir / "report.md",
    )
    record(study.out_dir, study.name, digest, pre)
    t0 = time.perf_counter()
    cells = run_study(study)
    report = report or study.out_dir / "report.md"
    figures = figures or report.parent / "figures"
    text, records = render(study, cells, report, figures, command, pre)
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text(text)
    runs = [
        {"regime": r, "objective": o, "seeds": study.seeds, **res["run"]}
        for (r, o), res in cells.items()
        if "run" in res
    ]
    missing = len(cells) - len(runs)
    reason = (
        f"{missing} of {len(cells)} cells were computed before cells recorded their run times" if missing else None
    )
    report.with_suffix(".verdicts.json").write_text(
        verdict_file(pre, records, runs=None if missing else runs, runs_reason=reason)
    )
    print(f"report: {report} ({time.perf_counter() - t0:.0f} s)", flush=True)
    return 0
