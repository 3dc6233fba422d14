"""Does a study reproduce? Its verdict file set beside a rerun of the same committed study file (same claims, seeds
and margins; another machine or another day), verdict by verdict.

A rerun is a *replication*, not a recovery of the first run's raw data: the LM testbed's warm-started base and every
float32 kernel depend on the CPU (the tiny base scored 0.586 on an AVX2 machine, 0.731 and 0.491 on two AVX-512
ones), so its numbers differ; what can reproduce is the verdict. For every primary record of the original (its
study's own Holm family, ``verdict``) the table shows both effects with their intervals and whether the verdict is
the same; a record only one file holds is listed as missing. The replication's file keeps its per-seed values and
run records, so ``p3o compare --check`` rechecks it.

    rows = compare_files(Path("docs/results/stale32-k3is.verdicts.json"),
                         Path("docs/results/replications/stale32-k3is.verdicts.json"))
    python -m p3o.experiments.stats.replication ORIGINAL RERUN [ORIGINAL RERUN ...] [--out PAGE.md]   # 2: bad input
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from p3o.errors import ConfigError
from p3o.experiments.stats.check import load_verdicts

__all__ = ["Row", "compare_files", "main", "render"]

_KEY = ("claim", "regime", "a", "b", "metric")


@dataclass(frozen=True)
class Row:
    """One primary verdict of the original and its replication (None: that file has no such record)."""

    key: tuple[str, ...]
    original: dict[str, Any] | None
    replication: dict[str, Any] | None

    @property
    def same(self) -> bool:
        """Both files hold the record and their in-study verdicts are equal."""
        if self.original is None or self.replication is None:
            return False
        return _verdict(self.original) == _verdict(self.replication)


def _verdict(rec: dict[str, Any]) -> str:
    return str(rec.get("verdict"))


def _primaries(path: Path) -> tuple[dict[str, Any], dict[tuple[str, ...], dict[str, Any]]]:
    doc = load_verdicts(path)
    recs = {
        tuple(str(r.get(k)) for k in _KEY): r
        for r in doc["verdicts"]
        if isinstance(r, dict) and r.get("role", "primary") == "primary"
    }
    return doc, recs


def compare_files(original: Path, replication: Path) -> list[Row]:
    """The primary records of both files, paired by (claim, regime, a, b, metric), in the original's order then the
    replication's extra ones. ConfigError (one line) when a file cannot be read or the two declare other seeds."""
    doc_o, recs_o = _primaries(original)
    doc_r, recs_r = _primaries(replication)
    seeds_o = (doc_o.get("preregistration") or {}).get("seeds")
    seeds_r = (doc_r.get("preregistration") or {}).get("seeds")
    if seeds_o is not None and seeds_r is not None and sorted(seeds_o) != sorted(seeds_r):
        raise ConfigError(f"{replication}: seeds {seeds_r} are not {original}'s {seeds_o}: not a rerun of its study")
    keys = [*recs_o, *(k for k in recs_r if k not in recs_o)]
    return [Row(k, recs_o.get(k), recs_r.get(k)) for k in keys]


def _effect(rec: dict[str, Any] | None) -> str:
    if rec is None:
        return "missing"
    ci = rec.get("ci") or [float("nan"), float("nan")]
    return (
        f"{rec.get('mean_a', float('nan')):.3f} vs {rec.get('mean_b', float('nan')):.3f}, "
        f"{rec.get('diff', float('nan')):+.3f} [{ci[0]:+.3f}, {ci[1]:+.3f}] **{_verdict(rec)}**"
    )


def render(rows: list[Row], original: Path, replication: Path, page_dir: Path | None = None) -> str:
    """A markdown section: one table row per primary verdict, and the count of verdicts that reproduce (links
    relative to ``page_dir``, the directory of the page it goes into; default: the current one)."""
    same = sum(r.same for r in rows)

    def link(path: Path) -> str:
        return f"[{path.name}]({Path(os.path.relpath(path, page_dir or Path.cwd())).as_posix()})"

    lines = [
        f"### `{original.name.removesuffix('.verdicts.json')}` rerun: {same} of {len(rows)} primary verdicts the same",
        "",
        f"Original {link(original)} against the rerun {link(replication)}; each cell: mean A vs mean B, "
        "A − B [95 % CI], the study's own verdict.",
        "",
        "| claim | regime | A | B | metric | original | rerun | same verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        claim, regime, a, b, metric = r.key
        mark = "yes" if r.same else "**no**"
        cells = [claim, regime, a, b, metric, _effect(r.original), _effect(r.replication), mark]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join([*lines, ""])


INTRO = (
    "A rerun of a committed study file (the same claims, seeds and margins) on another machine or day, set beside its "
    "first verdict file, verdict by verdict. On the LM testbed a rerun is a replication, not a recovery of the first "
    "run's numbers: the warm-started base and every float32 kernel depend on the CPU, so numbers move and only the "
    "verdicts can reproduce. A rerun's own verdict file keeps its per-seed values and run records (`p3o compare "
    "--check`); it is not pooled with the first run's."
)


def main(argv: list[str] | None = None) -> int:
    """``python -m p3o.experiments.stats.replication ORIGINAL RERUN [ORIGINAL RERUN ...] [--out PAGE.md]``: print
    (or write, as a page with a title and the command that made it) one table per pair; exit 0 whether or not the
    verdicts reproduce (a finding, not an error), 2 with one line on bad input."""
    argv = sys.argv[1:] if argv is None else list(argv)
    command = " ".join(["python -m p3o.experiments.stats.replication", *argv])
    out = None
    if "--out" in argv:
        i = argv.index("--out")
        out = argv[i + 1] if i + 1 < len(argv) else None
        argv = argv[:i] + argv[i + 2 :] if out is not None else ["--out"]
    if not argv or len(argv) % 2 or any(a.startswith("-") for a in argv):
        print(
            "replication: error: usage: python -m p3o.experiments.stats.replication ORIGINAL RERUN "
            "[ORIGINAL RERUN ...] [--out PAGE.md]",
            file=sys.stderr,
        )
        return 2
    page_dir = Path(out).parent if out else None
    sections = []
    try:
        for original, rerun in zip(argv[::2], argv[1::2]):
            rows = compare_files(Path(original), Path(rerun))
            sections.append(render(rows, Path(original), Path(rerun), page_dir))
    except ConfigError as err:
        print(f"replication: error: {err}", file=sys.stderr)
        return 2
    text = "\n".join(sections)
    if out is None:
        print(text, end="")
    else:
        head = f"# Reruns of committed studies\n\nGenerated by `{command}`.\n\n{INTRO}\n\n"
        Path(out).write_text(head + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
