"""The results pages: every verdict of every report with one Holm family over the confirmatory ones
(docs/results/verdicts.md), the index of the results pages (docs/results/README.md) and the README's short block.

Reads the ``*.verdicts.json`` files that ``p3o compare`` writes next to each report and renders them; nothing in
the output is typed by hand. The pooled family is read from the ledger (configs/experiments/records/ledger.yaml,
``studies:``; :func:`p3o.experiments.stats.ledger.study_status`): the **primary** verdicts of every study whose
recorded status is ``pooled`` (confirmatory: the study file was committed before its runs) are decided in **one Holm
family** (:func:`pool`): each verdict's raw p-value (:func:`p3o.experiments.stats.paired.decision_p`: the TOST
p_equiv for *tracks* and for an estimate inside the margin, p_diff otherwise) is Holm-adjusted over all of them and
the verdict re-taken with :func:`p3o.experiments.stats.paired.verdict`. A study that failed its bite condition, an
exploratory one and a superseded one are listed with their status, never pooled; secondary verdicts are marked. A
verdict marked ``superseded`` (a later study re-decided it: a recorded amendment in
configs/experiments/records/ledger.yaml, :mod:`p3o.experiments.stats.ledger`) stays in its study's table, marked,
and leaves the pooled family.
The README block sits between two markers and is replaced in place:

    <!-- verdicts:start -->  ...  <!-- verdicts:end -->

    python -m p3o.experiments.summary docs/results/*.verdicts.json --out docs/results/verdicts.md \\
        --index docs/results/README.md --claims docs/paper-claims.md --readme README.md
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml

from p3o.errors import ConfigError
from p3o.experiments.stats.bias import peak_bias
from p3o.experiments.stats.ledger import (
    PER_CPU_BASE,
    PER_CPU_KEPT,
    STATUSES,
    base_label,
    ledger,
    load_records,
    records_for,
    study_entry,
    study_status,
)
from p3o.experiments.stats.paired import VERDICTS, PairedResult, decide_family, decision_p, holm, verdict
from p3o.experiments.stats.verdicts import cell
from p3o.experiments.summary.blocks import END, START, links_from

#: What the section of a study from a per-CPU base says (`Study.summary_only`, `Study.per_cpu_base`).
SUMMARY_ONLY = (
    "its runs started from a base each machine built for itself, before the base shipped in the package (AVX2 and "
    "AVX-512 CPUs built different ones); the statistics it recorded stand under its status as they are and it is "
    "not rerun, so its runs do not reproduce bit for bit on another CPU; new studies start from the shipped base"
)
#: The two labels of a study from a per-CPU base, by what its verdict file keeps (`Study.base_label`).
PER_CPU_LABELS = {
    PER_CPU_BASE: "summary statistics only",
    PER_CPU_KEPT: "per-CPU base, per-seed values kept",
}


@dataclass
class Study:
    """One verdict file: its path, its pre-registration record (None: an old file without one) and its verdicts."""

    path: Path
    preregistration: dict[str, Any] | None
    records: list[dict[str, Any]]
    runs: list[dict[str, Any]] = field(default_factory=list)
    """The file's run records (``runs``; [] when it has none)."""

    @cached_property
    def bias(self) -> dict[str, Any] | None:
        """The selection bias of the study's peak verdicts, when the ledger marks one
        (:func:`p3o.experiments.stats.bias.peak_bias`)."""
        entry = study_entry(records_for(self.path), self.name, self.path)
        return peak_bias({"runs": self.runs}, entry)

    @property
    def name(self) -> str:
        return self.path.name.removesuffix(".verdicts.json")

    @property
    def base_label(self) -> str | None:
        """How the pages label an LM study whose runs started from a base each machine built for itself (before
        the base shipped; :func:`p3o.experiments.stats.ledger.base_label`): "per-CPU base, per-seed values kept"
        when every verdict keeps its per-seed values, else "summary statistics only"; None for the others."""
        full = base_label({"runs": self.runs, "verdicts": self.records}, self.instrument)
        return PER_CPU_LABELS[full] if full is not None else None

    @property
    def summary_only(self) -> bool:
        """A study from a per-CPU base whose verdicts do not all keep their per-seed values: its recorded summary
        statistics stand, it is not rerun (:attr:`base_label`)."""
        return self.base_label == PER_CPU_LABELS[PER_CPU_BASE]

    @cached_property
    def instrument(self) -> str:
        """The study file's ``instrument`` ("lm" when absent, or when no study file is found)."""
        src = study_file(self.name)
        try:
            raw = yaml.safe_load(src.read_text()) if src is not None else None
        except (OSError, yaml.YAMLError):
            raw = None
        return str(raw.get("instrument", "lm")) if isinstance(raw, dict) else "lm"

    @property
    def confirmatory(self) -> bool:
        """Pre-registered and not exploratory."""
        return self.preregistration is not None and not self.preregistration.get("exploratory", True)

    @cached_property
    def _status(self) -> tuple[str, str]:
        return study_status(records_for(self.path), self.name, self.confirmatory, self.path)

    @property
    def status(self) -> str:
        """The study's status in the ledger: pooled, failed-bite, exploratory or superseded
        (:func:`p3o.experiments.stats.ledger.study_status`; a confirmatory study is pooled only when recorded so,
        an unrecorded one outside a repository by its pre-registration)."""
        return self._status[0]

    @property
    def status_why(self) -> str:
        """Why the ledger gives the study its status ("" for a pooled one)."""
        status, why = self._status
        return "" if status == "pooled" else why

    @property
    def pooled(self) -> bool:
        """Its primary verdicts join the pooled Holm family: confirmatory and recorded as pooled."""
        return self.confirmatory and self.status == "pooled"


