"""`p3o compare`: run a grid of objectives × regimes × seeds (resumably) and write a markdown report with figures.

Usage:

    p3o compare configs/experiments/lm.yaml --jobs 2
    p3o compare configs/experiments/synthetic.yaml --report docs/results/synthetic.md
    p3o compare configs/experiments/lm.yaml --report-only           # re-aggregate finished runs only
    p3o compare my-draft.yaml --exploratory                          # not pre-registered: marked, kept out of README
    p3o compare --check docs/results/lag.verdicts.json               # recompute its verdicts from per-seed values

A confirmatory study (the default) must be committed and unchanged, its out_dir must hold only runs of the same
decision rule, and its seeds must be fresh (:mod:`p3o.experiments.stats.prereg`); otherwise exit 2 with one line.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from p3o.config import TrainConfig, apply_overrides, config_help, load_config
from p3o.config import config_field as _f
from p3o.errors import ConfigError
from p3o.experiments.grid.collect import collect, summarize_run
from p3o.experiments.grid.peak import PEAK_FILE, PEAK_TEST, score_peak
from p3o.experiments.grid.report import write_report
from p3o.experiments.grid.runner import DEFAULT_TRAIN_CMD, RunOutcome, run_grid, train_argv
from p3o.experiments.grid.spec import Experiment, RunSpec, expand, load_experiment
from p3o.experiments.stats.prereg import decision_digest, preregister, record
from p3o.tasks import task_options


@dataclass
class CompareOptions:
    """Options of ``p3o compare`` (parsed, typed and documented by the same mechanism as ``p3o train``)."""

    experiment: str = _f(
        "", "experiment YAML (`p3o examples study` writes one to start from); also the first positional argument"
    )
    jobs: int = _f(1, "training processes at once", ge=1)
    report: str | None = _f(None, "report path (None: OUT_DIR/report.md)")
    figures: str | None = _f(None, "figure directory (None: REPORT_DIR/figures)")
    out_dir: str | None = _f(None, "override the experiment's out_dir")
    report_only: bool = _f(False, "train nothing; aggregate what has finished")
    no_eval: bool = _f(False, "skip the final pass@k evaluation of each run")
    dry_run: bool = _f(False, "print the training commands and exit")
    train_cmd: str | None = _f(None, "training command (None: python -m p3o train)")
    in_process: bool = _f(False, "train in this process (no start-up cost; --jobs 1)")
    timeout: float | None = _f(None, "per-run wall-clock limit in seconds", gt=0)
    exploratory: bool = _f(
        False,
        "exploratory study: skip the pre-registration checks (committed file, one decision rule per out_dir, fresh "
        "seeds); the report and every verdict are marked exploratory",
    )


USAGE = (
    "usage: p3o compare EXPERIMENT.yaml [--jobs N] [--report PATH] [--key value ...]\n"
    "       p3o compare --check FILE.verdicts.json [...]   recompute every verdict from its per-seed values (exit 1 "
    "on any difference; p3o.experiments.stats.check)"
)


def parse_args(argv: list[str]) -> CompareOptions:
    """``p3o compare EXPERIMENT [--option value ...]`` -> validated options (one-line ConfigError on bad input)."""
    argv = list(argv)
    if argv and not argv[0].startswith("--"):
        argv = ["--experiment", *argv]
    opts = load_config(argv, cls=CompareOptions)
    if not opts.experiment:
        raise ConfigError("p3o compare: expected an experiment file (p3o compare EXPERIMENT.yaml ...)")
    return opts


def help_text() -> str:
    """``p3o compare --help``."""
    about = "run an experiment grid and write a markdown report with figures"
    return f"{USAGE}\n\n{about}\n\n{config_help(CompareOptions)}"


def _eval_run(spec: RunSpec, exp: Experiment) -> str:
    """pass@k of a finished run's final policy on the test split → run_dir/eval.json (skipped if present)."""
    out = spec.run_dir / "eval.json"
    final = spec.run_dir / "final"
    if out.is_file() or not final.is_dir():
        return "skipped"
    cfg_path = spec.run_dir / "config.yaml"
    try:  # the run's own resolved config; a run of another trainer (--train-cmd) may not have a p3o one
        cfg = load_config(["--config", str(cfg_path)]) if cfg_path.is_file() else None
    except ConfigError:
        cfg = None
    try:
        cfg = cfg or apply_overrides(TrainConfig(), spec.overrides)
    except ConfigError as err:
        return f"skipped (no p3o config to evaluate with: {err})"
    result = _evaluate(
        cfg, exp, str(final), seed=spec.seed, ks=[1] + [k for k in (2, 4, 8) if k <= exp.eval.n_samples]
    )
    _write_eval(out, result, exp)
    return f"pass@1 {result.pass_at_k.get(1, float('nan')):.3f}"


