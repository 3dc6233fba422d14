"""Hold every results sentence of a docs page against the verdict files: a verdict word may only say what the
verdict files say, with the scope they say it in.

A *statement* is an effect with its interval as the reports print it, ``−0.086 [−0.123, −0.048]``, and the first
verdict word after it in the same sentence (supported, contradicted, negligible, inconclusive). Each effect is
looked up in the verdict files (diff and interval equal at three decimals). Rules, checked by :func:`problems`:

1. an effect no verdict file has may not carry a verdict word;
2. a verdict of the pooled Holm family (confirmatory, primary; :func:`p3o.experiments.summary.pages.pool`) is called
   what the pooled family says; a different word is allowed only when the sentence calls it in-study ("in-study",
   "in the study's ... family", "within the study") and it is the study's own verdict, and the sentence also says
   "pooled" (so the pooled verdict is in view);
3. a verdict outside the pooled family (exploratory, secondary, a study that failed its bite condition) is called
   what its study says, and the sentence says why it is not pooled ("exploratory", "secondary", "not pooled",
   "in-study", "reported", "did not bite");
4. a bold phrase that asserts an order or a match ("beats", "ahead", "below", "above", "holds", "level with",
   "tracks", "matches", ...) right before an effect is allowed only where the pooled family decides it (supported or
   contradicted): an in-study result is not a headline;
5. "ends level with", "matches" or "tracks" right before an effect needs a supported *tracks* or a negligible
   verdict;
6. a verdict that a later study superseded (a recorded amendment; out of the pooled family) is named with its verdict
   word only in a sentence that says "superseded";
7. phrases that the issue found overclaiming ("barely moves", "barely matters", "ranking is reversed") and counts of
   the pooled family that are not its size ("of all 155 confirmatory verdicts") are refused;
8. a sentence that orders two arms (above, below, ahead, behind, beats, best, falls furthest, reverse, edge, ...)
   and prints effects must cite one the pooled family decides (supported or contradicted); one that says they match
   ("level", "separate", "no worse", "does not lose") one it calls negligible or a supported *tracks*; effects
   outside the pooled family (exploratory, a failed bite condition) may be ordered only where the sentence says so.
   Without an effect, the strong order phrases ("falls furthest", "the best arm", "the reverse of", "X's edge",
   "ahead of every", "no worse", "does not lose", "does not separate", "level with", "only X holds", ...) are refused:
   an order is stated only with the verdict that decides it (issue 46);
9. a "Holm p 0.051" in a sentence must equal (at its printed digits) the pooled or in-study Holm p of an effect the
   sentence prints.

    found = problems(text, verdict_index(all_studies, pooled_studies), pooled_size)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from p3o.experiments.summary.pages import Study, pool, superseded

VERDICT_WORDS = ("supported", "contradicted", "negligible", "inconclusive")
EFFECT = re.compile(r"([+\-−]\d+\.\d{3}) \[([+\-−]\d+\.\d{3}), ([+\-−]\d+\.\d{3})\]")
_WORD = re.compile(r"\b(supported|contradicted|negligible|inconclusive)\b")
_END = re.compile(r"\.\s|\.$|<br>| \| |\n\n|\n- ")
IN_STUDY = re.compile(r"in-study|in the study's (own )?(holm )?family|within the study|in the study\b", re.IGNORECASE)
NOT_POOLED = re.compile(
    r"exploratory|secondary|not pooled|in-study|reported|did not bite|not a verdict|the study's|superseded",
    re.IGNORECASE,
)
ORDER = re.compile(
    r"\b(beats?|ahead|below|above|holds?|level with|tracks?|matches|falls? furthest|reversed)\b", re.IGNORECASE
)
LEVEL = re.compile(r"(ends level with|\bmatches\b|\btracks\b)[^.()]{0,60}$", re.IGNORECASE)
FORBIDDEN = {
    "barely moves": "an undecided spread is not 'barely moves' (no equivalence test decided it)",
    "barely matters": "an undecided spread is not 'barely matters' (no equivalence test decided it)",
    "ranking is reversed": "a ranking is 'reversed' only where the pooled verdicts say so; name each verdict instead",
}
#: Words that order two arms (rule 8), and the ones among them that say the two match.
ORDERS = re.compile(
    r"\b(above|below|ahead|behind|beats?|best|furthest|reversed?|reverse of|edge|level|separates?|no worse|"
    r"does not lose|outperforms?|worse than|better than)\b",
    re.IGNORECASE,
)
MATCHES = re.compile(r"\b(level|separates?|no worse|does not lose)\b", re.IGNORECASE)
#: Order phrases refused in a sentence that prints no effect (rule 8).
BARE_ORDER = re.compile(
    r"falls? furthest|\bthe best arm\b|\bthe reverse of\b|\b\w+(?:'s|s') edge\b|\bedge (?:over|under)\b|"
    r"\b(?:ahead of|above|below) every\b|\bis no worse\b|\bdoes not lose\b|\bdoes not separate\b|\blevel with\b|"
    r"\bonly \w+ holds\b|\bis ahead\b",
    re.IGNORECASE,
)
#: Orders against the base policy or the step-0 policy are not orders of two arms.
BASE = re.compile(r"\b(?:above|below) (?:the|its|their) (?:base|step-0 policy)\b|\b(?:above|below) it\b")
HOLM_P = re.compile(r"Holm p (\d+\.\d+)")
COUNT = re.compile(r"(?:family of (?:all )?|across all |family (?:of|across) )(\d+)(?: confirmatory)? verdicts")


def _num(text: str) -> float:
    return float(text.replace("−", "-"))


@dataclass
class Known:
    """One verdict record a statement may refer to."""

    study: Study
    record: dict[str, Any]
    pooled: str | None
    """The pooled family's verdict (None: not in the pooled family)."""
    p_pool: float | None = None
    """The pooled family's Holm p (None: not in the pooled family)."""


