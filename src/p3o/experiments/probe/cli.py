"""``p3o probe``: the gradient probe from the command line — the synthetic probe by default, a language-model
run's checkpoints with ``--run-dir``; prints the cosine table and writes ``--out`` / ``--plot`` / ``--update-doc``.

    p3o probe --out runs/probe/probe.json --plot docs/figures/probe-synthetic.png --update-doc docs/probe.md
"""

from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from p3o.errors import ConfigError
from p3o.experiments.probe.compute import (
    DEFAULT_LAGS,
    DEFAULT_OBJECTIVES,
    ProbeConfig,
    ProbeKnobs,
    default_trajectory,
    probe_synthetic,
)
from p3o.experiments.probe.lm import probe_lm
from p3o.experiments.probe.tables import markdown_table, plot_probe, update_doc
from p3o.experiments.synthetic.config import parse_objective, parse_regime
from p3o.options import config_field as _f
from p3o.options import parse_or_help

_T = default_trajectory()


@dataclass
class _Specs:
    """What ``p3o probe`` probes (its first options)."""

    objectives: str = _f(",".join(DEFAULT_OBJECTIVES), "comma list of objective specs")
    lags: str | None = _f(
        None, f"comma list of lags L (null: {','.join(map(str, DEFAULT_LAGS))}; with --run_dir 0,1,2,4)"
    )


# Dataclass fields come in reverse MRO order: _Specs' options, then the ProbeConfig knobs, then the rest.
@dataclass
class ProbeOptions(ProbeKnobs, _Specs):
    """Options of ``p3o probe`` (parsed, typed and documented by the same mechanism as ``p3o train``): what it probes,
    the :class:`ProbeKnobs` of the probe batches, the trajectory, a language-model run instead, and the outputs."""

    trajectories: int = _f(_T.seeds, "independent trajectories (seeds)", ge=1)
    lr: float = _f(_T.lr, "learning rate of the trajectory", gt=0)
    steps: int = _f(_T.steps, "steps of the trajectory", ge=1)
    regime: str = _f("on-policy", "regime of the trajectory (synthetic regime spec)")
    trajectory_objective: str = _f(_T.objective, "objective spec of the trajectory")
    run_dir: str | None = _f(
        None, "probe a language-model run instead (checkpoints of `p3o train --ckpt.every 1 --ckpt.keep_last 1000`)"
    )
    ref_batches: int = _f(16, "with --run_dir: on-policy batches for g_ref", ge=1)
    out: str | None = _f(None, "probe JSON (rows, points, cells, ess_bins)")
    plot: str | None = _f(None, "PNG of the headline figure")
    update_doc: str | None = _f(None, "markdown file whose probe block is regenerated")
    doc_block: str = _f("probe", "name of the block in --update_doc (<!-- NAME:begin -->)")


USAGE = "usage: p3o probe [--objectives a,b] [--lags 0,8,32] [--run_dir RUN] [--out JSON] [--key value ...]"
ABOUT = (
    "gradient probe: cosine / norm ratio / one-step gain of each objective's gradient on stale batches against a "
    "high-sample on-policy gradient (synthetic tabular autoregressive toy, or a run's checkpoints with --run_dir)"
)


def _lags(text: str) -> tuple[int, ...]:
    """``--lags 0,8,32`` -> (0, 8, 32); a one-line ConfigError unless every item is an integer ≥ 0."""
    try:
        lags = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ConfigError(f"--lags: expected comma-separated integers, got {text!r}") from None
    if not lags or min(lags) < 0:
        raise ConfigError(f"--lags: expected integers >= 0, got {text!r}")
    return lags


def main(argv: list[str] | None = None) -> int:
    """``p3o probe``: run the synthetic probe, print the cosine table, write --out / --plot / --update-doc."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_or_help(argv, ProbeOptions, USAGE, ABOUT)
    if args is None:
        return 0
    objectives = tuple(o for o in args.objectives.split(",") if o)
    if args.run_dir is not None:
        lags = _lags(args.lags or "0,1,2,4")
        result = probe_lm(
            Path(args.run_dir),
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
        lags=_lags(args.lags or ",".join(map(str, DEFAULT_LAGS))),
        trajectory=traj,
        **{f.name: getattr(args, f.name) for f in dataclasses.fields(ProbeKnobs)},
    )
    result = probe_synthetic(cfg, log=lambda s: print(s, flush=True))
    return _finish(args, argv, result)


def _finish(args: ProbeOptions, argv: list[str], result: dict[str, Any]) -> int:
    """Print the cosine table; write --out, --plot, --update-doc."""
    print(markdown_table(result, "cos"))
    print(f"probe: {len(result['rows']['cos'])} gradients in {result['wall_s']:.0f}s")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result))
        print(f"wrote {args.out}")
    if args.plot:
        plot_probe(result, Path(args.plot))
        print(f"wrote {args.plot}")
    if args.update_doc:
        update_doc(Path(args.update_doc), result, "p3o probe " + " ".join(argv), args.doc_block)
        print(f"updated {args.update_doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
