"""``p3o synthetic``: cells of objectives × regimes on the synthetic toy from the command line, without a study
file; one line per cell, and the grid as JSON (``--out``), CSV (``--csv``) or a table block of a doc page
(``--update-doc``).

    p3o synthetic --objectives p3o,grpo,minpro --regimes on-policy,stale-8 --seeds 100 --out runs/synthetic.json \
        --csv runs/synthetic.csv --update-doc docs/synthetic.md --doc-block objectives
"""

from __future__ import annotations

import csv
import dataclasses
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from p3o.config import config_field as _f
from p3o.config import config_help, load_config
from p3o.experiments.stats.paired import paired
from p3o.experiments.summary.blocks import write_block
from p3o.experiments.synthetic.config import SyntheticConfig, SyntheticKnobs
from p3o.experiments.synthetic.study import run_cells

__all__ = ["SyntheticOptions", "cells_table", "load_grid", "main", "write_csv"]


@dataclass
class _Cells:
    """The cells of ``p3o synthetic`` (its first options)."""

    objectives: str = _f("p3o,grpo", "comma list of objective specs: name[:key=value...] or presets (grpo-0.4)")
    regimes: str = _f(
        "on-policy",
        "comma list of regimes: names of p3o.experiments.grid.regimes.REGIMES or knobs joined by '+' (mb<M>, ep<E>, "
        "lag-<L>, stale-<n>, noise-<s>, temp-<T>[-processed])",
    )


# Dataclass fields come in reverse MRO order: _Cells' options, then the SyntheticConfig knobs, then the outputs.
@dataclass
class SyntheticOptions(SyntheticKnobs, _Cells):
    """Options of ``p3o synthetic`` (parsed, typed and documented by the same mechanism as ``p3o train``): the cells,
    the :class:`SyntheticKnobs` of every cell, and the outputs."""

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
    knobs = {f.name: getattr(args, f.name) for f in dataclasses.fields(SyntheticKnobs)}
    base = SyntheticConfig(**knobs, per_seed_curves=not args.no_seed_curves)
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
