"""Comparatives: every sentence of a results page that orders two arms needs a verdict that orders them so.

An **ordering** is a phrase of the lexicon (:data:`LEXICON`: ``-er than``, more / less … than, beats, wins,
outperforms, trails, degrades, holds up, falls further, ahead / behind, above / below, best / worst, highest /
lowest, rank, …) between two **arms** the sentence names (:data:`ARMS`: P3O, GRPO ε 0.2, MinPRO, decoupled PPO,
k3_is, …; each name maps to the objective labels of the verdict files). For each ordering the arm named last
before the phrase is X and the first named after it is Y; the phrase says X > Y (``+``) or X < Y (``−``). A
superlative (best, worst, highest, lowest, rank, least, most, furthest) orders its X against **every** other arm the
sentence names, and with no other arm named it orders X against arms the sentence does not name: refused.

An ordering is **backed** by a verdict of the same pair in the same direction, decided in the family the page cites:
the pooled family's *supported* / *contradicted* (:func:`p3o.experiments.summary.pages.pool`), or, where the sentence
says so ("in-study", "exploratory", "not pooled"), the own verdict of a study outside the pooled family; a
*better* claim A > B supported orders A above B, contradicted B above A (*worse* the reverse); *negligible*, *tracks*
and *inconclusive* order nothing. The sentence's instrument is the simulator when it says so ("simulator",
"synthetic", "toy"), else the LM testbed; a regime cue ("lag 10", "stale-64", "n = 2", "FP8", "vLLM",
"temperature") narrows the backing verdicts to the regimes or studies that carry it. A negated ordering ("not",
"no", "never", "neither") and a paper's own claim (link text into docs/paper-claims.md, a table's claim and
paper's-number columns, a sentence that attributes it: "the paper", "the papers'", "claims") order nothing.

Each ordering of a sentence needs its own backing: a sentence with several comparisons is refused when any one is
unbacked (:func:`unbacked`).

    python -m p3o.experiments.summary.statements README.md docs/findings.md docs/paper-claims.md
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from p3o.experiments.summary.pages import Study, pool, superseded

#: Arm names as the pages write them (regex, case-sensitive where the name is an acronym) → the verdict files'
#: objective labels they stand for. Longer, more specific names first: the first match at a position wins.
ARMS: list[tuple[str, tuple[str, ...]]] = [
    (r"P3O[- ]k3_is|P3O with (?:the )?k3_is|\bk3_is\b", ("p3o-k3_is",)),
    (r"P3O[- ]clip|P3O with (?:a )?(?:sign-following )?clip cap", ("p3o-clip",)),
    (r"P3O[- ]k2\b", ("p3o-k2",)),
    (r"P3O[- ]PG\b|P3O[- ]pg\b|(?:its )?policy-gradient term", ("p3o-pg",)),
    (r"\bP4O\b|two[- ]anchor(?:s| P3O)?", ("p3o-two-anchor",)),
    (r"\bP3O\b(?: \(k3\))?", ("p3o",)),
    (r"GRPO (?:at )?(?:ε ?=? ?|eps )0\.2|GRPO \(token-mean, ε = 0\.2\)|\bε 0\.2\b", ("grpo-tm-0.2",)),
    (r"GRPO (?:at )?(?:ε ?=? ?|eps )0\.4|\bε 0\.4\b", ("grpo-tm-0.4",)),
    (r"GRPO (?:at )?(?:ε ?=? ?|eps )0\.6|\bε 0\.6\b", ("grpo-tm-0.6",)),
    (r"GRPO with token-TIS|token-TIS|\bTIS\b", ("grpo-tm-tis", "grpo-tm-seq-tis")),
    (r"\bIcePop\b", ("grpo-tm-icepop",)),
    (r"decoupled (?:PPO|GRPO)", ("decoupled-ppo-0.2",)),
    (r"clip-higher(?: 0\.2/0\.28)?|the MinPRO paper's GRPO", ("grpo-minpro",)),
    (r"\bGRPO\b", ("grpo-tm-0.2", "grpo-tm-0.4", "grpo-tm-0.6", "grpo-minpro")),
    (r"MinPRO[- ]mean\b|(?<=min against )mean", ("minpro-mean", "minpro-mean-incl")),
    (r"MinPRO[- ]geomean\b", ("minpro-geomean", "minpro-geomean-incl")),
    (r"MinPRO[- ]prod\b", ("minpro-prod",)),
    (r"\bMinPRO\b", ("minpro-1-4",)),
    (r"\bCISPO\b", ("cispo-1-4",)),
    (r"\bGSPO\b", ("gspo-2e-3",)),
    (r"\bM2PO\b", ("m2po-0.04", "m2po-clip-0.04")),
    (r"\bAsymRE\b", ("asymre", "asymre-minpro")),
    (r"\bSAPO\b", ("sapo",)),
    (r"\bKL-Cov\b", ("kl_cov",)),
    (r"\bClip-Cov\b", ("clip_cov",)),
    (r"\bDPPO\b", ("dppo",)),
    (r"\bGPG\b", ("gpg",)),
    (r"\bGMPO\b", ("gmpo",)),
    (r"\bTOPR\b", ("topr",)),
    (r"\bDRO\b", ("dro-0.1",)),
]
_ARM = re.compile("|".join(f"(?P<a{i}>{pattern})" for i, (pattern, _) in enumerate(ARMS)))

#: Comparative phrases → direction (+1: X above Y, −1: X below Y). "-er than" is any word ending in -er before
#: "than" (its direction −1 for the words in :data:`DOWN`).
LEXICON: list[tuple[str, int]] = [
    (r"\b\w+er than\b", +1),
    (r"\bmore \w+ than\b", +1),
    (r"\bless \w+ than\b", -1),
    (r"\b(?:beats?|beating|wins?|winning|outperforms?|outperformed|outscores?|leads?|edges? out)\b", +1),
    (r"\bholds? up (?:better )?(?:than|against|where)\b", +1),
    (r"\b(?:is |ends |stays |remains |sits )?(?:ahead of|above)\b", +1),
    (r"\b(?:trails?|trailing|behind|below|lags? behind|loses? to|degrades? more than|falls? further than)\b", -1),
    (r"\b(?:falls? further|degrades? more)\b", -1),
]
#: "-er than" words that order downwards.
DOWN = {"lower", "worse", "slower", "fewer", "weaker", "poorer", "smaller"}
#: Superlatives: X against every other arm the sentence names.
SUPERLATIVE = re.compile(
    r"\b(?P<w>best|worst|highest|lowest|ranked|ranking|ranks? (?:first|last|above|below|ahead|behind|the)|"
    r"(?:fell|falls?|fall) least|least|most|furthest|at the top|tops)\b",
    re.IGNORECASE,
)
_DOWN_SUPER = {"worst", "lowest", "furthest"}
#: What after a superlative makes it no order of arms: a selection ("best ε", "best checkpoint", "best of k").
NOT_AN_ORDER = re.compile(
    r"\s*(?:ε|eps\b|checkpoint|of \d|of k\b|-of-k|in-loop|peak|evaluation|step|case|-case|micro-batch|batch|row|token)"
)
NEGATION = re.compile(r"\b(?:not|no|never|neither|nor|none|without|whether)\b|n't\b", re.IGNORECASE)
#: A sentence that reports what a paper or a hypothesis says (its orderings are the paper's, not ours).
ATTRIBUTED = re.compile(
    r"\bthe (?:P3O |MinPRO )?papers? (?:says?|reports?|claims?|finds?|found|shows?|headline)\b|\bclaims? that\b|"
    r"\bclaimed\b|\bhypothes[ie]s\b|\bpre-registered (?:that|claim)\b",
    re.IGNORECASE,
)
#: "No verdict for X survives pooling" (issue 53): refused while a pooled verdict of X in the sentence's regime is
#: decided or negligible.
SURVIVES = re.compile(r"\bno verdict (?:for|of) (?P<arm>.+?) survives pooling", re.IGNORECASE)
IN_STUDY = re.compile(r"in-study|in the study's|within the study|exploratory|not pooled", re.IGNORECASE)
SIMULATOR = re.compile(r"\b(?:simulator|synthetic|toy)\b", re.IGNORECASE)
#: Regime cues: a sentence naming one is backed only by verdicts whose regime or study carries it.
CUES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"\blag (?:of )?(\d+)\b"), r"lag-?{0}\b|lag{0}"),
    (re.compile(r"\bstale-(\d+)\b"), r"stale-?{0}\b|stale{0}"),
    (re.compile(r"\bn = (\d+)\b"), r"stale-{0}\b|noise|minpro-stale"),
    (re.compile(r"\bFP8\b|\bmismatched engine\b"), r"fp8"),
    (re.compile(r"\bvLLM\b"), r"vllm"),
    (re.compile(r"\btemperature\b|\bT = 1\.2\b"), r"temp"),
]
#: A study report the paragraph links (docs/results/<study>.md): its orderings are that study's.
CITED = re.compile(r"results/([\w.-]+?)\.md")
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z*(\[])|\n\s*\n|\n(?=- |#|\|)|<br>")


@dataclass(frozen=True)
class Order:
    """One ordering a sentence states: arm X above (+1) or below (−1) arm Y, by ``phrase``."""

    x: tuple[str, ...]
    y: tuple[str, ...]
    sign: int
    phrase: str
    x_text: str
    y_text: str


def arms_in(text: str) -> list[tuple[int, int, str, tuple[str, ...]]]:
    """(start, end, name as written, labels) of every arm name in ``text``, in order."""
    out = []
    for m in _ARM.finditer(text):
        i = next(int(k[1:]) for k, v in m.groupdict().items() if v is not None)
        out.append((m.start(), m.end(), m.group(0), ARMS[i][1]))
    return out


def orders_in(sentence: str) -> list[Order]:
    """Every ordering of two arms ``sentence`` states (:data:`LEXICON`, :data:`SUPERLATIVE`); negated ones and
    those with no arm on one side are left out (a superlative with one arm gets Y = () : unbacked)."""
    arms = arms_in(sentence)
    out: list[Order] = []
    for pattern, sign in LEXICON:
        for m in re.finditer(pattern, sentence, re.IGNORECASE):
            if any(a0 < m.end() and m.start() < a1 for a0, a1, _, _ in arms):
                continue  # inside an arm's name
            before = [a for a in arms if a[1] <= m.start()]
            after = [a for a in arms if a[0] >= m.end()]
            if not before or not after:
                continue
            clause, gap = sentence[before[-1][1] : m.start()], sentence[m.end() : after[0][0]]
            if NEGATION.search(clause[-24:]) or re.search(r"[;:]", clause) or len(clause) > 80:
                continue
            if re.search(r"[;:()]|\bbase\b|step-0|\bpolicy\b", gap) or len(gap) > 60:
                continue  # Y is not the phrase's other side ("above the base (0.731); ... MinPRO")
            word = m.group(0).split()[0].lower()
            s = -sign if pattern.startswith(r"\b\w+er than") and word in DOWN else sign
            x, y = before[-1], after[0]
            if set(x[3]) & set(y[3]):
                continue
            if not any((o.x, o.y, o.sign) == (x[3], y[3], s) for o in out):
                out.append(Order(x[3], y[3], s, m.group(0), x[2], y[2]))
    for m in SUPERLATIVE.finditer(sentence):
        if NOT_AN_ORDER.match(sentence, m.end()) or re.search(
            r"\bat $|\bthe $", sentence[max(0, m.start() - 3) : m.start()]
        ):
            continue  # "best ε" (a selection), "best of 5", "at most", "at least"
        if m.group("w").lower() in ("most", "least") and re.match(r" [a-z]", sentence[m.end() : m.end() + 2]):
            continue  # a quantifier ("most advantages"), not "changes the update most"
        before = [a for a in arms if a[1] <= m.start()]
        if not before:  # the arms come after ("the two that fell least ...: GSPO ... AsymRE"): against the unnamed
            out += [Order(a[3], (), +1, m.group(0), a[2], "arms the sentence does not name") for a in arms[:1]]
            continue
        if NEGATION.search(sentence[before[-1][1] : m.start()][-24:]):
            continue
        x = before[-1]
        sign = -1 if m.group("w").lower() in _DOWN_SUPER else +1
        others = list({a[3]: a for a in arms if not set(a[3]) & set(x[3])}.values())
        if not others:
            out.append(Order(x[3], (), sign, m.group(0), x[2], "arms the sentence does not name"))
        out += [Order(x[3], o[3], sign, m.group(0), x[2], o[2]) for o in others]
    return out


def _direction(r: dict[str, Any], verdict: str) -> int:
    """+1 when the verdict orders its A above its B, −1 below, 0 when it orders nothing."""
    if verdict not in ("supported", "contradicted") or r["kind"] not in ("better", "worse"):
        return 0
    up = (r["kind"] == "better") == (verdict == "supported")
    return 1 if up else -1


@dataclass
class Backing:
    """The decided orderings the verdict files hold: (A, B, direction, instrument, study, regime) per verdict."""

    pooled: list[tuple[str, str, int, str, str, str]]
    in_study: list[tuple[str, str, int, str, str, str]]
    labels: list[tuple[str, str, str, str, str]]
    """(A, B, pooled label, study, regime) of each pooled verdict labelled other than inconclusive."""

    @classmethod
    def of(cls, studies: list[Study]) -> Backing:
        """Pooled: the pooled family's decided primary verdicts; in-study: the decided verdicts of the studies outside
        it (exploratory, failed bite), which back a sentence only where it says so."""
        pooled = [
            (r["a"], r["b"], _direction(r, r["verdict_pool"]), s.instrument, s.name, str(r["regime"]))
            for s, r in pool(studies)
        ]
        own = [  # the studies outside the pooled family: a pooled study's verdicts are cited as the family decides
            (r["a"], r["b"], _direction(r, r["verdict"]), s.instrument, s.name, str(r["regime"]))
            for s in studies
            if not s.pooled
            for r in s.records
            if not superseded(r)
        ]
        labels = [
            (r["a"], r["b"], r["verdict_pool"], s.name, str(r["regime"]))
            for s, r in pool(studies)
            if r["verdict_pool"] != "inconclusive"
        ]
        return cls([p for p in pooled if p[2]], [p for p in own if p[2]], labels)

    def survival(self, sentence: str) -> list[str]:
        """A problem when the sentence says no verdict for an arm survives pooling while the pooled family decides
        one (supported, contradicted or negligible) in the sentence's regime cues."""
        m = SURVIVES.search(sentence)
        arms = arms_in(m.group("arm")) if m else []
        if not arms:
            return []
        cues = _cued(sentence)
        kept = [
            f"{a} − {b} ({regime}): {v}"
            for a, b, v, study, regime in self.labels
            if (a in arms[0][3] or b in arms[0][3]) and all(c.search(f"{study} {regime}") for c in cues)
        ]
        return [f"'{sentence[:200]}': pooled verdicts of {arms[0][2]} survive: {'; '.join(kept)}"] if kept else []

    def backs(self, order: Order, sentence: str, simulator: bool = False, cited: set[str] | None = None) -> bool:
        """Whether a decided verdict orders ``order``'s pair in its direction, in the family and instrument the
        sentence cites (``simulator``: its paragraph is about the simulator), a regime that carries each of its
        cues and, when its paragraph links reports of studies on that instrument (``cited``: their names), one of
        those studies."""
        family = self.pooled + (self.in_study if IN_STUDY.search(sentence) else [])
        inst = "synthetic" if simulator or SIMULATOR.search(sentence) else "lm"
        cues = _cued(sentence)
        mine = {study for _, _, _, instrument, study, _ in family if instrument == inst} & (cited or set())
        for a, b, d, instrument, study, regime in family:
            if instrument != inst or not all(c.search(f"{study} {regime}") for c in cues):
                continue
            if mine and study not in mine:
                continue
            if (a in order.x and b in order.y and d == order.sign) or (
                b in order.x and a in order.y and d == -order.sign
            ):
                return True
        return False


