"""Verdicts of decisive claims: one claim type (:class:`p3o.experiments.grid.spec.Claim`), one ``decide`` for every
instrument, one verdict record and one verdict table.

An instrument supplies the per-seed values of a metric for two objectives in a regime (``values(regime, a, b,
metric) -> (xa, xb)`` or ``(xa, xb, seeds)``, aligned by seed); :func:`decide` pairs them
(:func:`p3o.experiments.stats.paired.paired`), applies Holm's correction over the family of primary verdicts
(every decisive claim × regime on its metric) and labels each (see :mod:`p3o.experiments.stats.paired`: supported,
contradicted, negligible, inconclusive). Each metric of the primary block's ``secondary`` list gets its verdict
beside the primary one, labelled ``secondary``, in a Holm family of its own. A claim whose B names a baseline family
(:class:`p3o.experiments.grid.spec.BaselineFamily`) is tested against each member (``rule: each``) or against the
member that scored best on the family's selection seeds (``rule: best``):

    decisions = decide(exp.claims, exp.primary, values, families=exp.baselines, selection=sel)
    records = [d.to_dict() for d in decisions]      # the "verdicts" of *.verdicts.json

Every record keeps the raw data it was decided from: ``values_a`` and ``values_b`` (the per-seed values of A and B
on the record's metric, (n,) each, NaN pairs included as NaN) and ``seeds`` (the seed of each pair, or None when the
instrument did not name them), so ``p3o compare --check FILE`` (:mod:`p3o.experiments.stats.check`) can recompute
every verdict of a file.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from p3o.errors import ConfigError
from p3o.experiments.grid.spec import DECISIVE_KINDS, BaselineFamily, Claim, PrimarySpec
from p3o.experiments.stats.paired import KIND_TEXT, VERDICTS, PairedResult, decide_family, paired

#: ``values(regime, a, b, metric)`` -> per-seed values of A and B, aligned by seed (optionally the seeds third).
PairedValues = Callable[[str, str, str, str], tuple[Any, ...]]
#: ``selection(regime, objective, metric)`` -> the objective's values on its family's selection seeds.
SelectionValues = Callable[[str, str, str], Sequence[float]]


@dataclass
class Decision:
    """The verdict of one decisive claim in one regime (A vs B paired by seed on `metric`)."""

    claim: Claim
    regime: str
    metric: str
    result: PairedResult
    p_adj: float = math.nan
    verdict: str = "inconclusive"
    role: str = "primary"
    """"primary" (the claim's metric: the verdict that counts) or "secondary" (a metric reported beside it)."""
    exploratory: bool = False
    alpha: float = 0.05
    b: str | None = None
    """B when the claim names a baseline family: the member compared (None: the claim's own B)."""
    baseline: dict[str, Any] | None = None
    """The family, its rule and, for ``best``, each member's mean on the selection seeds."""
    values_a: list[float] = field(default_factory=list)
    """(n,) A's value on each paired seed (the raw data of ``result``)."""
    values_b: list[float] = field(default_factory=list)
    """(n,) B's value on each paired seed."""
    seeds: list[int] | None = None
    """(n,) the seed of each pair (None: the instrument did not name them)."""

    @property
    def pair(self) -> tuple[str, str]:
        """(A, B) as compared."""
        a, b = self.claim.objectives
        return a, self.b or b

    def to_dict(self) -> dict[str, Any]:
        """The verdict record of ``*.verdicts.json``: the claim, the regime, the verdict and the paired result."""
        a, b = self.pair
        out = {
            "claim": self.claim.id,
            "title": self.claim.title,
            "kind": self.claim.kind,
            "regime": self.regime,
            "a": a,
            "b": b,
            "metric": self.metric,
            "role": self.role,
            "p_adj": self.p_adj,
            "verdict": self.verdict,
            "exploratory": self.exploratory,
            "alpha": self.alpha,
        }
        if self.baseline is not None:
            out["baseline"] = self.baseline
        raw = {"seeds": self.seeds, "values_a": self.values_a, "values_b": self.values_b}
        return {**out, **self.result.to_dict(), **raw}


def _per_seed(values: PairedValues, regime: str, a: str, b: str, metric: str) -> dict[str, Any]:
    """``values_a``, ``values_b`` and ``seeds`` of one comparison, as :class:`Decision` keeps them."""
    got = tuple(values(regime, a, b, metric))
    seeds = None if len(got) < 3 or got[2] is None else [int(s) for s in got[2]]
    xa, xb = ([math.nan if v is None else float(v) for v in x] for x in got[:2])
    if seeds is not None and len(seeds) != len(xa):
        raise ValueError(f"values({regime!r}, {a!r}, {b!r}, {metric!r}): {len(seeds)} seeds for {len(xa)} values")
    return {"values_a": xa, "values_b": xb, "seeds": seeds}


def _select(
    family: BaselineFamily, regime: str, metric: str, selection: SelectionValues | None
) -> tuple[list[str], dict[str, Any]]:
    """The members a claim against ``family`` compares with in ``regime``, and the record of how they were chosen."""
    if family.rule == "each":
        return list(family.members), {"family": family.name, "rule": "each"}
    if selection is None:
        raise ConfigError(f"baselines '{family.name}': rule 'best' needs runs on its selection seeds")
    means = {}
    for member in family.members:
        vals = [float(v) for v in selection(regime, member, metric) if v is not None and math.isfinite(float(v))]
        means[member] = sum(vals) / len(vals) if vals else math.nan
    ranked = [m for m in family.members if math.isfinite(means[m])]
    if not ranked:
        raise ConfigError(f"baselines '{family.name}': no finished selection runs in regime '{regime}'")
    best = max(ranked, key=lambda m: means[m])  # ties: the first declared
    record = {
        "family": family.name,
        "rule": "best",
        "selected": best,
        "selection_seeds": list(family.selection_seeds),
        "selection_means": means,
    }
    return [best], record


def decide(
    claims: Sequence[Claim],
    primary: PrimarySpec,
    values: PairedValues,
    *,
    families: dict[str, BaselineFamily] | None = None,
    selection: SelectionValues | None = None,
    exploratory: bool = False,
) -> list[Decision]:
    """Every decisive claim × regime (× baseline member): paired-t result (2000-resample paired bootstrap beside
    it), Holm-adjusted p over the primary family, verdict; then the secondary metrics' verdicts, each placed right
    after its primary one, Holm-adjusted over the secondary family. Descriptive claims are skipped."""
    families = families or {}
    primaries: list[Decision] = []
    secondaries: dict[int, list[Decision]] = {}
    second: list[Decision] = []
    for claim in claims:
        if claim.kind not in DECISIVE_KINDS:
            continue
        a, b = claim.objectives
        margin = claim.margin if claim.margin is not None else primary.margin
        for regime in claim.regimes:
            members, how = ([b], None) if b not in families else _select(families[b], regime, claim.metric, selection)
            for member in members:
                shared = {"exploratory": exploratory, "alpha": primary.alpha, "baseline": how}
                shared["b"] = member if how is not None else None
                raw = _per_seed(values, regime, a, member, claim.metric)
                res = paired(raw["values_a"], raw["values_b"], margin=margin, alpha=primary.alpha, bootstrap=2000)
                primaries.append(Decision(claim, regime, claim.metric, res, **shared, **raw))
                if claim.kind == "identical":
                    continue
                for metric in primary.secondary:
                    if metric == claim.metric:
                        continue
                    raw = _per_seed(values, regime, a, member, metric)
                    res = paired(raw["values_a"], raw["values_b"], margin=margin, alpha=primary.alpha, bootstrap=2000)
                    d = Decision(claim, regime, metric, res, role="secondary", **shared, **raw)
                    secondaries.setdefault(len(primaries) - 1, []).append(d)
                    second.append(d)
    for family in (primaries, second):
        decided = decide_family([d.claim.kind for d in family], [d.result for d in family], alpha=primary.alpha)
        for d, (p_adj, v) in zip(family, decided):
            d.p_adj, d.verdict = p_adj, v
    out: list[Decision] = []
    for i, d in enumerate(primaries):
        out += [d, *secondaries.get(i, [])]
    return out


def format_p(p: float) -> str:
    """A Holm-adjusted p-value as the tables print it ("—" when the claim is outside the family)."""
    return "—" if math.isnan(p) else ("< 1e-4" if p < 1e-4 else f"{p:.3g}")


def verdict_label(verdict: str, role: str = "primary", exploratory: bool = False) -> str:
    """A verdict as the tables print it: bold for a primary verdict, labelled secondary / exploratory."""
    text = f"**{verdict}**" if role == "primary" else f"{verdict} (secondary)"
    return text + (" (exploratory)" if exploratory else "")


def cell(text: object) -> str:
    """``text`` as one Markdown table cell: every ``|`` escaped (``|A − B| < δ`` would split the row)."""
    return str(text).replace("\\|", "|").replace("|", "\\|")


def _num(x: object, digits: int) -> str:
    v = math.nan if x is None else float(x)  # type: ignore[arg-type]
    return "–" if math.isnan(v) else f"{v:.{digits}f}"


def records_table(records: Sequence[dict[str, Any]], digits: int = 3, *, metric_and_n: bool = True) -> str:
    """Markdown table of verdict records (``*.verdicts.json``: paired by seed; 95 % paired-t CI; Holm-adjusted p).

    Columns: claim, regime, A, B, test, [metric, n,] mean A, mean B, A − B [CI], p (Holm: the record's ``p_adj``),
    verdict (the record's; a superseded one says by which study); numbers with ``digits`` decimals; every cell
    escaped (:func:`cell`); a secondary verdict follows its primary one.
    """
    extra_head, extra_rule = ("| metric | n ", "|---|---:") if metric_and_n else ("", "")
    rows = [
        f"| claim | regime | A | B | test {extra_head}| mean A | mean B | A − B [95% CI] | p (Holm) | verdict |\n"
        f"|---|---|---|---|---{extra_rule}|---:|---:|---|---:|---|"
    ]
    for r in records:
        margin = r.get("margin")
        test = KIND_TEXT[r["kind"]] + (f", δ = {margin:g}" if margin is not None and r["kind"] != "identical" else "")
        lo, hi = r["ci"]
        ci = (
            "exactly 0 on every seed"
            if r.get("identical")
            else f"{float(r['diff']):+.{digits}f} [{float(lo):+.{digits}f}, {float(hi):+.{digits}f}]"
        )
        label = verdict_label(r["verdict"], r.get("role", "primary"), bool(r.get("exploratory")))
        sup = r.get("superseded")
        label += f" (superseded by {sup['by']}: not evidence)" if isinstance(sup, dict) else ""
        p_adj = r.get("p_adj")
        extra = f" {cell(r['metric'])} | {r['n']} |" if metric_and_n else ""
        cells = [r.get("claim"), r.get("regime"), r.get("a"), r.get("b"), test]
        rows.append(
            "| " + " | ".join(cell(c) for c in cells) + f" |{extra} {_num(r.get('mean_a'), digits)} | "
            f"{_num(r.get('mean_b'), digits)} | {ci} | {format_p(math.nan if p_adj is None else float(p_adj))} | "
            f"{cell(label)} |"
        )
    return "\n".join(rows)


def rule_text(records: Sequence[dict[str, Any]], metric_label: str = "") -> str:
    """Today's decision rule in words, for the primary verdicts of one family (the records of one verdict file):
    metric, α, the number of tested verdicts Holm corrects over, the margin(s) δ, and what each label means —
    *supported* / *contradicted* (a better / worse claim) compare the **point estimate** with δ: |A − B| ≥ δ and a
    Holm-adjusted difference-test p < α (the interval may still reach inside ±δ); *negligible* needs the
    Holm-adjusted TOST to show the effect inside ±δ (an estimate inside ±δ enters Holm with its TOST p); *tracks*
    and *identical* as :func:`p3o.experiments.stats.paired.verdict` decides them."""
    prim = [r for r in records if r.get("role", "primary") == "primary"]
    metric = prim[0]["metric"] if prim else "?"
    alpha = float(prim[0].get("alpha", 0.05)) if prim else 0.05
    tested = sum(1 for r in prim if r["kind"] != "identical")
    margins = sorted({float(r["margin"]) for r in prim if r.get("margin") is not None})
    delta = " / ".join(f"{m:g}" for m in margins) or "none"
    second = sorted({r["metric"] for r in records if r.get("role") == "secondary"})
    return (
        f"metric **{metric}**" + (f" ({metric_label})" if metric_label else "") + ", paired by seed; "
        f"{1 - alpha:.0%} paired-t intervals; Holm's correction over the {tested} tested primary verdicts at "
        f"family-wise α = {alpha:g}; margin δ = {delta}. A better / worse claim is *supported* (or *contradicted*) "
        "when the point estimate A − B is at least δ from 0 in the claim's (the opposite) direction and its "
        "Holm-adjusted difference-test p is below α: the point estimate, not the interval, is compared with δ, so "
        "the interval may still reach inside ±δ; an estimate inside ±δ enters the Holm family with its TOST p and is "
        "*negligible* only when that Holm-adjusted TOST shows it inside ±δ; anything else is *inconclusive*. "
        "*tracks* is TOST within ±δ and is contradicted only by an interval entirely outside [−δ, δ]; *identical* "
        "asks for exactly equal per-seed values."
        + (
            f" Secondary metrics ({', '.join(second)}) get their verdicts beside the primary one, labelled secondary "
            "(their own Holm family)."
            if second
            else ""
        )
    )


def family_lines(records: Sequence[dict[str, Any]]) -> list[str]:
    """Which member each ``best`` baseline family was tested against, one line per (claim, regime)."""
    seen: dict[tuple[str, str], str] = {}
    for r in records:
        base = r.get("baseline")
        if r.get("role", "primary") != "primary" or not isinstance(base, dict) or base.get("rule") != "best":
            continue
        means = ", ".join(f"{m} {v:.3f}" for m, v in base["selection_means"].items())
        seeds = ", ".join(map(str, base["selection_seeds"]))
        seen[(r["claim"], r["regime"])] = (
            f"- ({r['claim']}) {r['regime']}: best of `{base['family']}` on selection seeds {seeds} (mean "
            f"{r['metric']}): **{base['selected']}** ({means})"
        )
    return list(seen.values())


def record_counts(records: Sequence[dict[str, Any]]) -> str:
    """One line: how many primary verdict records of each label ("3 supported, 0 contradicted, 1 negligible, ...")."""
    prim = [r for r in records if r.get("role", "primary") == "primary"]
    return ", ".join(f"{sum(1 for r in prim if r['verdict'] == v)} {v}" for v in VERDICTS)


def verdict_counts(decisions: Sequence[Decision]) -> str:
    """One line: how many primary verdicts of each kind ("3 supported, 0 contradicted, 1 negligible, ...")."""
    return record_counts([d.to_dict() for d in decisions])
