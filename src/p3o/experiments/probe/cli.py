"""``p3o probe``: the gradient probe from the command line — the synthetic probe by default, a language-model
run's checkpoints with ``--run-dir``; prints the cosine table and writes ``--out`` / ``--plot`` / ``--update-doc``.

    p3o probe --out runs/probe/probe.json --plot docs/figures/probe-synthetic.png --update-doc docs/probe.md
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from p3o.experiments.probe.compute import (
    DEFAULT_LAGS,
    ProbeConfig,
    default_trajectory,
    probe_synthetic,
)
from p3o.experiments.probe.lm import probe_lm
from p3o.experiments.probe.tables import markdown_table, plot_probe, update_doc
from p3o.experiments.synthetic.config import parse_objective, parse_regime

# The ProbeConfig fields that are options of the same name (`--ref-groups` -> ref_groups): name -> help, choices.
_PROBE_OPTIONS: dict[str, tuple[str | None, list[str] | None]] = {
    "points": ("probe points per trajectory", None),
    "batches": ("batches per (trajectory, point, lag)", None),
    "ref_groups": ("groups per prompt for g_ref", None),
    "step_size": ("η of the fixed-length step", None),
    "noise": ("engine logit noise of the probe batches", None),
    "temperature": ("engine temperature of the batches", None),
    "logprob_mode": (None, ["raw", "processed"]),
    "seed": (None, None),
}


def build_parser() -> argparse.ArgumentParser:
    """Arguments of ``p3o probe``."""
    d, t = ProbeConfig(), default_trajectory()
    p = argparse.ArgumentParser(
        prog="p3o probe",
        description="Gradient probe: cosine / norm ratio / one-step gain of each objective's gradient on stale "
        "batches against a high-sample on-policy gradient (synthetic tabular autoregressive toy).",
    )
    p.add_argument("--objectives", default=",".join(d.objectives), help="comma list of objective specs")
    p.add_argument(
        "--lags",
        default=None,
        help=f"comma list of lags L (default {','.join(map(str, d.lags))}; with --run-dir 0,1,2,4)",
    )
    for name, (help_, choices) in _PROBE_OPTIONS.items():
        default = getattr(d, name)
        flag = "--" + name.replace("_", "-")
        p.add_argument(flag, type=type(default), default=default, help=help_, choices=choices)
    p.add_argument("--trajectories", type=int, default=t.seeds, help="independent trajectories (seeds)")
    p.add_argument("--lr", type=float, default=t.lr, help="learning rate of the trajectory")
    p.add_argument("--steps", type=int, default=t.steps, help="steps of the trajectory")
    p.add_argument("--regime", default="on-policy", help="regime of the trajectory (synthetic regime spec)")
    p.add_argument("--trajectory-objective", default=t.objective, help="objective spec of the trajectory")
    p.add_argument(
        "--run-dir",
        type=Path,
        default=None,
        help="probe a language-model run instead (checkpoints of `p3o train --ckpt.every 1 --ckpt.keep_last 1000`)",
    )
    p.add_argument("--ref-batches", type=int, default=16, help="with --run-dir: on-policy batches for g_ref")
    p.add_argument("--out", type=Path, default=None, help="probe JSON (rows, points, cells, ess_bins)")
    p.add_argument("--plot", type=Path, default=None, help="PNG of the headline figure")
    p.add_argument("--update-doc", type=Path, default=None, help="markdown file whose probe block is regenerated")
    p.add_argument("--doc-block", default="probe", help="name of the block in --update-doc (<!-- NAME:begin -->)")
    return p


def main(argv: list[str] | None = None) -> int:
    """``p3o probe``: run the synthetic probe, print the cosine table, write --out / --plot / --update-doc."""
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    objectives = tuple(o for o in args.objectives.split(",") if o)
    if args.run_dir is not None:
        lags = tuple(int(x) for x in (args.lags or "0,1,2,4").split(",") if x)
        result = probe_lm(
            args.run_dir,
            objectives=objectives,
            lags=lags,
            points=args.points,
            batches=args.batches,
            ref_batches=args.ref_batches,
            seed=args.seed,
            log=lambda s: print(s, flush=True),
        )
        return _finish(args, argv, result)
    name, hyper = parse_objective(args.trajectory_objective)
    traj = dataclasses.replace(
        default_trajectory(),
        objective=name,
        hyper=hyper,
        seeds=args.trajectories,
        lr=args.lr,
        steps=args.steps,
        **parse_regime(args.regime),
    )
    cfg = ProbeConfig(
        objectives=objectives,
        lags=tuple(int(x) for x in (args.lags or ",".join(map(str, DEFAULT_LAGS))).split(",") if x),
        trajectory=traj,
        **{name: getattr(args, name) for name in _PROBE_OPTIONS},
    )
    result = probe_synthetic(cfg, log=lambda s: print(s, flush=True))
    return _finish(args, argv, result)


def _finish(args: argparse.Namespace, argv: list[str], result: dict[str, Any]) -> int:
    """Print the cosine table; write --out, --plot, --update-doc."""
    print(markdown_table(result, "cos"))
    print(f"probe: {len(result['rows']['cos'])} gradients in {result['wall_s']:.0f}s")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result))
        print(f"wrote {args.out}")
    if args.plot:
        plot_probe(result, args.plot)
        print(f"wrote {args.plot}")
    if args.update_doc:
        update_doc(args.update_doc, result, "p3o probe " + " ".join(argv), args.doc_block)
        print(f"updated {args.update_doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
