"""The papers' claims, one by one, against our verdicts: docs/paper-claims.md, its forest plot and the README's
statements, rendered from the verdict files through a declared mapping (configs/experiments/records/paper-claims.yaml).

Each claim of either paper names the paper's number and our rows; a row is one regime of ours with the verdict keys
that test it (``{study, claim, regime?, b?, role?}`` into the verdict files), or a ``status`` ("not yet run",
"testbed cannot bite") with its reason when no verdict exists. A confirmatory verdict is shown as the pooled Holm
family decides it (:func:`p3o.experiments.summary.pages.pool`), an exploratory one as its study decided it, marked;
a superseded one (a later study re-decided it: a recorded amendment) as **superseded** by that study, its own verdict
named but not counted as evidence.

A row also names its ``instrument`` (``lm``: the language-model testbed, ``synthetic``: the simulator), says how
its regime ``differs`` from the claim's when it does, gives the measured ``ess`` when the testbed cannot bite, and
a short ``label`` for the README. The README's front page (:func:`front_page`) shows one line per claim with the
LM verdicts, the simulator verdicts and "cannot be tested here", each claim linking its first row of
docs/paper-claims.md (``#<claim id>``); the mapping's ``instruments`` say what each instrument is.

The forest plot draws every verdict of the table as its effect A − B and 95 % CI in units of its margin δ against the
band [−1, 1] (an effect inside it is below the margin), one row per verdict, grouped by regime. It is byte-for-byte
deterministic: fixed rcParams, the Agg backend, no Software or date metadata in the PNG.
"""

from __future__ import annotations

import math
import os
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from p3o.errors import ConfigError
from p3o.experiments.summary.blocks import links_from, wrap
from p3o.experiments.summary.pages import INSTRUMENT_NAMES, Study, effect_text, pool, study_file, superseded

#: Verdict colours of the forest plot.
COLORS = {
    "supported": "#1b7837",
    "contradicted": "#b2182b",
    "negligible": "#4d4d4d",
    "inconclusive": "#e08214",
    "superseded": "#bdbdbd",
}
#: Fixed matplotlib settings: the plot's bytes depend on the verdicts only.
RC = {
    "font.family": "DejaVu Sans",
    "font.size": 8,
    "figure.dpi": 100,
    "savefig.dpi": 100,
    "path.simplify": False,
    "axes.unicode_minus": True,
    "svg.hashsalt": "p3o",
}


@dataclass
class Found:
    """One verdict record a row refers to, with the study it comes from and the verdict the table shows."""

    study: Study
    record: dict[str, Any]
    verdict: str
    pooled: bool
    """Decided in the pooled Holm family of the confirmatory studies (False: the study's own, exploratory)."""

    @property
    def superseded(self) -> dict[str, Any] | None:
        """The record's ``superseded`` mark ``{by, date, why}`` (None: evidence of its own)."""
        return superseded(self.record)


def load_mapping(path: Path) -> list[dict[str, Any]]:
    """The claims of the mapping file (ConfigError naming the file when it is missing or malformed)."""
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"{path}: cannot read the claims mapping: {str(err).splitlines()[0]}") from None
    claims = raw.get("claims") if isinstance(raw, dict) else None
    if not isinstance(claims, list) or not all(isinstance(c, dict) and c.get("rows") for c in claims):
        raise ConfigError(f"{path}: expected claims: [{{id, paper, claim, number, rows: [...]}}]")
    return claims


def load_instruments(path: Path) -> dict[str, str]:
    """The mapping's ``instruments``: {instrument: the one line that defines it} (ConfigError when absent)."""
    raw = yaml.safe_load(path.read_text())
    inst = raw.get("instruments") if isinstance(raw, dict) else None
    if not isinstance(inst, dict) or not all(isinstance(v, str) for v in inst.values()):
        raise ConfigError(f"{path}: expected instruments: {{lm: <definition>, synthetic: <definition>}}")
    return inst


