"""Issue 53, item 1: one rule everywhere. Every per-study report (replications included) prints its verdict file's
labels and Holm p's under today's rule, states today's rule (never "an effect below δ is negligible"), keeps the
labels of an older rule only in a dated appendix, and every table of the results pages has escaped cells."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from p3o.experiments.stats.verdicts import format_p, verdict_label
from p3o.experiments.summary.pages import load
from p3o.experiments.summary.reports import main as reports_main

ROOT = Path(__file__).resolve().parents[3]
RESULTS = ROOT / "docs" / "results"
FILES = sorted([*RESULTS.glob("*.verdicts.json"), *(RESULTS / "replications").glob("*.verdicts.json")])
HEAD = "| claim | regime | A | B | test | metric | n | mean A | mean B | A − B [95% CI] | p (Holm) | verdict |"
OLD_RULE = "an effect below δ is *negligible*"


def cells(row: str) -> list[str]:
    """The cells of a Markdown table row (an escaped ``\\|`` stays inside its cell)."""
    return [c.strip() for c in re.split(r"(?<!\\)\|", row.strip())[1:-1]]


def verdict_rows(report: str) -> list[list[str]]:
    """The rows of a report's verdict table (the "Verdicts" section)."""
    section = report.split("\n## Verdicts\n", 1)[1].split("\n## ", 1)[0]
    lines = section.split("\n")
    start = lines.index(HEAD)
    return [cells(line) for line in lines[start + 2 :] if line.startswith("| ")]


def _labels(path: Path) -> list[tuple[str, str]]:
    """(p, label) of each record of a verdict file, as the reports print them."""
    doc = json.loads(path.read_text())
    out = []
    for r in doc["verdicts"]:
        shown = verdict_label(r["verdict"], r.get("role", "primary"), bool(r.get("exploratory")))
        if isinstance(r.get("superseded"), dict):
            shown += f" (superseded by {r['superseded']['by']}: not evidence)"
        out.append((format_p(float("nan") if r.get("p_adj") is None else float(r["p_adj"])), shown))
    return out


@pytest.mark.parametrize("path", [p for p in FILES if json.loads(p.read_text())["verdicts"]], ids=lambda p: p.stem)
def test_each_report_prints_its_verdict_files_labels_and_p(path: Path) -> None:
    report = path.with_name(path.name.removesuffix(".verdicts.json") + ".md").read_text()
    rows = verdict_rows(report)
    assert [(row[10], row[11]) for row in rows] == _labels(path)
    assert OLD_RULE not in report
    assert "the point estimate, not the interval, is compared with δ" in report
    body = report.split("<!-- old-labels:begin -->")[0]
    assert "printed then" not in body and "today's rule; the report says" not in body
    claims = re.findall(r"^- \*\*[^*]+\*\*(?: vs \S+)?: ([a-z]+) \(see the verdict table\)$", report, re.M)
    primary = [r["verdict"] for r in json.loads(path.read_text())["verdicts"] if r.get("role", "primary") == "primary"]
    assert sorted(claims) == sorted(primary) or not claims


def test_old_labels_live_only_in_a_dated_appendix() -> None:
    lag = (RESULTS / "lag.md").read_text()
    appendix = lag.split("<!-- old-labels:begin -->")[1]
    assert appendix.startswith("\n## Appendix: labels printed before the rule amendment `negligible-holm-tost` (2026")
    assert "| +0.008 [-0.006, +0.022] | inconclusive | **negligible** |" in appendix
    assert not any("<!-- todays-rule:begin -->" in p.read_text() for p in RESULTS.rglob("*.md"))


def test_every_results_table_has_escaped_cells() -> None:
    for page in [*RESULTS.rglob("*.md"), ROOT / "docs" / "paper-claims.md"]:
        rows: list[str] = []
        for line in [*page.read_text().split("\n"), ""]:
            if line.startswith("|"):
                rows.append(line)
                continue
            if rows:
                width = len(cells(rows[0]))
                bad = [r for r in rows if len(cells(r)) != width]
                assert not bad, f"{page.name}: {bad[0][:120]}"
            rows = []


def test_regenerating_a_report_from_its_verdict_file_is_idempotent(tmp_path: Path) -> None:
    for name in ("lag-grid", "synthetic"):
        shutil.copy(RESULTS / f"{name}.verdicts.json", tmp_path)
        text = (RESULTS / f"{name}.md").read_text()
        head, rest = text.split("\n## Verdicts\n", 1)
        section, tail = rest.split("\n## Claims\n", 1)
        old = section.replace("**negligible**", "**supported**").replace("| 1 |", "| 0.5 |")
        tail = tail.replace("negligible (see the verdict table)", "supported (see the verdict table)")
        (tmp_path / f"{name}.md").write_text(f"{head}\n## Verdicts\n{old}\n## Claims\n{tail}")
    files = [str(tmp_path / f"{n}.verdicts.json") for n in ("lag-grid", "synthetic")]
    for _ in range(2):
        assert reports_main(files) == 0
        for name in ("lag-grid", "synthetic"):
            assert (tmp_path / f"{name}.md").read_text() == (RESULTS / f"{name}.md").read_text()
    (tmp_path / "lag-grid.md").write_text("# no verdicts section\n")
    assert reports_main(files[:1]) == 2
    assert [s.name for s in load([RESULTS / "lag.verdicts.json"])] == ["lag"]
