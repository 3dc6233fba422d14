"""Pre-registration, enforced: an experiment file is committed before its confirmatory runs, its hash and commit go
into the verdicts, and confirmatory seeds are fresh.

Every ``*.verdicts.json`` carries a top-level ``preregistration`` record (:class:`Preregistration`): the experiment
file's sha256, the commit that last changed it and that commit's time, the seeds, and whether the run was
exploratory. A study's out_dir keeps a ledger, ``out_dir/preregistration.jsonl``, one line per invocation that may
train (written before any run starts): the study name, the digest of its decision rule (:func:`decision_digest`:
the claims, the primary metric, α and the margins), the seeds, the file's hash and commit, exploratory or not.

A confirmatory report (no ``--exploratory``) is refused, with one line naming the file or the out_dir, when

- the experiment file has uncommitted changes (``git status`` of that path), or is not in a git repository;
- the out_dir holds runs made from another version of the decision rule (a ledger line with another digest), or
  runs with no ledger at all;
- its seeds overlap the seeds of an exploratory run of the same study that the out_dir has seen;
- a seed was used by another study with an overlapping comparison (the one seed ledger across studies,
  :mod:`p3o.experiments.stats.ledger`), unless recorded as a look at this study;
- the file changed after its confirmatory results without a recorded amendment chain (the amendments that apply are
  kept in the record's ``amendments`` and listed in the report).

    pre = preregister(exp.source, exp.out_dir, exp.name, digest, exp.seeds, exploratory=False, runs_exist=True)
    record(exp.out_dir, exp.name, digest, pre)       # before training: the out_dir remembers what made its runs
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from p3o.errors import ConfigError
from p3o.experiments.stats.ledger import check_amendments, check_seeds, first_registration, results_of

LEDGER = "preregistration.jsonl"


@dataclass
class Preregistration:
    """What a verdict file says about how its study was declared (top-level key ``preregistration``)."""

    sha256: str
    """sha256 of the experiment file's bytes."""
    commit: str | None
    """The commit that last changed the file (None: not committed)."""
    committed_at: str | None
    """That commit's time (ISO 8601, committer date)."""
    seeds: list[int]
    exploratory: bool
    amendments: list[dict[str, Any]] = field(default_factory=list)
    """Recorded amendments of the file since its earlier confirmatory results (what, when, why)."""
    registered_at: str | None = None
    """With amendments: the commit time of the version the earlier results were declared under (their verdict
    file's own ``registered_at`` or ``committed_at``). Runs made before the amendments are checked against it."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON record (the field order above; ``amendments`` and ``registered_at`` only with amendments)."""
        out = dataclasses.asdict(self)
        if not self.amendments:
            out.pop("amendments")
        if self.registered_at is None:
            out.pop("registered_at")
        return out

    def lines(self, path: str | Path | None) -> list[str]:
        """The report's "Pre-registration" section (markdown lines)."""
        where = f"`{path}`" if path else "the experiment file"
        if self.commit:
            when = f"last changed in commit `{self.commit[:12]}` ({self.committed_at})"
            if self.registered_at:
                when += f"; its results were declared under the version committed {self.registered_at}"
        else:
            when = "not committed"
        mode = (
            "**exploratory** — the tool did not check that the study was declared before its runs; every verdict "
            "below is marked exploratory and the README block leaves it out"
            if self.exploratory
            else "confirmatory — the file was committed and unchanged, the out_dir's runs were made from this "
            "decision rule, and the seeds are disjoint from every exploratory run of this study the out_dir has seen"
        )
        return [
            "## Pre-registration",
            "",
            f"- Experiment file {where}: sha256 `{self.sha256}`, {when}",
            f"- Seeds: {', '.join(map(str, self.seeds))}",
            f"- Mode: {mode}",
            *[
                f"- Amendment ({a.get('date')}, commit `{str(a.get('commit'))[:12]}`): {a.get('what')} "
                f"— {a.get('why')}"
                for a in self.amendments
            ],
            "",
        ]