def load_caveats(path: Path) -> dict[str, dict[str, str]]:
    """The mapping's ``caveats``: {name: {mark, text}} that rows cite with ``caveat: name`` ({} when none)."""
    raw = yaml.safe_load(path.read_text())
    cav = raw.get("caveats", {}) if isinstance(raw, dict) else {}
    if not isinstance(cav, dict) or not all(isinstance(v, dict) and {"mark", "text"} <= set(v) for v in cav.values()):
        raise ConfigError(f"{path}: expected caveats: {{name: {{mark, text}}}}")
    return cav


def _caveat(row: dict[str, Any], caveats: dict[str, dict[str, str]]) -> str:
    """ " †" when the row cites a caveat ("" when not); ConfigError for an undeclared one."""
    name = row.get("caveat")
    if name is None:
        return ""
    if name not in caveats:
        raise ConfigError(f"paper claims: row {row['regime']!r} cites caveat {name!r}, not declared under caveats")
    return f" {caveats[name]['mark']}"


def caveat_lines(claims: list[dict[str, Any]], caveats: dict[str, dict[str, str]]) -> list[str]:
    """One line per caveat the rows cite: "† text"."""
    used = dict.fromkeys(row["caveat"] for c in claims for row in c["rows"] if row.get("caveat"))
    return [f"{caveats[name]['mark']} {caveats[name]['text']}" for name in used if name in caveats]


def row_instrument(row: dict[str, Any]) -> str:
    """A row's instrument: its ``instrument`` key, else "synthetic" for a "synthetic: ..." regime, else "lm"."""
    if row.get("instrument"):
        return str(row["instrument"])
    return "synthetic" if str(row.get("regime", "")).startswith("synthetic") else "lm"


def row_label(row: dict[str, Any]) -> str:
    """The row's short label for the front page (``label``, else its regime without the instrument prefix)."""
    if row.get("label"):
        return str(row["label"])
    regime = str(row["regime"])
    for prefix in ("synthetic: ", "LM: "):
        regime = regime.removeprefix(prefix)
    return regime


def _matches(study: Study, r: dict[str, Any], key: dict[str, Any]) -> bool:
    if study.name != key["study"] or r.get("claim") != key["claim"]:
        return False
    if r.get("role", "primary") != key.get("role", "primary"):
        return False
    return all(r.get(k) == key[k] for k in ("regime", "b") if k in key)


def _key(study: Study, r: dict[str, Any]) -> tuple[Any, ...]:
    return (study.name, *(r.get(k) for k in ("claim", "regime", "a", "b", "metric", "role")))


def find(studies: list[Study], key: dict[str, Any]) -> list[Found]:
    """The verdict records a key names, in file order (ConfigError when a named study has none of them)."""
    pooled = {_key(s, r): r for s, r in pool(studies)}
    out = []
    for study in studies:
        for r in study.records:
            if _matches(study, r, key):
                p = pooled.get(_key(study, r))
                shown = "superseded" if superseded(r) else (p["verdict_pool"] if p else r["verdict"])
                out.append(Found(study, r, shown, p is not None))
    if not out and any(s.name == key["study"] for s in studies):
        raise ConfigError(f"paper claims: no verdict {key} in {key['study']}.verdicts.json")
    return out


def _effect(f: Found) -> str:
    return effect_text(f.record, identical="identical on every seed")


#: How each claim kind reads (A and B filled in).
TESTS = {"better": "{a} > {b}", "worse": "{a} < {b}", "tracks": "{a} ≈ {b}", "identical": "{a} ≡ {b}"}


def role_mark(f: Found) -> str:
    """Empty for a verdict of the pooled family, else why not: " (by <study>)" for a superseded one,
    " (secondary)" or " (exploratory)"."""
    if f.superseded:
        return f" (by {f.superseded['by']})"
    if f.pooled:
        return ""
    if f.study.pooled and f.record.get("role") == "secondary":
        return " (secondary)"
    return {"failed-bite": " (failed its bite condition)", "superseded": " (superseded study)"}.get(
        f.study.status, " (exploratory)"
    )


def mark(f: Found) -> str:
    """`role_mark`, and for a non-pooled verdict that today's rule decides otherwise than its report, that report's."""
    if f.superseded:
        return f"{role_mark(f)} (not evidence; its study's verdict was {f.record['verdict']})"
    was = None if f.pooled else f.record.get("verdict_report")
    return role_mark(f) + (f" (today's rule; {was} before the rule amendment, its report's appendix)" if was else "")


