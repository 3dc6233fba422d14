"""Verdicts of decisive claims: one claim type (:class:`p3o.experiments.spec.Claim`), one ``decide`` for every
instrument, one verdict record and one verdict table.

An instrument supplies the per-seed values of a metric for two objectives in a regime (``values(regime, a, b,
metric) -> (xa, xb)``, aligned by seed); :func:`decide` pairs them (:func:`p3o.experiments.stats.paired`), applies
Holm's correction over the whole family of decisive claims × regimes and labels each (see
:mod:`p3o.experiments.stats`):

    decisions = decide(exp.claims, exp.primary, values)
    records = [d.to_dict() for d in decisions]      # what *.verdicts.json holds
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from p3o.experiments.spec import DECISIVE_KINDS, Claim, PrimarySpec
from p3o.experiments.stats import KIND_TEXT, PairedResult, decide_family, paired

#: ``values(regime, a, b, metric)`` -> per-seed values of A and B, aligned by seed.
PairedValues = Callable[[str, str, str, str], tuple[Sequence[float], Sequence[float]]]


@dataclass
class Decision:
    """The verdict of one decisive claim in one regime (A vs B paired by seed on `metric`)."""

    claim: Claim
    regime: str
    metric: str
    result: PairedResult
    p_adj: float = math.nan
    verdict: str = "inconclusive"

    def to_dict(self) -> dict[str, Any]:
        """The verdict record of ``*.verdicts.json``: the claim, the regime, the verdict and the paired result."""
        a, b = self.claim.objectives
        return {
            "claim": self.claim.id,
            "title": self.claim.title,
            "kind": self.claim.kind,
            "regime": self.regime,
            "a": a,
            "b": b,
            "metric": self.metric,
            "p_adj": self.p_adj,
            "verdict": self.verdict,
            **self.result.to_dict(),
        }


def decide(claims: Sequence[Claim], primary: PrimarySpec, values: PairedValues) -> list[Decision]:
    """Every decisive claim × regime: paired-t result (2000-resample paired bootstrap beside it), Holm-adjusted p
    over the whole family, verdict. Descriptive claims (spread, collapse, rank) are skipped."""
    out: list[Decision] = []
    for claim in claims:
        if claim.kind not in DECISIVE_KINDS:
            continue
        a, b = claim.objectives
        margin = claim.margin if claim.margin is not None else primary.margin
        for regime in claim.regimes:
            xa, xb = values(regime, a, b, claim.metric)
            res = paired(xa, xb, margin=margin, alpha=primary.alpha, bootstrap=2000)
            out.append(Decision(claim, regime, claim.metric, res))
    decided = decide_family([d.claim.kind for d in out], [d.result for d in out], alpha=primary.alpha)
    for d, (p_adj, v) in zip(out, decided):
        d.p_adj, d.verdict = p_adj, v
    return out


def tested_count(decisions: Sequence[Decision]) -> int:
    """How many verdicts are in the Holm family (every decisive kind but the exact ``identical`` check)."""
    return sum(1 for d in decisions if d.claim.kind != "identical")


def format_p(p: float) -> str:
    """A Holm-adjusted p-value as the tables print it ("—" when the claim is outside the family)."""
    return "—" if math.isnan(p) else ("< 1e-4" if p < 1e-4 else f"{p:.3g}")


def decisions_table(decisions: Sequence[Decision], digits: int = 3, *, metric_and_n: bool = True) -> str:
    """Markdown table of the verdicts (paired by seed; 95 % paired-t CI; Holm-adjusted p).

    Columns: claim, regime, A, B, test, [metric, n,] mean A, mean B, A − B [CI], p (Holm), verdict; numbers with
    ``digits`` decimals.
    """
    extra_head, extra_rule = ("| metric | n ", "|---|---:") if metric_and_n else ("", "")
    rows = [
        f"| claim | regime | A | B | test {extra_head}| mean A | mean B | A − B [95% CI] | p (Holm) | verdict |\n"
        f"|---|---|---|---|---{extra_rule}|---:|---:|---|---:|---|"
    ]
    for d in decisions:
        r, (a, b) = d.result, d.claim.objectives
        test = KIND_TEXT[d.claim.kind] + (f", δ = {r.margin:g}" if d.claim.kind == "tracks" else "")
        ci = (
            "exactly 0 on every seed"
            if r.identical
            else f"{r.diff:+.{digits}f} [{r.ci[0]:+.{digits}f}, {r.ci[1]:+.{digits}f}]"
        )
        extra = f" {d.metric} | {r.n} |" if metric_and_n else ""
        rows.append(
            f"| {d.claim.id} | {d.regime} | {a} | {b} | {test} |{extra} {r.mean_a:.{digits}f} | "
            f"{r.mean_b:.{digits}f} | {ci} | {format_p(d.p_adj)} | **{d.verdict}** |"
        )
    return "\n".join(rows)


def verdict_counts(decisions: Sequence[Decision]) -> str:
    """One line: how many verdicts of each kind ("3 supported, 0 contradicted, 1 inconclusive")."""
    counts = {v: sum(1 for d in decisions if d.verdict == v) for v in ("supported", "contradicted", "inconclusive")}
    return ", ".join(f"{n} {v}" for v, n in counts.items())
