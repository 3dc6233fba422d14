"""A declared study on the synthetic instrument: cells of objectives × regimes × many paired seeds, verdicts by code.

The file names its instrument (``instrument: synthetic``), the shared settings of the toy policy
(:class:`p3o.experiments.synthetic.SyntheticConfig` fields), the cells, the seeds, the pre-registered primary
metric and margins, and the claims (the same claim schema as ``p3o compare``: ``better`` / ``worse`` / ``tracks``
/ ``identical`` between two objectives in one or more regimes). ``p3o compare`` dispatches here when the file
says ``instrument: synthetic``:

    p3o compare configs/experiments/synthetic.yaml --report docs/results-synthetic.md --figures docs/figures

Each cell's result is cached as JSON under ``out_dir/cells/`` (resumable: a rerun only computes missing cells).
Seed k of every cell shares the task, the initial table and the noise streams, so cells are paired by seed.

The same cells without a study file, from the command line (``p3o synthetic``, :func:`main`)::

    p3o synthetic --objectives p3o,grpo,minpro --regimes on-policy,stale-8 --seeds 100 --out runs/synthetic.json \
        --csv runs/synthetic.csv --update-doc docs/synthetic.md --doc-block objectives
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
import yaml

from p3o.config import config_field as _f
from p3o.config import config_help, load_config
from p3o.errors import ConfigError
from p3o.experiments.prereg import Preregistration, decision_digest, preregister, record, verdict_file
from p3o.experiments.report import write_block
from p3o.experiments.spec import DECISIVE_KINDS, Claim, PrimarySpec, claim_from
from p3o.experiments.synthetic import SyntheticConfig, parse_objective, parse_regime, run_synthetic
from p3o.experiments.verdicts import Decision, decisions_table, tested_count, verdict_counts
from p3o.experiments.verdicts import decide as decide_claims

__all__ = ["SyntheticStudy", "cells_table", "load_grid", "load_study", "main", "render", "run_cells", "run_study"]

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
            t0 = time.perf_counter()
            res = run_synthetic(dataclasses.replace(base, **knobs, objective=name, hyper=hyper))
            res.update(regime=regime, objective_spec=spec)
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


def decide(
    study: SyntheticStudy, cells: dict[tuple[str, str], dict[str, Any]], *, exploratory: bool = False
) -> list[Decision]:
    """Paired-by-seed results, Holm-adjusted over the whole study, and verdicts
    (:func:`p3o.experiments.verdicts.decide` on the cells' per-seed numbers)."""

    def values(regime: str, a: str, b: str, metric: str) -> tuple[list[float], list[float]]:
        return cells[(regime, a)]["per_seed"][metric], cells[(regime, b)]["per_seed"][metric]

    return decide_claims(study.claims, study.primary, values, exploratory=exploratory)


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
    preregistration: Preregistration | None = None,
) -> tuple[str, list[dict[str, Any]]]:
    """Markdown report and the verdict records (written next to it as ``.verdicts.json`` by the caller)."""
    import os

    exploratory = preregistration is not None and preregistration.exploratory
    decisions = decide(study, cells, exploratory=exploratory)
    fig = _plot(study, cells, figures / f"{study.name}-curves.png")
    rel = os.path.relpath(fig.resolve(), report.parent.resolve())
    pr = study.primary
    lines = [f"# Study `{study.name}` (synthetic instrument)", "", f"Generated by `{command}`.", ""]
    if preregistration is not None:
        lines += preregistration.lines(study.source)
    if study.description.strip():
        lines += [study.description.strip(), ""]
    lines += [
        "## Settings",
        "",
        "- Shared: " + ", ".join(f"`{k}={v}`" for k, v in study.base.items()),
        f"- Seeds per cell: {len(study.seeds)} ({_seed_text(study.seeds)}), paired (seed k shares task, initial "
        "table and noise streams everywhere)",
        f"- Primary metric (the decision rule in the study file): **{pr.metric}**; {1 - pr.alpha:.0%} paired-t "
        f"intervals; Holm over {tested_count(decisions)} tested primary verdicts at α = {pr.alpha:g}; margin "
        f"δ = {pr.margin:g}: *tracks* is TOST within ±δ, contradicted only by an interval entirely outside [−δ, δ]; "
        "an effect below δ is *negligible*"
        + (
            f"; secondary metrics ({', '.join(pr.secondary)}) get verdicts beside the primary one, labelled "
            "secondary (their own Holm family)."
            if pr.secondary
            else "."
        ),
        "",
        "## Verdicts",
        "",
        decisions_table(decisions, 4),
    ]
    records = [d.to_dict() for d in decisions]
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
    the pre-registration checks of :mod:`p3o.experiments.prereg` (``exploratory`` lifts them and marks the
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
    )
    record(study.out_dir, study.name, digest, pre)
    t0 = time.perf_counter()
    cells = run_study(study)
    report = report or study.out_dir / "report.md"
    figures = figures or report.parent / "figures"
    text, records = render(study, cells, report, figures, command, pre)
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text(text)
    report.with_suffix(".verdicts.json").write_text(verdict_file(pre, records))
    print(f"report: {report} ({time.perf_counter() - t0:.0f} s)", flush=True)
    return 0