def test_text(f: Found, with_regime: bool = False) -> str:
    """What the verdict tested: "p3o > grpo-tm-0.2" (with its regime when asked)."""
    r = f.record
    text = TESTS.get(r.get("kind", ""), "{a} vs {b}").format(a=r["a"], b=r["b"])
    return f"{text} ({r['regime']})" if with_regime else text


def verdict_text(f: Found) -> str:
    """The table's cell line: verdict, test, regime, A − B [95 % CI], metric."""
    r = f.record
    return f"**{f.verdict}**{mark(f)} {test_text(f, True)}: {_effect(f)} ({r['metric']})"


def rows_of(
    claims: list[dict[str, Any]], studies: list[Study]
) -> list[tuple[dict[str, Any], dict[str, Any], list[Found]]]:
    """(claim, row, found verdicts) for every row of every claim, in the mapping's order."""
    return [
        (c, row, [f for key in row.get("verdicts", []) for f in find(studies, key)])
        for c in claims
        for row in c["rows"]
    ]


def render_claims(
    claims: list[dict[str, Any]],
    studies: list[Study],
    page: Path,
    figure: Path,
    command: str,
    caveats: dict[str, dict[str, str]] | None = None,
    instruments: dict[str, str] | None = None,
) -> str:
    """docs/paper-claims.md: the per-claim table (:func:`claim_table`, when ``instruments`` are given), then one row
    per (claim, regime of ours), the forest plot beside it."""

    rel = links_from(page)

    lines = [
        "# The papers' claims, one by one",
        "",
        f"Generated by `{command}` from the verdict files and the declared mapping of claims to verdicts "
        "(configs/experiments/records/paper-claims.yaml). A confirmatory verdict is shown as the pooled Holm family "
        "of the studies the ledger pools decides it; an exploratory one (or one that failed its bite condition) is "
        "marked; a *superseded* one was re-decided by a "
        "later study (a recorded amendment: its comparison was not the paper's) and is not evidence. *negligible*: "
        "the Holm-adjusted TOST shows the effect inside the study's margin ±δ; *inconclusive*: neither shown nor "
        "ruled out at this n. The papers' "
        "numbers are from their own runs (one seed per configuration in the P3O paper) and settings that are not "
        "ours.",
        "",
        f"![every verdict of this table: A − B and its 95 % CI in units of the study's margin δ]({rel(figure)})",
        "",
        *(
            [
                "## At a glance",
                "",
                "One row per claim: how the pooled verdicts of each instrument's rows fall (a cell counts its rows' "
                "verdicts; ≠ says how a row's regime is not the claim's; \"cannot be tested here\": the testbed's ESS "
                "stays above the bite threshold 0.95). The rows themselves follow.",
                "",
                *claim_table(claims, studies, "", instruments, caveats),
                "## Claim by claim",
                "",
            ]
            if instruments
            else []
        ),
        "| paper | claim | the paper's number | our regime | our verdict: A − B [95 % CI] | n | report |",
        "|---|---|---|---|---|---:|---|",
    ]
    seen: set[str] = set()
    for claim, row, found in rows_of(claims, studies):
        anchor = "" if claim["id"] in seen else f'<a id="{claim["id"]}"></a>'
        seen.add(claim["id"])
        regime = row["regime"] + (
            f" — *differs from the claim's regime: {row['differs']}*" if row.get("differs") else ""
        )
        regime += "".join(f" — *{b}*" for b in _biases(found))
        regime += _caveat(row, caveats or {})
        if found:
            verdict = "<br>".join(verdict_text(f) for f in found)
            n = ", ".join(sorted({str(f.record["n"]) for f in found}))
            reports = dict.fromkeys(f.study.path.with_name(f.study.name + ".md") for f in found)
            report = ", ".join(f"[{p.stem}]({rel(p)})" for p in reports)
        else:
            verdict = f"*{row.get('status', 'not yet run')}*" + (f": {row['note']}" if row.get("note") else "")
            n, report = "–", "–"
        lines.append(
            f"| {claim['paper']} | {anchor}{claim['claim']} | {claim.get('number', '–')} | {regime} | {verdict} | "
            f"{n} | {report} |"
        )
    notes = caveat_lines(claims, caveats or {})
    lines += ["", *notes] if notes else []
    return "\n".join(lines).rstrip() + "\n"


