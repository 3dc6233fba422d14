"""Back-fill the raw data of verdict files written before the tool kept it, only where it can be recovered honestly.

Verdict files written before ``values_a`` / ``values_b`` / ``seeds`` and ``runs`` existed hold each comparison's
statistics (n, means, sd, CI, p) but not the per-seed values they came from. Two cases:

- **synthetic studies** (``instrument: synthetic``): the simulator is deterministic given its seeds, so the study's
  cells are recomputed from the study file (the version whose sha256 the verdict file records) into a scratch
  out_dir, and the per-seed values are added to a record **only if** the statistics recomputed from them equal the
  stored ones (every field of :data:`p3o.experiments.stats.check.FIELDS`, absolute tolerance
  :data:`p3o.experiments.stats.check.TOL`); a record that does not reproduce is left without values and the file
  says so. The cells' original start times were never recorded, so ``runs`` stays null with the reason.
- **LM studies**: the runs' out_dirs (``eval.json``, ``metrics.jsonl`` per run) were never committed and are gone
  with the machines that made them; the reports print means ± sd per arm only. Their records get
  ``values_a = values_b = seeds = null`` and the file's ``values_reason`` / ``runs_reason`` say why.

    python -m p3o.experiments.stats.backfill docs/results/synthetic.verdicts.json \
        --study configs/experiments/synthetic.yaml
    python -m p3o.experiments.stats.backfill docs/results/lag.verdicts.json      # an LM study: the reasons only

The file is rewritten with its existing keys in their order and the new ones added; nothing stored is changed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from p3o.errors import ConfigError
from p3o.experiments.stats.check import FIELDS, _same

#: Why an LM study's verdict file has no per-seed values (the default ``values_reason``).
LM_VALUES_REASON = (
    "written before verdict files kept per-seed values; the runs' out_dirs (eval.json, metrics.jsonl) were not "
    "committed and are gone with the machines that ran them, and the report prints only mean ± sd per arm, so the "
    "per-seed values cannot be recovered"
)
#: Why an old verdict file has no run records (the default ``runs_reason``).
RUNS_REASON = (
    "written before the runner recorded each run's start / end time, wall, CPU kind and base key; the start times "
    "were never recorded, so 'committed before its runs' was checked against commit times and session notes only"
)


def _key(r: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(r.get(k) for k in ("claim", "regime", "a", "b", "metric", "role"))


def _study_text(study: Path, sha256: str | None, commit: str | None) -> str:
    """The study file's text as pre-registered: the working copy if its sha256 matches, else the commit's."""
    text = study.read_bytes()
    if sha256 is None or hashlib.sha256(text).hexdigest() == sha256:
        return text.decode()
    if commit:
        proc = subprocess.run(
            ["git", "-C", str(study.parent.resolve()), "show", f"{commit}:./{study.name}"],
            capture_output=True,
            timeout=30,
        )
        if proc.returncode == 0 and hashlib.sha256(proc.stdout).hexdigest() == sha256:
            return proc.stdout.decode()
    raise ConfigError(f"{study}: neither the working copy nor commit {commit} has the sha256 the verdict file records")


def synthetic_values(study_path: Path, doc: dict[str, Any], log: Any = print) -> tuple[dict[tuple, dict], str]:
    """Recompute a synthetic study's cells and return {record key: {seeds, values_a, values_b}} for the records
    whose stored statistics the values reproduce, and a sentence on what was recomputed."""
    from p3o.experiments.synthetic import study as syn  # heavy start-up (torch): only for synthetic studies

    pre = doc.get("preregistration") or {}
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / study_path.name
        copy.write_text(_study_text(study_path, pre.get("sha256"), pre.get("commit")))
        study = syn.load_study(copy)
        study.out_dir = Path(tmp) / "out"
        cells = syn.run_study(study, log=log)
        decisions = syn.study_decisions(study, cells)
    fresh = {}
    for d in decisions:
        rec = d.to_dict()
        fresh[_key(rec)] = rec
    out = {}
    for r in doc["verdicts"]:
        new = fresh.get(_key(r))
        if new is None:
            continue
        if all(key not in r or (key == "boot_ci" and r[key] is None) or _same(r[key], new[key]) for key in FIELDS):
            out[_key(r)] = {k: new[k] for k in ("seeds", "values_a", "values_b")}
    how = (
        f"per-seed values recomputed by `python -m p3o.experiments.stats.backfill` from {study_path} (sha256 "
        f"{str(pre.get('sha256'))[:12]}, the simulator is deterministic given its seeds); added only to the records "
        f"whose stored statistics they reproduce ({len(out)} of {len(doc['verdicts'])})"
    )
    return out, how


def backfill(path: Path, study: Path | None = None, log: Any = print, reason: str | None = None) -> dict[str, Any]:
    """The verdict file ``path`` with what can be back-filled added (see the module docstring); ``reason``: the
    ``values_reason`` to record instead of the default one."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ConfigError(f"{path}: cannot read verdicts: {str(err).splitlines()[0]}") from None
    if isinstance(doc, list):
        doc = {"preregistration": None, "verdicts": doc}
    records = doc["verdicts"]
    found: dict[tuple, dict] = {}
    how = None
    if study is not None:
        found, how = synthetic_values(study, doc, log=log)
    out: dict[str, Any] = {}
    for k, v in doc.items():
        if k == "verdicts":
            if "runs" not in doc:
                out["runs"] = None
                out["runs_reason"] = RUNS_REASON
            missing = sum(1 for r in records if r.get("values_a") is None and _key(r) not in found)
            if how:
                out["values_source"] = how
            if missing and "values_reason" not in doc:
                out["values_reason"] = reason or (
                    LM_VALUES_REASON
                    if study is None
                    else "the recomputed cells did not reproduce these records' stored statistics"
                )
        out[k] = v
    for r in records:
        if r.get("values_a") is not None:
            continue
        r.update(found.get(_key(r), {"seeds": None, "values_a": None, "values_b": None}))
    return out


def main(argv: list[str] | None = None) -> int:
    """Rewrite one verdict file with its back-filled raw data; exit 2 with one line on bad input."""
    parser = argparse.ArgumentParser(
        prog="python -m p3o.experiments.stats.backfill", description=__doc__.splitlines()[0]
    )
    parser.add_argument("verdicts", type=Path, help="the *.verdicts.json to back-fill (rewritten in place)")
    parser.add_argument("--study", type=Path, default=None, help="a synthetic study's file: recompute its cells")
    parser.add_argument("--reason", default=None, help="why the records have no per-seed values (values_reason)")
    args = parser.parse_args(argv)
    try:
        doc = backfill(args.verdicts, args.study, reason=args.reason)
    except ConfigError as err:
        print(f"backfill: error: {err}", file=sys.stderr)
        return 2
    args.verdicts.write_text(json.dumps(doc, indent=1, default=float) + "\n")
    n = sum(1 for r in doc["verdicts"] if r.get("values_a") is not None)
    print(f"{args.verdicts}: {n} of {len(doc['verdicts'])} verdicts carry per-seed values")
    return 0


if __name__ == "__main__":
    sys.exit(main())