# ----------------------------------------------------------------------------------------------- p3o synthetic


@dataclass
class SyntheticOptions:
    """Options of ``p3o synthetic`` (parsed, typed and documented by the same mechanism as ``p3o train``)."""

    objectives: str = _f("p3o,grpo", "comma list of objective specs: name[:key=value...] or presets (grpo-0.4)")
    regimes: str = _f(
        "on-policy",
        "comma list of regimes: names of p3o.experiments.regimes.REGIMES or knobs joined by '+' (mb<M>, ep<E>, "
        "lag-<L>, stale-<n>, noise-<s>, temp-<T>[-processed])",
    )
    seeds: int = _f(SyntheticConfig.seeds, "seeds per cell (paired across cells)", ge=1)
    seed_offset: int = _f(
        SyntheticConfig.seed_offset, "first seed (seeds seed_offset .. seed_offset + seeds - 1)", ge=0
    )
    steps: int = _f(SyntheticConfig.steps, "rollout batches per run", ge=1)
    lr: float = _f(SyntheticConfig.lr, "learning rate", gt=0)
    optimizer: Literal["adam", "sgd"] = _f(SyntheticConfig.optimizer, "optimizer on the logits table")
    grad_clip: float = _f(SyntheticConfig.grad_clip, "per-seed gradient-norm clip (0: off)", ge=0)
    vocab: int = _f(SyntheticConfig.vocab, "tokens V", ge=2)
    length: int = _f(SyntheticConfig.length, "positions T", ge=1)
    prompts: int = _f(SyntheticConfig.prompts, "prompts P", ge=1)
    group: int = _f(SyntheticConfig.group, "samples per prompt per step G", ge=1)
    reward: Literal["threshold", "count"] = _f(SyntheticConfig.reward, "1[hits >= threshold] or hits / T")
    threshold: int = _f(SyntheticConfig.threshold, "hits needed for reward 1 (reward threshold)", ge=0)
    init_scale: float = _f(SyntheticConfig.init_scale, "σ_0 of the initial logits", ge=0)
    task_seed: int = _f(SyntheticConfig.task_seed, "seed of the hidden targets", ge=0)
    out: str | None = _f(None, "grid JSON (cells with per-seed numbers and curves)")
    csv: str | None = _f(None, "CSV with one row per (regime, objective, seed)")
    no_seed_curves: bool = _f(False, "omit per-seed curves from the JSON")
    update_doc: str | None = _f(None, "markdown file whose table block is regenerated")
    doc_block: str = _f("synthetic", "name of the block in --update-doc (<!-- NAME:begin -->)")


_USAGE = "usage: p3o synthetic [--objectives A,B] [--regimes R1,R2] [--seeds N] [--out PATH] [--key value ...]"


def load_grid(path: str | Path) -> dict[tuple[str, str], dict[str, list[float]]]:
    """Per-seed numbers of a grid JSON written by ``p3o synthetic --out``: {(regime, objective_spec): per_seed dict},
    where each per_seed dict maps a metric (final_reward, mean_reward, last_third_reward, mean_ess, ...) and ``seed``
    to a list aligned by seed — so ``a[m][i] − b[m][i]`` is a paired difference."""
    data = json.loads(Path(path).read_text())
    return {(c["regime"], c["objective_spec"]): {"seed": c["seeds"], **c["per_seed"]} for c in data["cells"]}


def write_csv(grid: dict[str, Any], path: str | Path) -> None:
    """One row per (regime, objective, seed) with the per-seed metrics: easy to load into pandas for paired tests."""
    cells = grid["cells"]
    if not cells:
        return
    keys = list(cells[0]["per_seed"])
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["regime", "objective", "seed", *keys])
        for cell in cells:
            for i, seed in enumerate(cell["seeds"]):
                w.writerow([cell["regime"], cell["objective_spec"], seed, *[cell["per_seed"][k][i] for k in keys]])


#: Each objective's own acting fraction, named by what it counts (the first one a cell reports is shown).
_OWN_FRACS = (
    ("obj_capped_frac", "cap"),
    ("obj_masked_frac", "mask"),
    ("obj_clipfrac", "clip"),
    ("obj_trunc_frac", "trunc"),
)


