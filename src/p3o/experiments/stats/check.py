"""``p3o compare --check FILE``: recompute every verdict of a ``*.verdicts.json`` from its per-seed values.

A verdict record stores the raw data it was decided from (``values_a``, ``values_b``: (n,) per-seed values of A and
B on the record's metric; ``seeds``: the seed of each pair) beside the statistics computed from them. The check
recomputes, for every record,

    paired(values_a, values_b, margin, alpha)  →  n, mean_a, mean_b, diff, sd, ci, p_diff, p_equiv, identical,
                                                  boot_ci (the same 2000-resample paired bootstrap, seed 0)

with :func:`p3o.experiments.stats.paired.paired` (``scipy.stats``), then Holm's correction and the verdict within
each of the file's families (primary, secondary: :func:`p3o.experiments.stats.paired.decide_family`), and compares
every stored number with its recomputed value (absolute tolerance ``TOL``) and every stored label exactly. Any
difference is a problem; so is a record without per-seed values unless the file says why (top-level
``values_reason``), and a pair's seed that the file's pre-registration does not list.

The runs: a file lists them under ``runs`` (each with ``started_at`` / ``ended_at``, ISO 8601), or says why not
(``runs: null`` with ``runs_reason``). For a confirmatory file the pre-registration check compares the study file's
commit time (``preregistration.committed_at``; for a file amended after its results, ``registered_at``, the commit time
of the version its runs were declared under) with the earliest recorded run start: a run that started before it is a
problem.

The study's status (pooled / failed-bite / exploratory / superseded / replication, recorded in the record file's
``studies``) is reported; a file the ledger pools must be confirmatory, a confirmatory file the record file does not
list is refused (exit 2, one line), and a file ``relabelled`` under an amendment of the analysis rules must name one
the record file holds (``rules``).

A record marked ``superseded`` (``{by, date, why}``: re-decided by a later study, out of the pooled family) must be
one the record file's ``superseded`` amendments name, with the same mark, and every verdict they name must be
marked (:func:`p3o.experiments.stats.ledger.superseded_problems`; the record file of the repository holding FILE).

    problems, notes = check_file(Path("docs/results/minpro-stale4.verdicts.json"))
    p3o compare --check docs/results/*.verdicts.json      # exit 1 on any problem, 2 on an unreadable file
"""

from __future__ import annotations

import json
import math
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from p3o.errors import ConfigError
from p3o.experiments.stats.bias import peak_bias
from p3o.experiments.stats.ledger import (
    STATUSES,
    base_label,
    records_for,
    study_entry,
    study_instrument,
    study_status,
    superseded_problems,
)
from p3o.experiments.stats.paired import PairedResult, decide_family, paired

#: Absolute tolerance of a recomputed number (the stored files agree with scipy.stats to ~5e-13).
TOL = 1e-9
#: How many problems of one file the command prints (all of them count towards the exit status).
SHOW = 20
#: The stored statistics the check recomputes (``boot_ci`` only where the record has one).
FIELDS = ("n", "mean_a", "mean_b", "diff", "sd", "ci", "p_diff", "p_equiv", "identical", "boot_ci")


