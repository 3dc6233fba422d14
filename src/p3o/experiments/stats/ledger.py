"""One seed ledger across studies, and amendments: what makes a confirmatory study's seeds fresh and its file its own.

The ledger is every seed any run of any study used, on one instrument (``lm`` or ``synthetic``), with the objectives
it compared:

- every study file under the studies root (``configs/experiments/**``, ``records/`` excluded): its ``seeds`` (a list,
  or a count from ``base.seed_offset``) and its baseline families' ``selection_seeds``;
- the by-hand entries of the record file ``<root>/records/ledger.yaml`` (``seeds:``): runs made outside a study file
  (an earlier run, a rerun on other seeds, an exploratory look from the command line).

A confirmatory study may not use a seed that another study used with an overlapping comparison — the two share a
compared objective (the objectives of its claims, baseline families expanded; all its objectives when it has no
claims) — unless the record file lists that use as a ``look`` at this study (a look at a running confirmatory study
is legitimate only when recorded as such):

    check_seeds(study_path, "stale", [300, 301, 302])   # ConfigError naming the other study, or None

A study file whose bytes changed after its confirmatory results (the sha256 its verdict file recorded) needs recorded
amendments, each ``{study, from, to, date, commit, what, why}`` with sha256s ``from`` → ``to``, chaining the recorded
bytes to the current ones; otherwise ``p3o compare`` exits 2 with one line (:func:`check_amendments`).

A verdict that a later study re-decided (its comparison was not the claim's: a wrong baseline, a wrong ablation) is
**superseded** by a recorded amendment ``{study, file, verdicts, by, by_commit, date, what, why}``: ``verdicts``
lists keys ``{claim, regime?, a?, b?}`` into the study's verdict file (every role matches), ``by`` names the
superseding study. The verdicts stay in their file, each marked ``"superseded": {by, date, why}``
(:func:`mark_superseded`; ``python -m p3o.experiments.stats.supersede FILE``), and leave the pooled
Holm family of the summary; ``p3o compare --check`` refuses a marking the record file does not hold, and the reverse
(:func:`superseded_problems`).

An LM verdict file whose runs started from a base each machine built for itself (every study before the base
shipped in the package, `p3o.models.bases`) is labelled by what it keeps (:func:`base_label`, from its run records: a
run since then records ``base_key`` ``<name>@<sha256>``): **per-CPU base, per-seed values kept** when every verdict
keeps its per-seed values (``p3o compare --check`` recomputes them), else **summary statistics only**; its recorded
statistics stand under its status (pooled ones stay pooled) and it is not rerun; ``p3o compare --check`` says so.

Each study's **status** is recorded too (``studies:``): ``pooled`` (a confirmatory study whose primary verdicts join
the one pooled Holm family of the summary), ``failed-bite`` (a confirmatory study that failed its pre-registered bite
condition: reported, never pooled), ``exploratory``, ``superseded`` (a whole study re-decided by a later one) or
``replication`` (a rerun of a study, one verdict file named by ``file``, reported beside it). The
summary reads the pooled family from it (:func:`study_status`), never from a hand-typed list of files: a confirmatory
verdict file the record file does not list is refused in one line (``p3o compare --check`` and the page build).

An amendment of the **analysis rules** themselves (``rules:``, ``{id, date, commit, what, why}``) is recorded once for
every study; ``python -m p3o.experiments.stats.relabel --rule ID FILE ...`` re-takes every verdict of the files under
today's rules and writes them (the label a report printed is kept as ``verdict_report``), naming the rule in the
file's ``relabelled`` list.

Record file (``configs/experiments/records/ledger.yaml``)::

    seeds:       [{study, instrument, seeds, objectives | like, note}]    # objectives ["*"]: any comparison
    amendments:  [{study, file, from, to, date, commit, what, why}]
    looks:       [{study, look, file, seeds, date, commit, what, why}]
    superseded:  [{study, file, verdicts: [{claim, regime?, a?, b?}], by, by_commit, date, what, why}]
    rules:       [{id, date, commit, what, why}]
    studies:     [{study, file?, status, why, selection_bias?}]   # status: pooled | failed-bite | exploratory |
                                                                  # superseded | replication
                 # selection_bias: {metric, n_problems, why}: a peak metric chosen and scored on the same
                 # evaluations, no checkpoints to re-decide it (p3o.experiments.stats.bias)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from p3o.errors import ConfigError

RECORDS = Path("records") / "ledger.yaml"


@dataclass
class SeedUse:
    """Seeds one study (or one by-hand run) used on one instrument, and the objectives it compared."""

    study: str
    instrument: str
    seeds: set[int]
    objectives: set[str]
    """Compared objective labels; ``{"*"}`` overlaps any comparison."""
    source: str
    """Where the use is declared (the study file, or the record file)."""

    def overlaps(self, objectives: set[str]) -> set[str]:
        """The compared objectives both share (every one of ``objectives`` when this use is ``*``)."""
        return set(objectives) if "*" in self.objectives else self.objectives & set(objectives)


@dataclass
class Records:
    """The record file: by-hand seed uses, amendments of study files, recorded looks."""

    seeds: list[dict[str, Any]] = field(default_factory=list)
    amendments: list[dict[str, Any]] = field(default_factory=list)
    looks: list[dict[str, Any]] = field(default_factory=list)
    superseded: list[dict[str, Any]] = field(default_factory=list)
    rules: list[dict[str, Any]] = field(default_factory=list)
    studies: list[dict[str, Any]] = field(default_factory=list)


#: The record file's keys, in the order they are written.
KEYS = ("seeds", "amendments", "looks", "superseded", "rules", "studies")
#: A study's recorded status, and how the pages say it.
STATUSES = {
    "pooled": "pooled",
    "failed-bite": "failed its bite condition (reported, not pooled)",
    "exploratory": "exploratory (not pooled)",
    "superseded": "superseded by a later study (not pooled)",
    "replication": "a rerun of a study, reported beside it (not pooled)",
}
#: What an amendment that supersedes verdicts must record.
SUPERSEDED_FIELDS = ("study", "file", "verdicts", "by", "date", "what", "why")
#: The verdict-record fields a ``superseded`` key may name.
SUPERSEDED_KEYS = ("claim", "regime", "a", "b")


def shown(path: Path, root: Path) -> str:
    """``path`` as messages print it: relative to the repository when ``root`` is its configs/experiments."""
    base = root.parent.parent if root.name == "experiments" and root.parent.name == "configs" else root
    try:
        return str(path.resolve().relative_to(base.resolve()))
    except ValueError:
        return str(path)


def studies_root(path: str | Path) -> Path:
    """The studies root of a study file: its nearest ancestor ``configs/experiments``, else its own directory."""
    path = Path(path).resolve()
    return next((p for p in path.parents if p.name == "experiments" and p.parent.name == "configs"), path.parent)


def load_records(root: Path) -> Records:
    """The record file under ``root`` (empty when absent; ConfigError naming it when malformed)."""
    path = root / RECORDS
    if not path.is_file():
        return Records()
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {str(err).splitlines()[0]}") from None
    if not isinstance(raw, dict) or set(raw) - set(KEYS):
        raise ConfigError(f"{path}: expected the keys {', '.join(KEYS)}")
    records = Records(**{k: list(raw.get(k) or []) for k in KEYS})
    for i, entry in enumerate(records.studies):
        if not isinstance(entry, dict) or not entry.get("study") or entry.get("status") not in STATUSES:
            raise ConfigError(f"{path}: studies[{i}] needs study and status (one of {', '.join(STATUSES)})")
        if entry["status"] != "pooled" and not entry.get("why"):
            raise ConfigError(f"{path}: studies[{i}] ({entry['study']}): a status other than pooled needs why")
    for i, entry in enumerate(records.rules):
        missing = [k for k in ("id", "date", "what", "why") if not isinstance(entry, dict) or not entry.get(k)]
        if missing:
            raise ConfigError(f"{path}: rules[{i}] needs {', '.join(missing)}")
    for i, entry in enumerate(records.superseded):
        missing = [k for k in SUPERSEDED_FIELDS if not isinstance(entry, dict) or not entry.get(k)]
        keys = entry.get("verdicts") if isinstance(entry, dict) else None
        if missing or not isinstance(keys, list):
            raise ConfigError(f"{path}: superseded[{i}] needs {', '.join(missing or ['verdicts: [...]'])}")
        for key in keys:
            if not isinstance(key, dict) or "claim" not in key or set(key) - set(SUPERSEDED_KEYS):
                raise ConfigError(f"{path}: superseded[{i}].verdicts: each is {{claim, regime?, a?, b?}}, got {key!r}")
    return records


def _seed_list(raw: dict[str, Any]) -> list[int]:
    seeds = raw.get("seeds", [])
    if isinstance(seeds, int):
        offset = int((raw.get("base") or {}).get("seed_offset", 0)) if raw.get("instrument") == "synthetic" else 0
        return list(range(offset, offset + seeds))
    return [int(s) for s in seeds or []]


def _label(entry: Any) -> str:
    return str(entry.get("label", entry.get("preset", ""))) if isinstance(entry, dict) else str(entry)


def study_use(path: Path, root: Path) -> SeedUse | None:
    """The seeds a study file declares and the objectives it compares (None: not a study file)."""
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return None
    if not isinstance(raw, dict) or "name" not in raw or "seeds" not in raw:
        return None
    families = {k: v for k, v in (raw.get("baselines") or {}).items() if isinstance(v, dict)}
    seeds = _seed_list(raw) + [int(s) for f in families.values() for s in f.get("selection_seeds") or []]
    compared = {
        m
        for claim in raw.get("claims") or []
        for o in claim.get("objectives") or []
        for m in (families[o].get("members", []) if o in families else [o])
    }
    if not compared:
        cells = [o for c in raw.get("cells") or [] for o in c.get("objectives") or []]
        compared = {_label(o) for o in [*(raw.get("objectives") or []), *cells]}
    instrument = str(raw.get("instrument", "lm"))
    return SeedUse(str(raw["name"]), instrument, set(seeds), {str(o) for o in compared}, shown(path, root))


def ledger(root: Path, records: Records | None = None) -> list[SeedUse]:
    """Every seed use: the study files under ``root`` (sorted by path) and the record file's by-hand entries."""
    records = load_records(root) if records is None else records
    files = sorted(p for p in root.rglob("*.yaml") if RECORDS.parts[0] not in p.relative_to(root).parts)
    uses = [u for u in (study_use(p, root) for p in files) if u is not None]
    by_name = {u.study: u for u in uses}
    for entry in records.seeds:
        like = by_name.get(str(entry.get("like", "")))
        objectives = set(map(str, entry.get("objectives") or [])) or (like.objectives if like else {"*"})
        uses.append(
            SeedUse(
                str(entry["study"]),
                str(entry.get("instrument", like.instrument if like else "lm")),
                {int(s) for s in entry.get("seeds", [])},
                objectives,
                shown(root / RECORDS, root),
            )
        )
    return uses