def row_counts(found: list[Found]) -> str:
    """How a row's verdicts fall, in COLORS' order: "supported 3, inconclusive 1" (secondary / exploratory ones
    counted apart)."""
    counts = Counter((f.verdict, role_mark(f)) for f in found)
    order = [*COLORS]
    keys = sorted(counts, key=lambda k: (order.index(k[0]) if k[0] in order else len(order), k))
    return ", ".join(f"{verdict}{why} {counts[verdict, why]}" for verdict, why in keys)


def _biases(found: list[Found]) -> list[str]:
    """The selection-bias remark of each study whose peak verdicts a row shows ("peak selection-biased: +0.026
    expected under no learning")."""
    out = []
    for f in found:
        b = f.study.bias
        if b and f.record.get("metric") == b["metric"]:
            out.append(f"peak selection-biased: {b['bias']:+.3f} expected under no learning (best of {b['k']})")
    return list(dict.fromkeys(out))


def row_cell(
    row: dict[str, Any],
    found: list[Found],
    caveats: dict[str, dict[str, str]] | None = None,
    studies: list[Study] | None = None,
) -> str:
    """One row of ours as the front page shows it: how its verdicts fall (the pooled family's), or "cannot be tested
    here (ESS …)", or its status; then its label and, when its regime is not the claim's, how it differs (≠)."""
    if found:
        what = row_counts(found)
    elif row.get("status") == "testbed cannot bite":
        ess = row.get("ess")
        what = "cannot be tested here" + (f" (ESS {ess})" if ess is not None else "")
    else:
        what = str(row.get("status", "not yet run"))
    differs = f"; ≠ {row['differs']}" if row.get("differs") else ""
    differs += "".join(f"; {b}" for b in _biases(found))
    if row.get("substance"):
        what = f"{render_text(row['substance'], studies) if studies is not None else row['substance']}: {what}"
    return f"{what} ({row_label(row)}{differs}){_caveat(row, caveats or {})}"


def claim_table(
    claims: list[dict[str, Any]],
    studies: list[Study],
    link: str,
    instruments: dict[str, str],
    caveats: dict[str, dict[str, str]] | None = None,
) -> list[str]:
    """The dense per-claim table (docs/paper-claims.md, "At a glance"): one row per claim, the LM testbed's rows and
    the simulator's (:func:`row_cell`, joined by " · "; "not run" when the instrument has none), the claim linking
    ``link#<claim id>``; every cell whose regime is not the claim's says how (≠)."""
    heads = " | ".join(INSTRUMENT_NAMES.get(k, k) for k in instruments)
    lines = [f"| claim (paper) | {heads} |", "|---|" + "---|" * len(instruments)]
    rows = rows_of(claims, studies)
    for claim in claims:
        cells = []
        for inst in instruments:
            mine = [
                row_cell(row, found, caveats, studies)
                for c, row, found in rows
                if c is claim and row_instrument(row) == inst
            ]
            cells.append(" · ".join(mine) if mine else "not run")
        lines.append(f"| [{claim['claim']}]({link}#{claim['id']}) ({claim['paper']}) | " + " | ".join(cells) + " |")
    notes = [w for line in caveat_lines(claims, caveats or {}) for w in wrap(line, indent="")]
    return [*lines, "", *([*notes, ""] if notes else [])]


def claim_row_keys(claims: list[dict[str, Any]], studies: list[Study]) -> set[tuple[Any, ...]]:
    """The verdicts some claim row names (``(study, claim, regime, a, b, metric, role)``)."""
    return {_key(f.study, f.record) for _, _, found in rows_of(claims, studies) for f in found}


#: The verdicts that decide a claim on the front page (negligible and inconclusive leave a claim of an effect open).
DECIDED = ("supported", "contradicted")