def verdict_index(studies: list[Study], pooled_studies: list[Study]) -> dict[tuple[str, str, str], list[Known]]:
    """Every record of ``studies`` by its effect as printed (diff, lo, hi at three decimals); the pooled verdict of
    those in the pooled family of ``pooled_studies`` (the summary's verdict files)."""
    pooled = {(s.name, id(r0)): r for s, r0, r in _pooled_with_source(pooled_studies)}
    out: dict[tuple[str, str, str], list[Known]] = {}
    by_name = {s.name: s for s in pooled_studies}
    for study in studies:
        source = by_name.get(study.name, study)
        for r in source.records:
            lo, hi = r["ci"]
            try:
                key = (f"{float(r['diff']):+.3f}", f"{float(lo):+.3f}", f"{float(hi):+.3f}")
            except (TypeError, ValueError):
                continue
            p = pooled.get((study.name, id(r)))
            out.setdefault(key, []).append(
                Known(source, r, p["verdict_pool"] if p else None, p["p_pool"] if p else None)
            )
    return out


def _pooled_with_source(studies: list[Study]) -> list[tuple[Study, dict[str, Any], dict[str, Any]]]:
    """(study, original record, pooled copy) for every member of the pooled family."""
    members = pool(studies)
    originals = [
        (s, r)
        for s in studies
        if s.pooled
        for r in s.records
        if r.get("role", "primary") == "primary" and not superseded(r)
    ]
    return [(s, r0, r) for (s, r0), (_, r) in zip(originals, members)]


def _sentence(text: str, start: int, end: int) -> tuple[int, int]:
    """The sentence around text[start:end]: from after the previous sentence end to the next one."""
    before = [m.end() for m in _END.finditer(text, 0, start)]
    after = _END.search(text, end)
    return (before[-1] if before else 0), (after.start() if after else len(text))