def _cued(sentence: str) -> list[re.Pattern[str]]:
    """The regime cues of a sentence (:data:`CUES`) as patterns over "study regime"."""
    return [re.compile(tpl.format(*m.groups()), re.IGNORECASE) for cue, tpl in CUES for m in cue.finditer(sentence)]


def _claims_free(text: str) -> str:
    """``text`` without the papers' own claims: link texts into docs/paper-claims.md and the claim / paper's-number
    columns of its tables (their cells blanked)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*paper-claims\.md#[^)]*\)", "[claim]", text)
    out, skip = [], set()
    for line in text.split("\n"):
        if line.startswith("|"):
            cells = re.split(r"(?<!\\)\|", line)
            if not skip and not re.match(r"^\|[-:| ]+\|$", line):
                heads = [c.strip() for c in cells]
                skip = {i for i, h in enumerate(heads) if h in ("claim", "the paper's number", "claim (paper)")}
                skip.add(-1)
            cells = [" " if i in skip else c for i, c in enumerate(cells)]
            out.append("|".join(cells))
        else:
            skip = set()
            out.append(line)
    return "\n".join(out)


def sentences(text: str) -> list[tuple[str, str]]:
    """The page's sentences (and table cells, list items, headings), each on one line, with the paragraph or list
    item (or table row) it sits in."""
    text = re.sub(r"<!--.*?-->", " ", _claims_free(text), flags=re.S)
    text = re.sub(r"`[^`]*`", "code", text)
    out = []
    for block in re.split(r"\n\s*\n|\n(?=- |#|\|)", text):
        for part in SENTENCE_END.split(block):
            for cell in re.split(r"(?<!\\)\|", part):
                flat = " ".join(cell.split())
                if flat:
                    out.append((flat, block))
    return out


def unbacked(text: str, backing: Backing) -> list[str]:
    """One problem per sentence of ``text`` that states an ordering no verdict backs (each ordering checked)."""
    problems = []
    for sentence, block in sentences(text):
        problems += backing.survival(sentence)
        sentence = re.sub(r'"[^"]*"|“[^”]*”', '"…"', sentence)  # a quoted claim orders nothing
        if ATTRIBUTED.search(sentence):
            continue
        sim = bool(SIMULATOR.search(block[:200]))  # the paragraph or list item says what it is about first
        cited = set(CITED.findall(block))
        bad = [o for o in orders_in(sentence) if not backing.backs(o, sentence, sim, cited)]
        if bad:
            said = "; ".join(f"{o.x_text} {'above' if o.sign > 0 else 'below'} {o.y_text} ('{o.phrase}')" for o in bad)
            problems.append(f"'{sentence[:200]}': no decided verdict orders {said}")
    return problems