def _evidence(found: list[Found]) -> list[Found]:
    """The verdicts of a row that count as evidence: pooled, primary, not superseded."""
    return [f for f in found if f.pooled and not f.superseded]


def _tally(found: list[Found]) -> str:
    counts = Counter(f.verdict for f in found)
    return ", ".join(f"{v} {counts[v]}" for v in COLORS if counts.get(v))


def _effects(found: list[Found]) -> str:
    """The decided verdicts' effects: one "A − B +0.120 [+0.080, +0.160]", or their range "−0.210 … −0.090"."""
    diffs = sorted(float(f.record["diff"]) for f in found)
    if len(found) == 1:
        r = found[0].record
        return f"{r['a']} − {r['b']} {_effect(found[0])}"
    pairs = sorted({f"{f.record['a']} − {f.record['b']}" for f in found})
    a = {f.record["a"] for f in found}
    what = pairs[0] if len(pairs) == 1 else (f"{a.pop()} − {len(pairs)} arms" if len(a) == 1 else "A − B")
    return f"{what} {diffs[0]:+.3f} … {diffs[-1]:+.3f}"


def _instrument_summary(rows: list[tuple[dict[str, Any], list[Found]]]) -> str:
    """What an instrument's rows of one claim show in a few words: "cannot bite (ESS …)", "undecided (inconclusive
    3)", "not run"."""
    if not rows:
        return "not run"
    bite = [str(row["ess"]) for row, found in rows if not found and row.get("status") == "testbed cannot bite"]
    rows = [(row, found) for row, found in rows if row.get("decisive", True)]  # another comparison: not this claim's
    ev = [f for row, found in rows for f in _evidence(found)]
    parts = [f"cannot bite (ESS {' / '.join(bite)})"] if bite else []
    parts += list(
        dict.fromkeys(
            str(row.get("status", "not yet run"))
            for row, found in rows
            if not found and row.get("status") != "testbed cannot bite"
        )
    )
    if ev:
        differs = any(row.get("differs") for row, found in rows if _evidence(found))
        parts.append(f"undecided ({_tally(ev)}){' ≠' if differs else ''}")
    return "; ".join(parts) or "not run"


#: A placeholder of a generated sentence: ``{verdict:study/claim}``, ``{diff:study/claim}`` (A − B),
#: ``{-diff:study/claim}`` (B − A) or ``{effect:study/claim}`` (A − B [95 % CI]); ``/regime`` or ``/b=arm`` narrow it.
PLACEHOLDER = re.compile(r"\{(verdict|diff|-diff|effect):([^}]+)\}")


def render_text(text: str, studies: list[Study]) -> str:
    """``text`` with every placeholder (:data:`PLACEHOLDER`) filled from the primary verdict it names, as the pooled
    family shows it (the claims page's verdict): a sentence of the mapping types no number or label of its own.
    ConfigError when a placeholder names no verdict, or more than one."""

    def fill(m: re.Match[str]) -> str:
        study, claim, *rest = m.group(2).split("/")
        key: dict[str, Any] = {"study": study, "claim": claim}
        for part in rest:
            k, _, v = part.rpartition("=")
            key[k or "regime"] = v
        found = find(studies, key)
        if len(found) != 1:
            raise ConfigError(f"paper claims: {m.group(0)} names {len(found)} primary verdicts, not one")
        f, r = found[0], found[0].record
        if m.group(1) == "verdict":
            return f.verdict
        if m.group(1) == "effect":
            return _effect(f)
        return f"{float(r['diff']) * (-1 if m.group(1) == '-diff' else 1):+.3f}"

    return PLACEHOLDER.sub(fill, text)


#: How the LM testbed's definition states its defaults (prompts × samples per step, paired seeds).
_PROMPTS = re.compile(r"(\d+) prompts × (\d+) samples")
_SEEDS = re.compile(r"(\d+) fresh paired seeds")