def _score_peak(spec: RunSpec, exp: Experiment) -> str:
    """For a study scoring ``eval_peak_test``: the validation-chosen checkpoint of a finished run on test problems
    disjoint from its in-loop evaluation (:mod:`p3o.experiments.grid.peak`) → run_dir/peak_test.json (skipped if
    present)."""
    # heavy: transformers start-up, only when a peak is scored
    from p3o.eval.runner import evaluate
    from p3o.models import load_policy

    metrics = [exp.primary.metric, *exp.primary.secondary, *(c.metric for c in exp.claims)]
    if PEAK_TEST not in metrics or (spec.run_dir / PEAK_FILE).is_file() or not (spec.run_dir / "final").is_dir():
        return ""
    cfg = load_config(["--config", str(spec.run_dir / "config.yaml")])

    def evaluate_on(model_path: str, problems: list[Any]) -> float:
        model, tokenizer = load_policy(model_path)
        task = cfg.task
        result = evaluate(
            model, tokenizer, problems, n_samples=1, ks=[1], verifier=task.verifier, template=task.template,
            system_prompt=task.system_prompt, seed=spec.seed,
        )  # fmt: skip
        return float(result.pass_at_k[1])

    n = int(cfg.task.n_eval)
    record = score_peak(spec.run_dir, cfg, summarize_run(spec, exp).evals, evaluate_on, n)
    return f"; peak (step {record['step']}) on test {record['test']:.3f}" if record else ""


def _evaluate(cfg: TrainConfig, exp: Experiment, model: str, *, seed: int, ks: list[int]) -> Any:
    """pass@k of `model` on the run config's task (its own options and verifier) with the grid's evaluation, on the
    grid's evaluation engine (`eval.engine`, the same for the base and every run, whatever engine a run trained
    with)."""
    from p3o.eval.runner import evaluate_checkpoint  # heavy start-up (transformers): only when evaluating

    task = cfg.task
    return evaluate_checkpoint(
        model,
        task.name,
        exp.eval.split,
        n_problems=exp.eval.n_problems,
        task_kwargs=task_options(task, task.name),
        n_samples=exp.eval.n_samples,
        ks=ks,
        max_new_tokens=int(exp.eval.max_new_tokens or cfg.rollout.max_new_tokens),
        temperature=exp.eval.temperature,
        verifier=task.verifier,
        template=task.template,
        system_prompt=task.system_prompt,
        seed=seed,
        engine=exp.eval.engine,
    )


def _write_eval(out: Path, result: Any, exp: Experiment) -> None:
    """An evaluation as JSON (``EvalResult.to_dict()`` plus the engine it ran on, ``eval.engine``)."""
    out.write_text(json.dumps({**result.to_dict(), "engine": exp.eval.engine}, indent=2) + "\n")


def _eval_base(exp: Experiment) -> None:
    """pass@k of the grid's base policy (`base: model.name`) with the grid's evaluation → out_dir/base_eval.json.

    The calibration table reports each regime's final pass@1 against it (skipped when present).
    """
    out = exp.out_dir / "base_eval.json"
    if out.is_file() or exp.eval.n_samples == 0:
        return
    cfg = apply_overrides(TrainConfig(), exp.base)
    result = _evaluate(cfg, exp, cfg.model.name, seed=0, ks=[1])
    out.parent.mkdir(parents=True, exist_ok=True)
    _write_eval(out, result, exp)
    print(f"base policy: pass@1 {result.pass_at_k.get(1, float('nan')):.3f} -> {out}", flush=True)


def _eval_locked(spec: RunSpec, exp: Experiment, lock: threading.Lock) -> str:
    """One evaluation at a time: transformers' model loading is not thread-safe (meta-device initialisation), and
    evaluations still overlap with the other workers' training subprocesses."""
    with lock:
        return _eval_run(spec, exp) + _score_peak(spec, exp)


def _path(text: str | None) -> Path | None:
    return Path(text) if text else None


def _instrument(path: Path | str) -> str:
    """The `instrument:` key of an experiment file ("lm" when absent or unreadable: load_experiment reports it)."""
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError):
        return "lm"
    return str(raw.get("instrument", "lm")) if isinstance(raw, dict) else "lm"


def _check_backend(runs: list[Any]) -> None:
    """Refuse (ConfigError, one line naming the regime) a grid whose runs need a rollout backend feature this machine
    lacks, e.g. vLLM's FP8 KV cache on a CPU without AVX-512/AMX (`p3o.rollout.capabilities`)."""
    from p3o.rollout.capabilities import check_rollout_backend  # heavy start-up (torch): only before training

    for spec in runs:
        o = spec.overrides
        try:
            check_rollout_backend(
                engine=str(o.get("rollout.engine", "hf")),
                kv_cache_dtype=str(o.get("rollout.kv_cache_dtype", "auto")),
                model_name=str(o.get("model.name", "tiny")),
                device=str(o.get("model.device", "auto")),
            )
        except ConfigError as err:
            raise ConfigError(f"regime {spec.regime!r}: {err}") from None