def problems(text: str, index: dict[tuple[str, str, str], list[Known]], pooled_size: int) -> list[str]:
    """Every statement of ``text`` that says more (or other) than the verdict files (the rules of the module)."""
    out = []
    flat = re.sub(r"[ \t]*\n[ \t]*", " ", text)  # a line break and its indent: one space
    for phrase, why in FORBIDDEN.items():
        if phrase in flat.lower():
            out.append(f"'{phrase}': {why}")
    for m in COUNT.finditer(flat):
        if int(m.group(1)) != pooled_size:
            out.append(f"'{m.group(0)}': the pooled family has {pooled_size} verdicts (count from the files)")
    effects = list(EFFECT.finditer(flat))
    out += _order_problems(flat, effects, index)
    for i, m in enumerate(effects):
        s0, s1 = _sentence(flat, m.start(), m.end())
        stop = min(s1, effects[i + 1].start()) if i + 1 < len(effects) else s1
        word_m = _WORD.search(flat, m.end(), s1)
        # the effect's verdict word: the first one after it; past the next effect only when the two share it (joined
        # by "and" / "," / "/" alone, as in "+0.127 [...] and +0.155 [...]: supported")
        if word_m and word_m.start() > stop and re.search(r"[;()]", flat[m.end() : stop]):
            word_m = None
        word = word_m.group(1) if word_m else None
        sentence = flat[s0:s1]
        key = tuple(f"{_num(g):+.3f}" for g in m.groups())
        known = index.get(key, [])
        where = f"'{flat[max(s0, m.start() - 60) : min(s1, m.end() + 60)].strip()}'"
        if not known:
            if word and word_m.start() < stop:
                out.append(f"{where}: '{word}' on an effect no verdict file has")
            continue
        in_study = bool(IN_STUDY.search(flat, m.end(), s1)) or bool(IN_STUDY.search(sentence))
        pooled = [k for k in known if k.pooled is not None]
        if word:
            if pooled:
                ok = any(k.pooled == word for k in pooled) or (
                    in_study and "pooled" in sentence and any(k.record["verdict"] == word for k in pooled)
                )
                if not ok:
                    want = "/".join(sorted({k.pooled for k in pooled}))
                    out.append(
                        f"{where}: called '{word}', the pooled family says '{want}' (or say in-study and pooled)"
                    )
            else:
                ok = any(k.record["verdict"] == word for k in known) and bool(NOT_POOLED.search(sentence))
                if all(k.record.get("superseded") for k in known) and "superseded" not in sentence.lower():
                    by = known[0].record["superseded"].get("by")
                    out.append(f"{where}: called '{word}', but {by} superseded it (say superseded)")
                elif not ok:
                    want = "/".join(sorted({k.record["verdict"] for k in known}))
                    out.append(f"{where}: called '{word}' outside the pooled family (its study: '{want}'; say why)")
        lead = flat[max(s0, m.start() - 160) : m.start()]
        bold = re.findall(r"\*\*([^*]+)\*\*[^*]{0,40}$", lead)
        decided = any(k.pooled in ("supported", "contradicted") for k in pooled)
        if bold and ORDER.search(bold[-1]) and not decided:
            out.append(f"{where}: the bold '{bold[-1]}' asserts what the pooled family leaves undecided")
        if LEVEL.search(lead) and not any(
            k.record["verdict"] == "negligible"
            or (k.record["kind"] == "tracks" and k.record["verdict"] == "supported")
            for k in known
        ):
            out.append(f"{where}: 'level' / 'matches' / 'tracks' needs a supported tracks or a negligible verdict")
    return out


def _order_problems(
    flat: str, effects: list[re.Match[str]], index: dict[tuple[str, str, str], list[Known]]
) -> list[str]:
    """Rules 8 and 9, sentence by sentence."""
    out = []
    spans: dict[tuple[int, int], list[re.Match[str]]] = {}
    for m in effects:
        spans.setdefault(_sentence(flat, m.start(), m.end()), []).append(m)
    for (s0, s1), found in spans.items():
        sentence = flat[s0:s1]
        known = [k for m in found for k in index.get(tuple(f"{_num(g):+.3f}" for g in m.groups()), [])]
        where = f"'{sentence.strip()[:160]}'"
        words = {w.lower() for w in ORDERS.findall(BASE.sub("", sentence))}
        if words and known:
            pooled = [k.pooled for k in known if k.pooled is not None]
            match = any(
                k.pooled == "negligible" or (k.record["kind"] == "tracks" and k.pooled == "supported") for k in known
            )
            order = any(v in ("supported", "contradicted") for v in pooled)
            ok = (match and bool(MATCHES.search(sentence))) or (order and bool(words - {"level", "separate",
                  "separates", "no worse", "does not lose"}))  # fmt: skip
            if not ok and not pooled and NOT_POOLED.search(sentence):
                ok = True  # outside the pooled family, and the sentence says so
            if not ok:
                out.append(
                    f"{where}: '{sorted(words)[0]}' orders arms, but no effect it prints is decided so in the pooled "
                    "family (cite a pooled supported / contradicted verdict, or negligible / tracks for a match)"
                )
        for h in HOLM_P.finditer(sentence):
            digits = len(h.group(1).split(".")[1])
            ps = [float(x) for k in known for x in (k.record.get("p_adj"), _pooled_p(k)) if x is not None]
            if not any(abs(p - float(h.group(1))) < 0.5 * 10**-digits for p in ps):
                out.append(f"{where}: 'Holm p {h.group(1)}' is no Holm p of the effects it prints (the files: "
                           f"{', '.join(f'{p:.3g}' for p in ps) or 'none'})")  # fmt: skip
    for m in BARE_ORDER.finditer(flat):
        s0, s1 = _sentence(flat, m.start(), m.end())
        if (s0, s1) in spans:
            continue
        out.append(
            f"'{flat[max(s0, m.start() - 60) : min(s1, m.end() + 60)].strip()}': '{m.group(0)}' states an order "
            "with no verdict (print the effect the pooled family decides)"
        )
    return out


def _pooled_p(k: Known) -> float | None:
    return k.p_pool