def check_seeds(path: str | Path, name: str, seeds: list[int]) -> None:
    """ConfigError (one line naming the other study) when a seed of confirmatory study ``name`` (file ``path``) was
    used by another study with an overlapping comparison and no recorded look at ``name`` covers it."""
    root = studies_root(path)
    records = load_records(root)
    uses = ledger(root, records)
    mine = next((u for u in uses if u.study == name and u.source != shown(root / RECORDS, root)), None)
    if mine is None:
        mine = study_use(Path(path).resolve(), root) or SeedUse(name, "lm", set(seeds), {"*"}, str(path))
    looked = {
        (str(k.get("look")), int(s)) for k in records.looks if k.get("study") == name for s in k.get("seeds", [])
    }
    for use in uses:
        if use.study == name or use.instrument != mine.instrument:
            continue
        clash = sorted(s for s in use.seeds & set(seeds) if (use.study, s) not in looked)
        shared = use.overlaps(mine.objectives)
        if clash and shared:
            raise ConfigError(
                f"seeds {clash} were used by study '{use.study}' ({use.source}) comparing "
                f"{', '.join(sorted(shared))}: a confirmatory run needs fresh seeds (or a look recorded in "
                f"{shown(root / RECORDS, root)})"
            )


def _preregistration_of(verdicts: Path) -> dict[str, Any] | None:
    """The ``preregistration`` record of a confirmatory verdict file; None when unreadable, absent or exploratory."""
    try:
        doc = json.loads(verdicts.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    pre = doc.get("preregistration") if isinstance(doc, dict) else None
    return pre if isinstance(pre, dict) and not pre.get("exploratory", True) else None


def _sha_of(verdicts: Path) -> str | None:
    """sha256 of the version a confirmatory verdict file's results were declared under: the recorded sha256, or,
    when the file already lists amendments, the first one's ``from`` (so that writing the report again keeps the whole
    chain); None when the file is not a confirmatory verdict file."""
    pre = _preregistration_of(verdicts)
    if pre is None:
        return None
    amended = pre.get("amendments")
    first = amended[0].get("from") if isinstance(amended, list) and amended and isinstance(amended[0], dict) else None
    return first or pre.get("sha256")


def first_registration(results: list[Path]) -> str | None:
    """When the study's earlier confirmatory results were declared: the first of ``results`` that is a confirmatory
    verdict file gives its ``registered_at`` (itself amended before) or else its ``committed_at``; None if none."""
    for verdicts in results:
        pre = _preregistration_of(verdicts)
        if pre is not None:
            return pre.get("registered_at") or pre.get("committed_at")
    return None


def amendment_chain(records: Records, name: str, start: str, end: str) -> list[dict[str, Any]] | None:
    """The recorded amendments of study ``name`` leading from sha256 ``start`` to ``end`` ([] when equal; None when
    the chain breaks)."""
    chain: list[dict[str, Any]] = []
    here = start
    steps = [a for a in records.amendments if a.get("study") == name]
    for _ in range(len(steps) + 1):  # each amendment is used once at most
        if here == end:
            return chain
        nxt = next((a for a in steps if a.get("from") == here and a not in chain), None)
        if nxt is None:
            return None
        chain.append(nxt)
        here = str(nxt.get("to"))
    return None


def check_amendments(path: str | Path, name: str, sha256: str, results: list[Path]) -> list[dict[str, Any]]:
    """The amendments that bring the confirmatory results of ``name`` (the first of ``results`` that exists) to the
    file's current bytes; ConfigError (one line) when the file changed after them and no amendment chain is
    recorded."""
    root = studies_root(path)
    for verdicts in results:
        recorded = _sha_of(verdicts)
        if recorded is None:
            continue
        chain = amendment_chain(load_records(root), name, recorded, sha256)
        if chain is None:
            raise ConfigError(
                f"{path} changed after its results ({verdicts} records sha256 {recorded[:12]}…): record an amendment "
                f"(what changed, when, why; sha256 from → to) in {shown(root / RECORDS, root)}"
            )
        return chain
    return []


def results_of(path: str | Path, name: str, report: Path | None = None) -> list[Path]:
    """Where a study's results may be: next to ``report`` and ``<repo>/docs/results/<name>.verdicts.json``."""
    root = studies_root(path)
    found = [report.with_suffix(".verdicts.json")] if report is not None else []
    if root.name == "experiments" and root.parent.name == "configs":
        found.append(root.parent.parent / "docs" / "results" / f"{name}.verdicts.json")
    return found


def superseding(records: Records, study: str, record: dict[str, Any]) -> dict[str, Any] | None:
    """The recorded amendment that supersedes verdict ``record`` of study ``study`` (None: not superseded)."""
    for entry in records.superseded:
        if entry["study"] != study:
            continue
        for key in entry["verdicts"]:
            if all(record.get(k) == v for k, v in key.items()):
                return entry
    return None


def superseded_mark(entry: dict[str, Any]) -> dict[str, str]:
    """What a superseded verdict record carries: ``{by, date, why}`` of its amendment."""
    return {"by": str(entry["by"]), "date": str(entry["date"]), "why": " ".join(str(entry["why"]).split())}


def superseded_problems(study: str, verdicts: list[dict[str, Any]], records: Records) -> list[str]:
    """Every disagreement between the ``superseded`` marks of a study's verdict records and the record file: a mark
    no amendment records, an amendment's verdict without (or with another) mark, an amendment key that names no
    verdict."""
    out = []
    for r in verdicts:
        entry = superseding(records, study, r)
        want = superseded_mark(entry) if entry else None
        if r.get("superseded") != want:
            where = f"{r.get('claim')} / {r.get('a')} vs {r.get('b')} ({r.get('role', 'primary')})"
            if want is None:
                out.append(f"{where}: marked superseded, but {RECORDS} records no such amendment")
            else:
                out.append(
                    f"{where}: {RECORDS} supersedes it by {want['by']}; the file's mark is {r.get('superseded')!r}"
                )
    for entry in records.superseded:
        if entry["study"] != study:
            continue
        for key in entry["verdicts"]:
            if not any(all(r.get(k) == v for k, v in key.items()) for r in verdicts):
                out.append(f"{RECORDS}: superseded key {key} names no verdict of {study}")
    return out


def mark_superseded(path: Path, root: Path) -> int:
    """Write each verdict record's ``superseded`` mark of verdict file ``path`` from the record file under ``root``
    (a record no amendment names loses its mark); the file is rewritten as ``p3o compare`` writes it. Returns how
    many records are marked."""
    doc = json.loads(path.read_text())
    verdicts = doc if isinstance(doc, list) else doc.get("verdicts")
    if not isinstance(verdicts, list):
        raise ConfigError(f"{path}: expected {{preregistration, verdicts: [...]}}")
    records = load_records(root)
    study = path.name.removesuffix(".verdicts.json")
    marked = 0
    for r in verdicts:
        entry = superseding(records, study, r)
        r.pop("superseded", None)
        if entry is not None:
            r["superseded"] = superseded_mark(entry)
            marked += 1
    unknown = [p for p in superseded_problems(study, verdicts, records) if "names no verdict" in p]
    if unknown:
        raise ConfigError(unknown[0])
    path.write_text(json.dumps(doc, indent=1, default=float) + "\n")
    return marked


def records_for(path: str | Path) -> Records | None:
    """The record file of the repository that holds ``path`` (None outside one: no ``configs/experiments`` above)."""
    repo = repo_of(path)
    return load_records(repo / "configs" / "experiments") if repo is not None else None


def repo_of(path: str | Path) -> Path | None:
    """The repository that holds ``path``: its nearest ancestor with ``configs/experiments`` (None: none)."""
    return next((p for p in Path(path).resolve().parents if (p / "configs" / "experiments").is_dir()), None)


def study_entry(records: Records | None, study: str, file: str | Path | None = None) -> dict[str, Any] | None:
    """The record file's ``studies`` entry of ``study``: the one naming ``file`` (relative to the repository) first,
    else the study's entry without a file (None: not recorded)."""
    entries = [e for e in (records.studies if records is not None else []) if e["study"] == study]
    repo = repo_of(file) if file is not None else None
    here = str(Path(file).resolve().relative_to(repo)) if repo is not None and file is not None else None
    mine = [e for e in entries if e.get("file") == here] or [e for e in entries if not e.get("file")]
    return mine[0] if mine else None


_PER_CPU_WHY = (
    "its runs started from a base each machine built for itself before the base shipped in the package "
    "(p3o.models.bases; AVX2 and AVX-512 CPUs built different ones): the statistics it recorded stand under its "
    "status as they are (pooled ones stay pooled) and it is not rerun; new studies start from the shipped base"
)
#: The label of an LM verdict file whose runs did not start from a shipped base and whose verdicts do not all keep
#: their per-seed values (`base_label`).
PER_CPU_BASE = "summary statistics only: " + _PER_CPU_WHY
#: The label of an LM verdict file whose runs did not start from a shipped base but whose every verdict keeps its
#: per-seed values, so ``p3o compare --check`` recomputes it (`base_label`).
PER_CPU_KEPT = "per-CPU base, per-seed values kept: " + _PER_CPU_WHY + "; every verdict is recomputed from its values"


def study_instrument(path: str | Path) -> str:
    """The ``instrument`` of a verdict file's study file (``configs/experiments/**/<study>.yaml`` of its repository):
    "lm" when the file says none, or when no study file is found."""
    repo, name = repo_of(path), Path(path).name.removesuffix(".verdicts.json")
    found = sorted((repo / "configs" / "experiments").rglob(f"{name}.yaml")) if repo is not None else []
    try:
        raw = yaml.safe_load(found[0].read_text()) if found else None
    except (OSError, yaml.YAMLError):
        raw = None
    return str(raw.get("instrument", "lm")) if isinstance(raw, dict) else "lm"


def keeps_values(doc: dict[str, Any]) -> bool:
    """Every verdict of the file keeps its per-seed values (``values_a`` and ``values_b``; False without verdicts)."""
    verdicts = [r for r in doc.get("verdicts") or [] if isinstance(r, dict)]
    return bool(verdicts) and all(r.get("values_a") is not None and r.get("values_b") is not None for r in verdicts)


def base_label(doc: dict[str, Any], instrument: str) -> str | None:
    """For an LM verdict file unless every run it records names a shipped base (``base_key``
    ``<name>@<sha256 of the weights>``, `p3o.models.bases.base_id`: runs since the base shipped): `PER_CPU_KEPT` when
    every verdict keeps its per-seed values (:func:`keeps_values`), else `PER_CPU_BASE`; None otherwise."""
    if instrument != "lm":
        return None
    keys = [str(run.get("base_key") or "") for run in doc.get("runs") or [] if isinstance(run, dict)]
    if keys and all("@" in key for key in keys):
        return None
    return PER_CPU_KEPT if keeps_values(doc) else PER_CPU_BASE


def study_status(
    records: Records | None, study: str, confirmatory: bool, file: str | Path | None = None
) -> tuple[str, str]:
    """(status, why) of ``study`` (its verdict file ``file``) as the record file states it: an entry naming the file
    (``file:``, relative to the repository) first, else the study's entry without one. Inside a repository a
    confirmatory study the record file does not list is refused (ConfigError, one line: it would be pooled silently);
    outside one (no record file): ``pooled`` when ``confirmatory``; an unlisted exploratory one is ``exploratory``
    (the why then says it is not recorded)."""
    entry = study_entry(records, study, file)
    if entry is not None:
        return str(entry["status"]), " ".join(str(entry.get("why", "")).split())
    if confirmatory and records is not None:
        where = file if file is not None else study
        raise ConfigError(
            f"{where}: a confirmatory verdict file with no entry in the ledger ({RECORDS}, studies:): record its "
            "status (pooled, failed-bite, exploratory, superseded or replication) before it is pooled"
        )
    return ("pooled" if confirmatory else "exploratory"), "no status recorded in the ledger"


def rule(records: Records, rule_id: str) -> dict[str, Any]:
    """The recorded amendment of the analysis rules ``rule_id`` (ConfigError when the record file has none)."""
    found = next((r for r in records.rules if r.get("id") == rule_id), None)
    if found is None:
        raise ConfigError(f"{RECORDS}: no rule amendment {rule_id!r} recorded (rules: [{{id, date, what, why}}])")
    return found