def testbed_exceptions(studies: list[Study], text: str) -> str:
    """The testbed's definition ``text`` with the pooled LM studies whose settings differ from the defaults it states
    named at the end of the sentence that states the seeds: "... per comparison (except minpro-stale5 (n = 4);
    vllm (8 prompts × 8 samples))" (``text`` unchanged when every study matches). Seeds: the n of the study's
    primary verdicts; prompts × samples: its study file's ``base``."""
    prompts, seeds = _PROMPTS.search(text), _SEEDS.search(text)
    out = []
    for study in studies:
        prim = [r for r in study.records if r.get("role", "primary") == "primary"]
        if not study.pooled or study.instrument != "lm" or not prim:
            continue
        what = []
        src = study_file(study.name)
        base = (yaml.safe_load(src.read_text()) or {}).get("base", {}) if src is not None else {}
        if prompts is not None and isinstance(base, dict):
            p, g = base.get("rollout.prompts_per_step"), base.get("rollout.group_size")
            if (p is not None and str(p) != prompts.group(1)) or (g is not None and str(g) != prompts.group(2)):
                what.append(f"{p or prompts.group(1)} prompts × {g or prompts.group(2)} samples")
        ns = sorted({int(r["n"]) for r in prim})
        if seeds is not None and ns != [int(seeds.group(1))]:
            what.append("n = " + " / ".join(map(str, ns)))
        if what:
            out.append(f"{study.name} ({', '.join(what)})")
    if not out:
        return text
    said = " (except " + "; ".join(out) + ")"
    anchor = seeds or prompts
    end = text.find(". ", anchor.end()) if anchor is not None else -1
    return text[:end] + said + text[end:] if end >= 0 else text.rstrip(".") + said + "."


def front_page(
    claims: list[dict[str, Any]],
    studies: list[Study],
    readme: Path,
    page: Path,
    instruments: dict[str, str],
    caveats: dict[str, dict[str, str]] | None = None,
) -> list[str]:
    """The README's results block: one sentence defining the instruments (it ends the block's paragraph,
    :func:`p3o.experiments.summary.pages.render_block`), then three short lists — the claims decided on
    the LM testbed (supported or contradicted in the pooled family, with the effect), those decided only in the
    simulator, and those tested nowhere here (with the measured reason) — each claim named by its ``short`` and
    linking its row of the claims page. A row marked ``decisive: false`` (its verdicts test another comparison)
    decides nothing here; ≠ marks a regime that is not the claim's (how: docs/paper-claims.md). The count line
    follows it (:func:`p3o.experiments.summary.pages.render_block`)."""
    link = os.path.relpath(page, readme.parent)
    lines = [  # one sentence defines both instruments, ending the block's paragraph: the block stays within 25 lines
        "Testbeds — "
        + " ".join(
            f"**{INSTRUMENT_NAMES.get(k, k)}**: {testbed_exceptions(studies, v) if k == 'lm' else v}"
            for k, v in instruments.items()
        )
    ]
    rows = rows_of(claims, studies)
    marks = {name: f" {c['mark']}" for name, c in (caveats or {}).items()}

    def cav(shown: list[dict[str, Any]]) -> str:
        return "".join(dict.fromkeys(marks.get(row.get("caveat"), "") for row in shown))

    lists: dict[str, list[str]] = {"lm": [], "synthetic": [], "none": []}
    for claim in claims:
        mine = {inst: [(row, found) for c, row, found in rows if c is claim and row_instrument(row) == inst]
                for inst in ("lm", "synthetic")}  # fmt: skip
        decided = {
            inst: [
                (row, f)
                for row, found in mine[inst]
                if row.get("decisive", True)
                for f in _evidence(found)
                if f.verdict in DECIDED
            ]
            for inst in mine
        }
        paper = str(claim["paper"])
        paper = paper.removeprefix("neither (").removesuffix(")") if paper.startswith("neither (") else paper
        name = f"[{claim.get('short', claim['claim'])}]({link}#{claim['id']}) ({paper})"
        if decided["lm"]:
            found = [f for _, f in decided["lm"]]
            labels = " / ".join(dict.fromkeys(row_label(row) for row, _ in decided["lm"]))
            ne = " ≠" if any(row.get("differs") for row, _ in decided["lm"]) else ""
            sim = decided["synthetic"]
            other = f"; simulator: {_tally([f for _, f in sim])}" if sim else ""
            shown = cav([row for row, _ in decided["lm"]])
            lists["lm"].append(f"- {name}: **{_tally(found)}** ({labels}{ne}{shown}), {_effects(found)}{other}")
        elif decided["synthetic"]:
            found = [f for _, f in decided["synthetic"]]
            subst = [render_text(row["substance"], studies) for row, _ in decided["synthetic"] if row.get("substance")]
            ne = " ≠" if any(row.get("differs") for row, _ in decided["synthetic"]) else ""
            what = subst[0] if subst else f"**{_tally(found)}**, {_effects(found)}"
            shown = cav([row for row, _ in decided["synthetic"]] + [row for row, _ in mine["lm"]])
            lists["synthetic"].append(f"- {name}: {what}{ne}; LM testbed: {_instrument_summary(mine['lm'])}{shown}")
        else:
            lists["none"].append(
                f"- {name}: LM testbed {_instrument_summary(mine['lm'])}; simulator "
                f"{_instrument_summary(mine['synthetic'])}{cav([row for row, _ in mine['lm'] + mine['synthetic']])}"
            )
    heads = {
        "lm": "**Decided on the LM testbed** (pooled verdicts; ≠: the regime is not the claim's):",
        "synthetic": "**Decided only in the simulator** (the LM testbed cannot bite, or leaves it undecided):",
        "none": "**Not tested here** (decided nowhere; the measured reason):",
    }
    for key, head in heads.items():
        lines += ["", head, *(lists[key] or ["- none"])]  # a blank line first: each heading starts its own list
    return lines