def load_verdicts(path: Path) -> dict[str, Any]:
    """A verdict file as ``{preregistration, verdicts, ...}`` (an old bare list: no pre-registration); ConfigError
    (one line naming the file) when it cannot be read."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ConfigError(f"{path}: cannot read verdicts: {str(err).splitlines()[0]}") from None
    if isinstance(doc, list):  # written before pre-registration was recorded
        return {"preregistration": None, "verdicts": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("verdicts"), list):
        raise ConfigError(f"{path}: expected {{preregistration, verdicts: [...]}}")
    return doc


def _num(x: Any) -> float:
    return math.nan if x is None else float(x)


def _same(stored: Any, fresh: Any) -> bool:
    """Numbers equal within TOL (NaN equals NaN; None is NaN), sequences element-wise, anything else exactly."""
    if isinstance(fresh, (tuple, list)) or isinstance(stored, (tuple, list)):
        if stored is None or fresh is None:
            return stored is None and fresh is None
        return len(stored) == len(fresh) and all(_same(s, f) for s, f in zip(stored, fresh))
    if isinstance(fresh, bool) or isinstance(stored, bool):
        return bool(stored) == bool(fresh)
    if isinstance(fresh, (int, float)) or isinstance(stored, (int, float)) or stored is None:
        s, f = _num(stored), _num(fresh)
        return (math.isnan(s) and math.isnan(f)) or abs(s - f) <= TOL
    return stored == fresh


def _label(r: dict[str, Any]) -> str:
    role = r.get("role", "primary")
    return f"{r.get('claim')} / {r.get('regime')} / {r.get('a')} vs {r.get('b')} / {r.get('metric')} ({role})"


def recompute(r: dict[str, Any]) -> PairedResult:
    """The paired result of one record, recomputed from its ``values_a`` / ``values_b``."""
    boot = 2000 if r.get("boot_ci") is not None else 0
    return paired(
        [_num(v) for v in r["values_a"]],
        [_num(v) for v in r["values_b"]],
        margin=r.get("margin"),
        alpha=float(r.get("alpha", 0.05)),
        bootstrap=boot,
    )


def _seed_problems(doc: dict[str, Any], r: dict[str, Any]) -> list[str]:
    seeds = r.get("seeds")
    if seeds is None:
        return []
    if len(seeds) != len(r["values_a"]) or len(seeds) != len(r["values_b"]):
        return [f"{_label(r)}: {len(seeds)} seeds for {len(r['values_a'])} / {len(r['values_b'])} values"]
    allowed = set((doc.get("preregistration") or {}).get("seeds") or [])
    allowed |= set((r.get("baseline") or {}).get("selection_seeds") or [])
    stray = sorted(set(seeds) - allowed) if allowed else []
    return [f"{_label(r)}: seeds {stray} are not in the file's pre-registration"] if stray else []


def _when(text: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return None


def check_runs(doc: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(problems, notes) of the file's run records and the pre-registration time check."""
    runs, pre = doc.get("runs"), doc.get("preregistration") or {}
    if runs is None:
        reason = doc.get("runs_reason")
        if not reason:
            return ["no run records (`runs`) and no `runs_reason` saying why"], []
        return [], [f"run times not recorded: {reason}"]
    problems: list[str] = []
    starts = []
    for i, run in enumerate(runs):
        start, end = _when(run.get("started_at")), _when(run.get("ended_at"))
        where = f"runs[{i}] ({run.get('regime')}/{run.get('objective')}/seed {run.get('seed')})"
        if start is None or end is None:
            problems.append(f"{where}: started_at / ended_at missing or not ISO 8601")
            continue
        if end < start:
            problems.append(f"{where}: ended_at {run['ended_at']} is before started_at {run['started_at']}")
        starts.append((start, run["started_at"]))
    if not starts:
        return problems, ["no run start times recorded"]
    first, first_text = min(starts)
    # an amended file: its runs were declared under the version before the amendments (registered_at)
    declared = (pre.get("registered_at") or pre.get("committed_at")) if pre else None
    committed = _when(declared) if declared else None
    what = "declared (before its amendments)" if pre and pre.get("registered_at") else "committed"
    if pre and not pre.get("exploratory", True) and committed is not None:
        if first < committed:
            problems.append(f"the earliest run started at {first_text}, before the study file was {what} ({declared})")
        else:
            gap = (first - committed).total_seconds()
            return problems, [f"{what} {declared}, earliest run start {first_text} ({gap:.0f} s later)"]
    return problems, [f"earliest run start {first_text} (no confirmatory commit time to compare with)"]