def _show(total: int) -> Any:
    """A progress printer for run outcomes: ``[i/total] regime/objective/seed: status ...``."""
    count = [0]

    def show(o: RunOutcome) -> None:
        count[0] += 1
        s = o.spec
        msg = f"[{count[0]}/{total}] {s.regime}/{s.objective}/seed{s.seed}: {o.status}"
        if o.status == "done":
            msg += f" in {o.seconds:.0f} s"
        if o.status == "failed":
            msg += f" ({o.message}; log {o.log_path})"
        elif o.message and o.message != "skipped":
            msg += f"; eval {o.message}"
        print(msg, flush=True)

    return show


def _train(args: CompareOptions, exp: Experiment, runs: list[RunSpec], train_cmd: list[str]) -> list[RunOutcome]:
    """Train (resumably) and evaluate every run of the grid; the failed outcomes."""
    evaluate = exp.eval.n_samples > 0 and not args.no_eval
    eval_lock = threading.Lock()
    if evaluate and args.jobs > 1:
        import torch  # heavy start-up: only when evaluations share the CPU with parallel training

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // args.jobs))  # evaluations share the CPU too
    outcomes = run_grid(
        runs,
        log_root=exp.out_dir / "logs",
        jobs=args.jobs,
        train_cmd=train_cmd,
        timeout_s=args.timeout,
        in_process=args.in_process,
        on_outcome=_show(len(runs)),
        after=(lambda spec: _eval_locked(spec, exp, eval_lock)) if evaluate else None,
    )
    return [o for o in outcomes if o.status == "failed"]


def _synthetic(args: CompareOptions, argv: list[str]) -> int:
    """``p3o compare`` of an ``instrument: synthetic`` file: the tabular toy's cells of many paired seeds."""
    from p3o.experiments.synthetic import study  # heavy start-up (torch): only for the synthetic instrument

    command = "p3o compare " + shlex.join([a for a in argv if a])
    report = Path(args.report) if args.report else None
    return study.run_and_report(
        Path(args.experiment), report, _path(args.figures), command, exploratory=args.exploratory
    )


def main(argv: list[str]) -> int:
    """Run `p3o compare`; exit 0 when every run finished, 1 when some failed (the report is written anyway)."""
    if any(a in {"-h", "--help"} for a in argv):
        print(help_text())
        return 0
    if argv and argv[0] == "--check":
        from p3o.experiments.stats.check import main as check_main  # call-time: only `p3o compare --check`

        return check_main(argv[1:])
    args = parse_args(argv)
    if _instrument(args.experiment) == "synthetic":  # the tabular toy: cells of many paired seeds, no subprocesses
        return _synthetic(args, argv)
    # another trainer has other keys; aggregating finished runs needs no check
    exp = load_experiment(args.experiment, check_config=not (args.train_cmd or args.report_only))
    if args.out_dir is not None:
        exp.out_dir = Path(args.out_dir)
    if args.in_process and (args.jobs > 1 or args.train_cmd):
        raise ConfigError("--in-process: runs one at a time with the built-in trainer (no --jobs, no --train-cmd)")
    train_cmd = shlex.split(args.train_cmd) if args.train_cmd else list(DEFAULT_TRAIN_CMD)
    if not train_cmd:
        raise ConfigError("--train-cmd: empty command")
    runs = expand(exp)
    if args.dry_run:
        for spec in runs:
            print(shlex.join(train_argv(spec, train_cmd)))
        return 0
    if not args.report_only:
        _check_backend(runs)  # a study needing what this CPU lacks stops here, before any run (or ledger line)
    selection = [s for f in exp.baselines.values() for s in f.selection_seeds]
    digest = decision_digest(exp.decision_rule())
    runs_dir = exp.out_dir / "runs"
    pre = preregister(
        args.experiment,
        exp.out_dir,
        exp.name,
        digest,
        list(dict.fromkeys([*exp.seeds, *selection])),
        exploratory=args.exploratory,
        runs_exist=runs_dir.is_dir() and any(runs_dir.iterdir()),
        report=_path(args.report) or exp.out_dir / "report.md",
    )
    start = time.perf_counter()
    failed: list[RunOutcome] = []
    if not args.report_only:
        record(exp.out_dir, exp.name, digest, pre)  # before any run: the out_dir remembers what made its runs
        failed = _train(args, exp, runs, train_cmd)
    if exp.calibration and not args.no_eval:
        _eval_base(exp)
    report = _path(args.report) or exp.out_dir / "report.md"
    command = "p3o compare " + shlex.join([a for a in argv if a])
    write_report(collect(exp), report, figure_dir=_path(args.figures), command=command, preregistration=pre)
    print(f"report: {report} ({time.perf_counter() - start:.0f} s)", flush=True)
    if failed:
        print(f"{len(failed)} run(s) failed; see the logs under {exp.out_dir / 'logs'}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