def plot_forest(claims: list[dict[str, Any]], studies: list[Study], path: Path) -> Path:
    """Each verdict of the table: A − B with its 95 % CI in units of δ, against the band [−1, 1]; grouped by regime."""
    import matplotlib  # heavy start-up: only when drawing

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # heavy start-up: only when drawing

    points = []
    for _, row, found in rows_of(claims, studies):
        for f in found:
            r = f.record
            delta = r.get("margin") or math.nan
            lo, hi = r["ci"]
            scale = [x / delta if delta and math.isfinite(x) else math.nan for x in (r["diff"], lo, hi)]
            label = f"{r['a']} − {r['b']}, {r['regime']}" + (" (superseded)" if f.superseded else mark(f))
            points.append((row["regime"], label, scale, f.verdict))
    with plt.rc_context(RC):
        height = 0.18 * len(points) + 1.2
        fig, ax = plt.subplots(figsize=(12.0, height))
        # fixed margins, not tight_layout: the y labels (left) and regime names (right) keep the axis ~4 inches wide
        fig.subplots_adjust(left=0.30, right=0.62, top=1 - 0.2 / height, bottom=0.9 / height)
        ax.axvspan(-1, 1, color="#d9d9d9", lw=0)
        ax.axvline(0, color="black", lw=0.6)
        last = None
        for i, (regime, _label, (d, lo, hi), verdict) in enumerate(points):
            y = -i
            ax.plot([lo, hi], [y, y], color=COLORS[verdict], lw=1.2)
            ax.plot([d], [y], "o", color=COLORS[verdict], ms=3)
            if regime != last:
                ax.axhline(y + 0.5, color="#bdbdbd", lw=0.4)
                ax.text(1.01, y, regime, transform=ax.get_yaxis_transform(), fontsize=6, va="center")
                last = regime
        ax.set_yticks([-i for i in range(len(points))], [p[1] for p in points], fontsize=6)
        ax.set_xscale("symlog", linthresh=2)
        ax.set_xlabel("A − B in units of the study's margin δ (grey band: |effect| < δ); colour: verdict")
        handles = [plt.Line2D([], [], color=c, marker="o", lw=1.2, ms=3) for c in COLORS.values()]
        fig.legend(handles, list(COLORS), fontsize=6, loc="lower right", ncol=4)
        ax.set_ylim(-len(points) + 0.5, 0.5)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, format="png", metadata={"Software": None})
        plt.close(fig)
    return path
