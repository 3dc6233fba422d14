"""The README block's closing sentence, generated: what the pooled verdicts say of the LM testbed in words, that the
pooled family includes the simulator's verdicts, and which verdicts an LM-only family would decide otherwise.

An **LM-only family** is the pooled family (:func:`p3o.experiments.summary.pages.pool`) of the LM studies alone: the
same verdicts, Holm-adjusted over m_LM instead of m_LM + m_sim tests, so a p-value can cross α; :func:`lm_only_flips`
lists each verdict whose label differs between the two families (computed, never typed).

    text = closing_words(claims, studies, caveats)
"""

from __future__ import annotations

from typing import Any

from p3o.experiments.summary.claims import DECIDED, _evidence, row_instrument, rows_of
from p3o.experiments.summary.pages import INSTRUMENT_NAMES, Study, effect_text, pool

#: The claims' ``paper`` values that are claims of either paper (the others are this project's own questions).
PAPERS = ("P3O", "MinPRO", "both")


def _key(study: Study, r: dict[str, Any]) -> tuple[Any, ...]:
    return (study.name, *(r.get(k) for k in ("claim", "regime", "a", "b", "metric", "role")))


def lm_only_flips(studies: list[Study]) -> list[tuple[Study, dict[str, Any], dict[str, Any]]]:
    """(study, pooled record, LM-only record) for each pooled LM verdict whose label an LM-only Holm family decides
    otherwise (``verdict_pool`` / ``p_pool`` of each)."""
    full = {_key(s, r): r for s, r in pool(studies)}
    lm = pool([s for s in studies if s.instrument == "lm"])
    return [(s, full[_key(s, r)], r) for s, r in lm if r["verdict_pool"] != full[_key(s, r)]["verdict_pool"]]


def _names(claims: list[dict[str, Any]]) -> str:
    names = [f'"{c.get("short", c["claim"])}"' for c in claims]
    return ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else (names[0] if names else "")


def lm_sentence(claims: list[dict[str, Any]], studies: list[Study]) -> str:
    """What the pooled verdicts say of the papers' claims on the LM testbed: which they support and contradict."""
    rows = rows_of(claims, studies)
    said: dict[str, list[dict[str, Any]]] = {v: [] for v in DECIDED}
    for claim in claims:
        if str(claim["paper"]) not in PAPERS:
            continue
        verdicts = {
            f.verdict
            for c, row, found in rows
            if c is claim and row_instrument(row) == "lm" and row.get("decisive", True)
            for f in _evidence(found)
        }
        for v in DECIDED:
            if v in verdicts:
                said[v].append(claim)
    sup, con = said["supported"], said["contradicted"]
    head = (
        "on the LM testbed the pooled verdicts support **no claim of either paper**"
        if not sup
        else f"on the LM testbed the pooled verdicts support {len(sup)} claim{'s' if len(sup) != 1 else ''} of the "
        f"papers ({_names(sup)})"
    )
    return head + (f" and contradict {len(con)} ({_names(con)})" if con else "")


def closing_words(
    claims: list[dict[str, Any]], studies: list[Study], caveats: dict[str, dict[str, str]] | None = None
) -> str:
    """The block's closing sentence (one paragraph with the count line): the LM sentence (:func:`lm_sentence`), what
    the pooled family includes, the verdicts an LM-only family would flip (:func:`lm_only_flips`), then each caveat
    mark the lists carry with its ``short`` text."""
    pooled = pool(studies)
    other = {s.instrument for s, _ in pooled} - {"lm"}
    parts = [f"{INSTRUMENT_NAMES.get(i, i)}'s {sum(s.instrument == i for s, _ in pooled)}" for i in sorted(other)]
    n_lm = sum(s.instrument == "lm" for s, _ in pooled)
    flips = lm_only_flips(studies)
    said = [
        f"{s.name} {r['a']} − {r['b']} ({r['regime']}, {r['metric']}) {effect_text(r)}: {r['verdict_pool']} "
        f"(Holm p {r['p_pool']:.3g}) → {lm['verdict_pool']} (LM-only adjusted p {lm['p_pool']:.3g})"
        for s, r, lm in flips
    ]
    flip = (
        f"{len(flips)} verdict{'s' if len(flips) != 1 else ''} would flip: " + "; ".join(said)
        if flips
        else "no verdict would flip"
    )
    text = (
        f"**In words**: {lm_sentence(claims, studies)}. These labels come from one Holm family that also holds the "
        f"{' and '.join(parts) or 'no other'} verdicts; in an LM-only family of its {n_lm} verdicts {flip}."
    )
    used = dict.fromkeys(row.get("caveat") for c in claims for row in c["rows"] if row.get("caveat"))
    for name in used:
        cav = (caveats or {}).get(str(name))
        if cav:
            text += f" {cav['mark']} {cav.get('short', cav['text'])}."
    return text