def cells_table(grid: dict[str, Any], ref: str | None = None, metric: str = "mean_reward") -> str:
    """One row per cell: regime, objective, J_0, final J (mean ± s.e. over seeds), mean J over the run, the paired
    difference of ``metric`` against objective ``ref`` in the same regime (mean and 95% paired-t interval over
    seeds, :func:`p3o.experiments.stats.paired`; ``ref`` defaults to the grid's first objective; "identical" when
    every seed's difference is exactly 0), mean and p10 ESS, mean 1 − ESS (P3O's KL weight), nominal clip fraction
    (ρ outside [0.8, 1.2], the same statistic for every objective), the objective's own acting fraction named by
    what it counts (P3O ``cap`` ρ > e_B, M2PO ``mask``, PPO family ``clip`` where the clip zeroes the gradient,
    CISPO / MinPRO ``trunc`` where the weight is truncated), MinPRO's mean m_t and share of tokens with m_t > 0.5
    (computed for every run), seconds."""
    from p3o.experiments.stats import paired

    cells = grid["cells"]
    if ref is None and cells:
        ref = cells[0]["objective_spec"]
    refs = {c["regime"]: c for c in cells if c["objective_spec"] == ref}
    head = (
        f"| regime | objective | J₀ | final J (± s.e.) | mean J | Δ mean J vs `{ref}` (95% CI) | ESS | ESS p10 | "
        "1 − ESS | ρ∉[0.8,1.2] | own cap/mask/clip/trunc | m_t | m_t>0.5 | s |"
    )
    rows = [head, "|---|---|" + "---:|" * 12]
    for c in cells:
        ps, sm = c["per_seed"], c["summary"]
        fin = torch.tensor(ps["final_reward"])
        se = float(fin.std() / max(1, fin.numel()) ** 0.5) if fin.numel() > 1 else 0.0
        own = [(n, sm[k]) for k, n in _OWN_FRACS if k in sm]
        clip = f"{own[0][0]} {own[0][1]:.3f}" if own else "—"
        base = refs.get(c["regime"])
        if base is None or base is c:
            delta = "—"
        else:
            r = paired(ps[metric], base["per_seed"][metric])
            delta = "identical" if r.identical else f"{r.diff:+.3f} [{r.ci[0]:+.3f}, {r.ci[1]:+.3f}]"
        rows.append(
            f"| {c['regime']} | `{c['objective_spec']}` | {sm['base_reward']:.3f} "
            f"| {sm['final_reward']:.3f} ± {se:.3f} | {sm['mean_reward']:.3f} | {delta} | {sm['mean_ess']:.3f} "
            f"| {sm['ess_p10_all']:.3f} | {sm['kl_weight']:.3f} "
            f"| {sm['clip_0.2']:.3f} | {clip} | {sm['m_mean']:.3f} | {sm['m_above_0.5']:.3f} | {c['wall_s']:.1f} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    """``p3o synthetic``: objectives × regimes on the toy, one line per cell; write --out / --csv / --update-doc."""
    argv = sys.argv[1:] if argv is None else argv
    if any(a in {"-h", "--help"} for a in argv):
        print(
            f"{_USAGE}\n\npaired multi-seed runs on the synthetic tabular toy (not a language model)\n\n"
            f"{config_help(SyntheticOptions)}"
        )
        return 0
    args = load_config(argv, cls=SyntheticOptions)
    knobs = {f.name for f in dataclasses.fields(SyntheticConfig)}
    base = SyntheticConfig(
        **{k: v for k, v in dataclasses.asdict(args).items() if k in knobs}, per_seed_curves=not args.no_seed_curves
    )
    regimes = [r for r in args.regimes.split(",") if r]
    objectives = [o for o in args.objectives.split(",") if o]
    results = run_cells(base, [(r, objectives) for r in regimes], log=lambda s: print(s, flush=True))
    grid = {
        "meta": {"instrument": "synthetic tabular autoregressive toy", "base": dataclasses.asdict(base)},
        "cells": list(results.values()),
    }
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(grid))
        print(f"wrote {args.out}")
    if args.csv:
        Path(args.csv).parent.mkdir(parents=True, exist_ok=True)
        write_csv(grid, args.csv)
        print(f"wrote {args.csv}")
    if args.update_doc:
        n = len(grid["cells"][0]["seeds"]) if grid["cells"] else 0
        wall = sum(c["wall_s"] for c in grid["cells"])
        head = f"Generated by `p3o synthetic {' '.join(argv)}` ({n} seeds per cell, {wall:.0f} s in all)."
        write_block(args.update_doc, args.doc_block, f"{head}\n\n{cells_table(grid)}")
        print(f"updated {args.update_doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