def load(paths: list[Path]) -> list[Study]:
    """The studies of the verdict files; ConfigError naming the file when it is missing or malformed."""
    out = []
    for path in paths:
        try:
            doc = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise ConfigError(f"{path}: cannot read verdicts: {str(err).splitlines()[0]}") from None
        if isinstance(doc, list):  # written before pre-registration was recorded
            out.append(Study(path, None, redecide(doc)))
        elif isinstance(doc, dict) and isinstance(doc.get("verdicts"), list):
            runs = doc.get("runs") if isinstance(doc.get("runs"), list) else []
            out.append(Study(path, doc.get("preregistration"), redecide(doc["verdicts"]), runs))
        else:
            raise ConfigError(f"{path}: expected {{preregistration, verdicts: [...]}}")
    return out


def _result(r: dict[str, Any]) -> PairedResult:
    """The stored paired result of a verdict record."""
    return PairedResult.from_record(r)


def redecide(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records with each verdict re-taken by today's rule from its stored paired result, within the study's own
    Holm families (primary, secondary); a verdict that differs from the one its report printed keeps that one as
    ``verdict_report`` (a report written under an older rule, whose runs are not committed to regenerate it)."""
    out = [dict(r) for r in records]
    for role in ("primary", "secondary"):
        family = [r for r in out if r.get("role", "primary") == role]
        alpha = float(family[0].get("alpha", 0.05)) if family else 0.05
        decided = decide_family([r["kind"] for r in family], [_result(r) for r in family], alpha=alpha)
        for r, (_, v) in zip(family, decided):
            if v != r["verdict"]:
                r["verdict_report"], r["verdict"] = r["verdict"], v
    return out


def _primary(r: dict[str, Any]) -> bool:
    return r.get("role", "primary") == "primary"


def superseded(r: dict[str, Any]) -> dict[str, Any] | None:
    """The record's ``superseded`` mark ``{by, date, why}`` (None: it is evidence of its own)."""
    mark = r.get("superseded")
    return mark if isinstance(mark, dict) else None


def superseded_members(studies: list[Study]) -> list[tuple[Study, dict[str, Any]]]:
    """The confirmatory primary verdicts that a recorded amendment took out of the pooled family."""
    return [(s, r) for s in studies if s.pooled for r in s.records if _primary(r) and superseded(r)]


def pool(studies: list[Study]) -> list[tuple[Study, dict[str, Any]]]:
    """The README's family: every confirmatory primary verdict of every study that no recorded amendment superseded
    (:func:`superseded`), with ``p_pool`` (Holm over the
    pooled family) and ``verdict_pool`` (the verdict re-taken at that p, m = the pooled family's size).

    ConfigError when the studies declare different α (one family needs one α)."""
    members = [(s, dict(r)) for s in studies if s.pooled for r in s.records if _primary(r) and not superseded(r)]
    alphas = {float(r.get("alpha", 0.05)) for _, r in members}
    if len(alphas) > 1:
        raise ConfigError(f"the confirmatory studies declare different alpha ({sorted(alphas)}): one family, one α")
    alpha = alphas.pop() if alphas else 0.05
    tested = [i for i, (_, r) in enumerate(members) if r["kind"] != "identical"]
    raw = [decision_p(members[i][1]["kind"], _result(members[i][1])) for i in tested]
    adjusted = dict(zip(tested, holm([math.nan if p is None else float(p) for p in raw])))
    for i, (_, r) in enumerate(members):
        res = _result(r)
        r["p_pool"] = adjusted.get(i, math.nan)
        r["verdict_pool"] = verdict(r["kind"], res, r["p_pool"], m=max(1, len(tested)), alpha=alpha)
    return members


def effect_text(r: dict[str, Any], identical: str = "exactly 0 on every seed") -> str:
    """A verdict record's mean difference and CI, ``+0.012 [-0.004, +0.028]``; `identical` when every seed's pair
    was identical, "–" where the difference or a bound is NaN."""
    if r.get("identical"):
        return identical
    lo, hi = r["ci"]
    if any(isinstance(x, float) and math.isnan(x) for x in (r["diff"], lo, hi)):
        return "–"
    return f"{r['diff']:+.3f} [{lo:+.3f}, {hi:+.3f}]"


def _p(p: Any) -> str:
    if p is None or (isinstance(p, float) and math.isnan(p)):
        return "—"
    return "< 1e-4" if p < 1e-4 else f"{p:.2g}"


def _mode(study: Study) -> str:
    pre = study.preregistration
    if pre is None:
        return "no pre-registration record (written before the tool recorded one)"
    head = f"file sha256 `{pre['sha256'][:12]}…`, commit `{str(pre.get('commit'))[:12]}` ({pre.get('committed_at')})"
    if pre.get("exploratory"):
        return f"**exploratory** ({head})"
    return f"confirmatory ({head}), seeds {', '.join(map(str, pre.get('seeds', [])))}"


def render_page(studies: list[Study], command: str) -> str:
    """docs/results/verdicts.md: the pooled family, then the verdict table of every study, linking each report."""
    pooled = pool(studies)
    gone = superseded_members(studies)
    lines = [
        "# Verdicts: what the experiments support, contradict or leave open",
        "",
        f"Generated by `{command}` from the verdict files that `p3o compare` writes next to each report; every "
        "verdict is computed by `p3o.experiments.stats` (paired by seed, 95 % paired-t interval of A − B on the "
        "study's declared metric; an effect is *negligible* when its Holm-adjusted TOST shows it inside the declared "
        "margin ±δ; *tracks* is TOST within ±δ "
        "and contradicted only by an interval entirely outside [−δ, δ]). A study is **confirmatory** when "
        "`p3o compare` produced it without `--exploratory`, which it does only for a committed, unchanged experiment "
        "file, an out_dir whose runs were all made from the same claims, metric and margins, and seeds no exploratory "
        "run of the study used (`p3o.experiments.stats.prereg`; each verdict file records the file's sha256, commit, "
        "commit time and seeds).",
        "",
        f"## One family: the pooled verdicts ({len(pooled)})",
        "",
        "The primary verdicts of the studies the ledger records as pooled (configs/experiments/records/ledger.yaml, "
        "`studies:`; confirmatory, pre-registered), with Holm's correction over all of them at once (column p (Holm, "
        "pooled)); the per-study tables below adjust within each study (in-study counts)."
        + (
            f" {len(gone)} confirmatory verdict{'s' if len(gone) != 1 else ''} superseded by a later study (a "
            "recorded amendment, listed in the results index) are out of it, marked **superseded** in their study's "
            "table."
            if gone
            else ""
        ),
        "",
        "| study | claim | regime | A | B | metric | n | A − B [95% CI] | p (Holm, pooled) | verdict |",
        "|---|---|---|---|---|---|---:|---|---:|---|",
    ]
    for study, r in pooled:
        lines.append(
            f"| {study.name} | "
            + " | ".join(cell(r[k]) for k in ("title", "regime", "a", "b", "metric"))
            + f" | {r['n']} | {effect_text(r)} | {_p(r['p_pool'])} | **{r['verdict_pool']}** |"
        )
    lines.append("")
    for study in studies:
        why = f" ({study.status_why})" if study.status_why else ""
        lines += [
            f"## [{study.name}]({study.name}.md)",
            "",
            f"Pre-registration: {_mode(study)}. Status in the ledger: **{STATUSES[study.status]}**{why}.",
            "",
            *([f"**Selection bias**: {study.bias['text']}.", ""] if study.bias else []),
            *(
                [f"**{study.base_label[0].upper()}{study.base_label[1:]}**: {SUMMARY_ONLY}.", ""]
                if study.base_label
                else []
            ),
        ]
        if not study.records:
            lines += ["No verdicts: a descriptive study (its report's tables are the result).", ""]
            continue
        lines += [
            "Primary verdicts, in-study (the study's own Holm family): "
            f"{_counts([r for r in study.records if _primary(r)])}.",
            "",
            "| claim | regime | A | B | metric | role | n | A − B [95% CI] | p (Holm) | verdict |",
            "|---|---|---|---|---|---|---:|---|---:|---|",
        ]
        lines += [_study_row(r) for r in study.records]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _study_row(r: dict[str, Any]) -> str:
    """One row of a study's verdict table on docs/results/verdicts.md (its label as today's rule gives it, with the
    older one's whereabouts, or its supersession), every cell escaped."""
    mark = " (exploratory)" if r.get("exploratory") else ""
    if r.get("verdict_report"):
        mark += f" (today's rule; {r['verdict_report']} before the rule amendment, the report's appendix)"
    shown = f"**{r['verdict']}**{mark}"
    sup = superseded(r)
    if sup:
        shown = (
            f"**superseded** by [{sup['by']}]({sup['by']}.md) ({sup['date'][:10]}; its study's verdict: "
            f"{r['verdict']}{mark}; not evidence): {sup['why']}"
        )
    return (
        "| "
        + " | ".join(cell(r[k]) for k in ("title", "regime", "a", "b", "metric"))
        + f" | {r.get('role', 'primary')} | {r['n']} | {effect_text(r)} | {_p(r.get('p_adj'))} | {cell(shown)} |"
    )


def _counts(records: list[dict[str, Any]], key: str = "verdict") -> str:
    """ "3 supported, 0 contradicted, 1 negligible, 2 inconclusive"."""
    return ", ".join(f"{sum(1 for r in records if r[key] == v)} {v}" for v in VERDICTS)


def study_file(name: str, root: Path = Path("configs/experiments")) -> Path | None:
    """The study file of a verdict file's study: ``root/**/<name>.yaml`` (None when there is none)."""
    found = sorted(root.rglob(f"{name}.yaml")) if root.is_dir() else []
    return found[0] if found else None


def render_index(studies: list[Study], command: str, index: Path, pages: dict[str, Path]) -> str:
    """docs/results/README.md: every results page, what kind of study made it, and where the rest is.

    ``pages``: the other generated pages by role ("verdicts", "claims", "forest"), linked relative to ``index``."""

    rel = links_from(index)

    lines = [
        "# Results",
        "",
        f"Generated by `{command}`. Every page here is written by a tool from its runs (`p3o compare`, `p3o "
        "probe`, `p3o synthetic`); none is typed by hand. Reference pages (how the tools work) are in "
        f"[docs/]({rel(Path('docs'))}/). Each verdict file keeps the per-seed values its verdicts were computed from "
        "(or says why it cannot) and its runs' start times (or why not): `p3o compare --check FILE.verdicts.json` "
        "recomputes every verdict from them and compares the first run's start with the study file's commit.",
        "",
    ]
    if "claims" in pages:
        lines += [
            f"- [The papers' claims, one by one]({rel(pages['claims'])}): each claim of either paper, "
            "our regime, our verdict.",
            "",
        ]
    if "verdicts" in pages:
        lines += [
            f"- [Every verdict]({rel(pages['verdicts'])}): the pooled ones in one Holm family, then "
            "each study's table.",
            "",
        ]
    pooled = pool(studies)
    failed = [s.name for s in studies if s.status == "failed-bite"]
    lines += [
        f"Each study's status is recorded in the ledger (configs/experiments/records/ledger.yaml, `studies:`): "
        f"{len({s.name for s, _ in pooled})} studies are **pooled** (their {len(pooled)} primary verdicts decided in "
        "one Holm family: [every verdict](" + (rel(pages["verdicts"]) if "verdicts" in pages else "verdicts.md") + ")"
        ")"
        + (f"; **failed their bite condition** (reported, not pooled): {', '.join(failed)}" if failed else "")
        + ". The verdict counts below are **in-study** (each study's own Holm family), not the pooled family's.",
        "",
        delta_rule(pooled),
        "",
        "| study | report | mode | status | seeds | primary verdicts (in-study) | study file |",
        "|---|---|---|---|---|---|---|",
    ]
    for study in studies:
        pre = study.preregistration or {}
        mode = "exploratory (no pre-registration record)" if not pre else "confirmatory"
        mode = "exploratory" if pre.get("exploratory") else mode
        status = STATUSES[study.status] + (f": {study.status_why}" if study.status == "failed-bite" else "")
        status += (
            f"; peak selection-biased ({study.bias['bias']:+.3f} expected under no learning)" if study.bias else ""
        )
        status += (
            f"; {study.base_label}" + ("" if study.base_label.startswith("per-CPU") else " (runs from a per-CPU base)")
            if study.base_label
            else ""
        )
        seeds = _seed_text([int(s) for s in pre.get("seeds", [])])
        prim = [r for r in study.records if _primary(r)]
        src = study_file(study.name)
        lines.append(
            f"| {study.name} | [{study.path.name.removesuffix('.verdicts.json')}.md]"
            f"({rel(study.path.with_name(study.name + '.md'))}) | {mode} | {status} | {seeds} | "
            f"{_counts(prim) if prim else 'none (descriptive)'} | " + (f"[{src}]({rel(src)})" if src else "–") + " |"
        )
    lines += ledger_lines(Path("configs/experiments"))
    return "\n".join(lines).rstrip() + "\n"


def delta_rule(pooled: list[tuple[Study, dict[str, Any]]]) -> str:
    """How *supported* / *contradicted* treat the margin δ, in words, with the pooled family's decided verdicts
    whose interval still reaches inside ±δ counted (and the first one shown): the point estimate is compared with δ,
    not the interval (:func:`p3o.experiments.stats.paired.verdict`)."""
    straddle = [
        (s, r)
        for s, r in pooled
        if r["kind"] in ("better", "worse")
        and r["verdict_pool"] in ("supported", "contradicted")
        and r.get("margin")
        and min(abs(float(r["ci"][0])), abs(float(r["ci"][1]))) < float(r["margin"])
    ]
    example = ""
    if straddle:
        s, r = straddle[0]
        example = (
            f"; {len(straddle)} of the pooled family's decided verdicts are so, e.g. {s.name}'s {r['a']} − {r['b']} "
            f"({r['regime']}), {effect_text(r)} with δ = {float(r['margin']):g}: {r['verdict_pool']}"
        )
    return (
        "**How the labels treat δ**: a better / worse claim is *supported* (or *contradicted*) when the **point "
        "estimate** A − B is at least δ from 0 in the claim's (the opposite) direction and its Holm-adjusted "
        "difference-test p is below α; the interval is not compared with δ, so a supported or contradicted "
        f"verdict's 95 % interval may still reach inside ±δ{example}. *negligible* needs the Holm-adjusted TOST to "
        "show the effect inside ±δ; *tracks* is TOST within ±δ and is contradicted only by an interval entirely "
        "outside [−δ, δ] (`p3o.experiments.stats.paired.verdict`)."
    )


def ledger_lines(root: Path) -> list[str]:
    """The index's "Seed ledger" and "Amendments and looks" sections (:mod:`p3o.experiments.stats.ledger`)."""
    if not root.is_dir():
        return []
    records = load_records(root)
    lines = [
        "",
        "## Seed ledger",
        "",
        "Every seed any run of any study used (`p3o.experiments.stats.ledger`): a confirmatory study may not reuse "
        "one that another study used with a compared objective in common on the same instrument, unless a look is "
        "recorded.",
        "",
        "| study | instrument | seeds | compared objectives | declared in |",
        "|---|---|---|---|---|",
    ]
    for use in sorted(ledger(root, records), key=lambda u: (u.instrument, min(u.seeds, default=0), u.study)):
        lines.append(
            f"| {use.study} | {use.instrument} | {_seed_text(sorted(use.seeds))} | "
            f"{', '.join(sorted(use.objectives))} | {use.source} |"
        )
    lines += ["", "## Amendments and looks", ""]
    for a in records.amendments:
        lines.append(
            f"- Amendment of **{a.get('study')}** ({a.get('date')}, commit `{a.get('commit')}`; sha256 "
            f"`{str(a.get('from'))[:12]}` → `{str(a.get('to'))[:12]}`): {a.get('what')} — {a.get('why')}"
        )
    for e in records.superseded:
        keys = "; ".join(", ".join(f"{k} {v}" for k, v in key.items()) for key in e.get("verdicts", []))
        lines.append(
            f"- Verdicts of **{e.get('study')}** superseded by **{e.get('by')}** ({e.get('date')}, its results commit "
            f"`{e.get('by_commit')}`; {keys}): {e.get('what')} — {e.get('why')}"
        )
    for k in records.looks:
        lines.append(
            f"- Look at **{k.get('study')}** by {k.get('look')} (seeds {_seed_text(list(k.get('seeds', [])))}, "
            f"{k.get('date')}, commit `{k.get('commit')}`): {k.get('what')} — {k.get('why')}"
        )
    return lines


def _seed_text(seeds: list[int]) -> str:
    if not seeds:
        return "–"
    if seeds == list(range(seeds[0], seeds[0] + len(seeds))) and len(seeds) > 2:
        return f"{seeds[0]}–{seeds[-1]}"
    return ", ".join(map(str, seeds))


#: How the pages name each instrument (the study file's ``instrument``), in the order they are shown.
INSTRUMENT_NAMES = {"lm": "LM testbed", "synthetic": "simulator"}


def instrument_counts(studies: list[Study]) -> str:
    """The confirmatory primary verdicts counted per instrument, as the pooled Holm family decides them — never one
    count across instruments — and how many of them keep their per-seed values (`p3o compare --check` recomputes
    those; the others come from files written before the values were kept, which say so): "**LM testbed** 102 from
    10 studies (8 supported, ...; 20 with per-seed values); **simulator** ..."."""
    pooled = pool(studies)
    order = [*INSTRUMENT_NAMES, *sorted({s.instrument for s, _ in pooled} - set(INSTRUMENT_NAMES))]
    parts = []
    for inst in order:
        mine = [(s, r) for s, r in pooled if s.instrument == inst]
        if not mine:
            continue
        names = list(dict.fromkeys(s.name for s, _ in mine))
        where = f"{len(names)} stud{'y' if len(names) == 1 else 'ies'}"
        tally = _counts([r for _, r in mine], "verdict_pool")
        kept = sum(r.get("values_a") is not None and r.get("values_b") is not None for _, r in mine)
        parts.append(
            f"**{INSTRUMENT_NAMES.get(inst, inst)}** {len(mine)} from {where} ({tally}; {kept} with per-seed values)"
        )
    return "; ".join(parts)


def count_line(studies: list[Study], in_rows: set[tuple[Any, ...]] | None = None) -> str:
    """One line of counts of the pooled family, per instrument, saying what the verdicts are: how many of each label
    some claim row of the papers' claims names (the rest are controls and sub-hypotheses no claim row shows)."""
    pooled = pool(studies)
    order = [*INSTRUMENT_NAMES, *sorted({s.instrument for s, _ in pooled} - set(INSTRUMENT_NAMES))]
    gone = superseded_members(studies)
    head = (
        f"Pooled family (the ledger's pooled studies, one Holm family): {len(pooled)} verdicts from "
        f"{_n_studies(len({s.name for s, _ in pooled}))}" + (f", {len(gone)} superseded out of it" if gone else "")
    )
    parts = []
    for inst in order:
        mine = [(s, r) for s, r in pooled if s.instrument == inst]
        if not mine:
            continue
        tally = []
        for v in VERDICTS:
            of = [(s, r) for s, r in mine if r["verdict_pool"] == v]
            named = sum(_row_key(s, r) in in_rows for s, r in of) if in_rows is not None else None
            tally.append(f"{len(of)} {v}" + (f" ({named} in a claim row)" if named is not None and of else ""))
        parts.append(f"**{INSTRUMENT_NAMES.get(inst, inst)}** {len(mine)}: {', '.join(tally)}")
    rest = "; the rest are controls and sub-hypotheses no claim row shows" if in_rows is not None else ""
    return f"{head} — {'; '.join(parts)}{rest}."


def _n_studies(n: int) -> str:
    return f"{n} stud{'y' if n == 1 else 'ies'}"


def _row_key(study: Study, r: dict[str, Any]) -> tuple[Any, ...]:
    return (study.name, *(r.get(k) for k in ("claim", "regime", "a", "b", "metric", "role")))


def render_block(
    studies: list[Study],
    readme: Path,
    pages: dict[str, Path],
    lines_in: list[str] | None = None,
    in_rows: set[tuple[Any, ...]] | None = None,
    lead: str = "",
) -> str:
    """The README block: one paragraph — ``lead`` (what the verdicts say in words,
    :func:`p3o.experiments.summary.words.closing_words`) and one line of counts of the pooled family per instrument
    (:func:`count_line`) with links to the pages that hold every verdict — then ``lines_in`` (the claims' front page,
    :func:`p3o.experiments.summary.claims.front_page`: its lists interrupt the paragraph; each heading has a blank
    line before it). No blank line follows the start marker or precedes the end marker (an HTML comment starts and
    ends its own block in CommonMark, and may interrupt a paragraph or list), so the block stays short."""

    rel = links_from(readme)

    links = [f"[{role}]({rel(p)})" for role, p in pages.items()]
    where = f": {', '.join(links)}" if links else " (docs/results/)"
    head = (f"{lead} " if lead else "") + (
        f"{count_line(studies, in_rows)} Every verdict, with `p3o compare --check FILE` to recompute it{where}."
    )
    rest = list(lines_in or [])
    if rest and rest[0] and not rest[0].startswith(("- ", "**")):  # a sentence (the testbeds): the paragraph's end
        head, rest = f"{head} {rest[0]}", rest[1:]
    return "\n".join([START, head, *rest, END])