def decision_digest(rule: Any) -> str:
    """sha256 of the decision rule's canonical JSON (``rule``: dataclasses / dicts / lists of the claims, the
    primary block and any baseline family). Two versions of a study with the same digest decide identically."""

    def plain(x: Any) -> Any:
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            return plain(dataclasses.asdict(x))
        if isinstance(x, dict):
            return {str(k): plain(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [plain(v) for v in x]
        if isinstance(x, Path):
            return str(x)
        return x

    text = json.dumps(plain(rule), sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _git(path: Path, *args: str) -> tuple[int, str]:
    try:
        proc = subprocess.run(
            ["git", "-C", str(path.parent.resolve()), *args], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return 1, ""
    return proc.returncode, proc.stdout.strip()


def file_state(path: str | Path) -> tuple[str, str | None, str | None, str | None]:
    """(sha256, last commit, its time, problem) of an experiment file; problem is None when the file is committed
    and unchanged, else a phrase ("has uncommitted changes", "is not committed", "is not in a git repository")."""
    path = Path(path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    rc, status = _git(path, "status", "--porcelain", "--", path.name)
    if rc != 0:
        return digest, None, None, "is not in a git repository"
    rc, log = _git(path, "log", "-1", "--format=%H%n%cI", "--", path.name)
    commit, when = [*log.splitlines(), None, None][:2] if rc == 0 and log else (None, None)
    if commit is None:
        return digest, None, None, "is not committed"
    if status:
        return digest, commit, when, "has uncommitted changes"
    return digest, commit, when, None


def read_ledger(out_dir: Path) -> list[dict[str, Any]]:
    """The ledger lines of ``out_dir`` (empty when there is none)."""
    path = Path(out_dir) / LEDGER
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def preregister(
    path: str | Path,
    out_dir: Path,
    name: str,
    digest: str,
    seeds: Sequence[int],
    *,
    exploratory: bool,
    runs_exist: bool,
    report: Path | None = None,
) -> Preregistration:
    """Check that a confirmatory study may report from ``out_dir`` (ConfigError, one line, otherwise) and return
    its :class:`Preregistration`. ``runs_exist``: the out_dir already holds runs (or cells) of the study;
    ``report``: the report to write (its verdict file, if any, holds earlier results)."""
    sha, commit, when, problem = file_state(path)
    pre = Preregistration(sha, commit, when, [int(s) for s in seeds], exploratory)
    if exploratory:
        return pre
    if problem:
        raise ConfigError(f"{path} {problem}: commit it before a confirmatory run (or pass --exploratory)")
    mine = [e for e in read_ledger(out_dir) if e.get("study") == name]
    if runs_exist and not mine:
        raise ConfigError(
            f"{out_dir} holds runs with no pre-registration record: use a fresh out_dir (or pass --exploratory)"
        )
    other = next((e for e in mine if e.get("digest") != digest), None)
    if other is not None:
        raise ConfigError(
            f"{out_dir} holds runs made from another version of the claims, primary metric or margins (file commit "
            f"{str(other.get('commit'))[:12]}): use a fresh out_dir (or pass --exploratory)"
        )
    used = sorted({int(s) for e in mine if e.get("exploratory") for s in e.get("seeds", [])} & set(pre.seeds))
    if used:
        raise ConfigError(
            f"seeds {used} were used by an exploratory run of study '{name}' in {out_dir}: a confirmatory run "
            "needs fresh seeds"
        )
    check_seeds(path, name, pre.seeds)
    results = results_of(path, name, report)
    pre.amendments = check_amendments(path, name, sha, results)
    if pre.amendments:
        pre.registered_at = first_registration(results)
    return pre


def record(out_dir: Path, name: str, digest: str, pre: Preregistration) -> None:
    """Append this invocation to the out_dir's ledger (before any run starts)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    line = {"study": name, "digest": digest, **pre.to_dict()}
    with open(out_dir / LEDGER, "a") as fh:
        fh.write(json.dumps(line) + "\n")


def verdict_file(
    pre: Preregistration | None,
    records: list[dict[str, Any]],
    *,
    runs: list[dict[str, Any]] | None = None,
    runs_reason: str | None = None,
) -> str:
    """The text of a ``*.verdicts.json``: ``{"preregistration": ..., "runs": [...], "verdicts": [...]}``.

    ``runs``: one record per run or cell (``started_at`` / ``ended_at`` ISO 8601, ``wall_s``, ``cpu``,
    ``base_key``, ...), which ``p3o compare --check`` compares with the study file's commit time; None with
    ``runs_reason`` saying why they are not there."""
    doc: dict[str, Any] = {"preregistration": None if pre is None else pre.to_dict(), "runs": runs}
    if runs is None:
        doc["runs_reason"] = runs_reason or "the writer of this file did not record its runs"
    doc["verdicts"] = records
    return json.dumps(doc, indent=1, default=float) + "\n"