def check_superseded(path: Path, records: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """(problems, notes) of the file's ``superseded`` marks against the record file's amendments."""
    marked = [r for r in records if r.get("superseded") is not None]
    problems = [
        f"{_label(r)}: superseded mark needs by, date, why"
        for r in marked
        if not isinstance(r["superseded"], dict) or not all(r["superseded"].get(k) for k in ("by", "date", "why"))
    ]
    ledger = records_for(path)
    if ledger is not None:
        problems += superseded_problems(Path(path).name.removesuffix(".verdicts.json"), records, ledger)
    by = sorted({str(r["superseded"].get("by")) for r in marked if isinstance(r["superseded"], dict)})
    notes = [f"{len(marked)} superseded by {', '.join(by)} (a recorded amendment)"] if marked else []
    return problems, notes


def check_file(path: Path) -> tuple[list[str], list[str]]:
    """(problems, notes) of one verdict file: every stored statistic and verdict against its recomputation from
    the per-seed values, the seeds against the pre-registration, and the runs' start times against its commit."""
    doc = load_verdicts(path)
    records = doc["verdicts"]
    problems: list[str] = []
    notes: list[str] = []
    fresh: dict[int, PairedResult] = {}
    missing = [r for r in records if r.get("values_a") is None or r.get("values_b") is None]
    if missing and not doc.get("values_reason"):
        problems += [f"{_label(r)}: no per-seed values and no `values_reason` saying why" for r in missing]
    elif missing:
        notes.append(f"{len(missing)} of {len(records)} verdicts without per-seed values: {doc['values_reason']}")
    for i, r in enumerate(records):
        if r.get("values_a") is None or r.get("values_b") is None:
            continue
        problems += _seed_problems(doc, r)
        res = fresh[i] = recompute(r)
        new = res.to_dict()
        for key in FIELDS:
            if key == "boot_ci" and r.get("boot_ci") is None:
                continue
            if key not in r or not _same(r[key], new[key]):
                problems.append(f"{_label(r)}: {key} stored {r.get(key)!r}, recomputed {new[key]!r}")
    for role in ("primary", "secondary"):
        family = [i for i, r in enumerate(records) if r.get("role", "primary") == role]
        if not family or any(i not in fresh for i in family):
            continue  # a family with an unverifiable member cannot be re-adjusted
        alpha = float(records[family[0]].get("alpha", 0.05))
        decided = decide_family([records[i]["kind"] for i in family], [fresh[i] for i in family], alpha=alpha)
        for i, (p_adj, verdict) in zip(family, decided):
            r = records[i]
            if not _same(r.get("p_adj"), p_adj):
                problems.append(f"{_label(r)}: p_adj stored {r.get('p_adj')!r}, recomputed {p_adj!r}")
            if r.get("verdict") != verdict:
                problems.append(f"{_label(r)}: verdict stored {r.get('verdict')!r}, recomputed {verdict!r}")
    checked = len(fresh)
    notes.insert(0, f"{checked} of {len(records)} verdicts recomputed from their per-seed values")
    status_problems, status_notes = check_status(path, doc)
    run_problems, run_notes = check_runs(doc)
    sup_problems, sup_notes = check_superseded(path, records)
    problems += status_problems + run_problems + sup_problems
    return problems, notes[:1] + status_notes + notes[1:] + run_notes + sup_notes


def check_status(path: Path, doc: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(problems, notes) of the study's status in the record file (pooled / failed-bite / exploratory /
    superseded: :func:`p3o.experiments.stats.ledger.study_status`) and of the file's ``relabelled`` entries (each
    names an amendment of the analysis rules the record file holds)."""
    ledger = records_for(path)
    pre = doc.get("preregistration") or {}
    confirmatory = bool(pre) and not pre.get("exploratory", True)
    name = Path(path).name.removesuffix(".verdicts.json")
    status, why = study_status(ledger, name, confirmatory, path)
    problems = []
    if status == "pooled" and not confirmatory and doc.get("verdicts"):
        problems.append("the ledger says pooled, but the file is not confirmatory (exploratory or not registered)")
    notes = [f"status: {STATUSES[status]}" + (f" ({why})" if why and status != "pooled" else "")]
    bias = peak_bias(doc, study_entry(ledger, name, path))
    if bias is not None:
        notes.append(bias["text"])
    label = base_label(doc, study_instrument(path))
    if label is not None:
        notes.append(label)
    known = {str(r.get("id")) for r in ledger.rules} if ledger is not None else None
    for entry in doc.get("relabelled") or []:
        rid = str(entry.get("rule")) if isinstance(entry, dict) else str(entry)
        if known is not None and rid not in known:
            problems.append(f"relabelled under rule {rid!r}, which the record file's rules do not hold")
        else:
            changed = entry.get("changed") if isinstance(entry, dict) else None
            what = f" ({changed} labels changed)" if changed else ""
            notes.append(f"relabelled under rule amendment {rid}{what}")
    return problems, notes


def main(argv: list[str]) -> int:
    """``p3o compare --check FILE [FILE ...]``: 0 when every file recomputes, 1 on any difference, 2 on bad input."""
    if not argv or any(a.startswith("-") for a in argv):
        print("p3o compare: error: usage: p3o compare --check FILE.verdicts.json [FILE ...]", file=sys.stderr)
        return 2
    bad = 0
    for name in argv:
        try:
            problems, notes = check_file(Path(name))
        except ConfigError as err:
            print(f"p3o compare: error: {err}", file=sys.stderr)
            return 2
        status = "OK" if not problems else f"{len(problems)} difference(s)"
        print(f"{name}: {status}; " + "; ".join(notes))
        for p in problems[:SHOW]:
            print(f"  {name}: {p}")
        if len(problems) > SHOW:
            print(f"  {name}: ... and {len(problems) - SHOW} more")
        bad += bool(problems)
    return 1 if bad else 0
