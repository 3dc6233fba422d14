"""The study's front page: every verdict of every report, one Holm family over the confirmatory ones, and the
README's summary block.

Reads the ``*.verdicts.json`` files that ``p3o compare`` writes next to each report and renders them; nothing in
the output is typed by hand. The README shows only **confirmatory primary** verdicts (the study file was committed
before its runs: ``preregistration.exploratory`` false), and decides them in **one Holm family** pooled across
the studies (:func:`pool`): each verdict's raw p-value (p_equiv for *tracks*, p_diff for *better* / *worse*) is
Holm-adjusted over all of them and the verdict re-taken with :func:`p3o.experiments.stats.verdict`. Exploratory
verdicts, secondary ones and files without a pre-registration record are listed on the front page only, marked.
The README block sits between two markers and is replaced in place:

    <!-- verdicts:start -->  ...  <!-- verdicts:end -->

    python -m p3o.experiments.summary docs/results-lm.verdicts.json docs/results-synthetic.verdicts.json \\
        docs/results-vllm.verdicts.json --out docs/results.md --readme README.md
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from p3o.errors import ConfigError
from p3o.experiments.stats.paired import VERDICTS, PairedResult, holm, verdict
from p3o.experiments.summary.blocks import END, START, update_readme


@dataclass
class Study:
    """One verdict file: its path, its pre-registration record (None: an old file without one) and its verdicts."""

    path: Path
    preregistration: dict[str, Any] | None
    records: list[dict[str, Any]]

    @property
    def name(self) -> str:
        return self.path.name.removesuffix(".verdicts.json")

    @property
    def confirmatory(self) -> bool:
        """Pre-registered and not exploratory."""
        return self.preregistration is not None and not self.preregistration.get("exploratory", True)


def load(paths: list[Path]) -> list[Study]:
    """The studies of the verdict files; ConfigError naming the file when it is missing or malformed."""
    out = []
    for path in paths:
        try:
            doc = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise ConfigError(f"{path}: cannot read verdicts: {str(err).splitlines()[0]}") from None
        if isinstance(doc, list):  # written before pre-registration was recorded
            out.append(Study(path, None, doc))
        elif isinstance(doc, dict) and isinstance(doc.get("verdicts"), list):
            out.append(Study(path, doc.get("preregistration"), doc["verdicts"]))
        else:
            raise ConfigError(f"{path}: expected {{preregistration, verdicts: [...]}}")
    return out


def _primary(r: dict[str, Any]) -> bool:
    return r.get("role", "primary") == "primary"


def pool(studies: list[Study]) -> list[tuple[Study, dict[str, Any]]]:
    """The README's family: every confirmatory primary verdict of every study, with ``p_pool`` (Holm over the
    pooled family) and ``verdict_pool`` (the verdict re-taken at that p, m = the pooled family's size).

    ConfigError when the studies declare different α (one family needs one α)."""
    members = [(s, dict(r)) for s in studies if s.confirmatory for r in s.records if _primary(r)]
    alphas = {float(r.get("alpha", 0.05)) for _, r in members}
    if len(alphas) > 1:
        raise ConfigError(f"the confirmatory studies declare different alpha ({sorted(alphas)}): one family, one α")
    alpha = alphas.pop() if alphas else 0.05
    tested = [i for i, (_, r) in enumerate(members) if r["kind"] != "identical"]
    raw = [members[i][1]["p_equiv"] if members[i][1]["kind"] == "tracks" else members[i][1]["p_diff"] for i in tested]
    adjusted = dict(zip(tested, holm([math.nan if p is None else float(p) for p in raw])))
    for i, (_, r) in enumerate(members):
        res = PairedResult(
            n=int(r["n"]),
            mean_a=r.get("mean_a", math.nan),
            mean_b=r.get("mean_b", math.nan),
            diff=float(r["diff"]),
            sd=r.get("sd", math.nan),
            ci=(float(r["ci"][0]), float(r["ci"][1])),
            p_diff=float(r["p_diff"]),
            p_equiv=math.nan if r.get("p_equiv") is None else float(r["p_equiv"]),
            margin=r.get("margin"),
            identical=bool(r.get("identical")),
        )
        r["p_pool"] = adjusted.get(i, math.nan)
        r["verdict_pool"] = verdict(r["kind"], res, r["p_pool"], m=max(1, len(tested)), alpha=alpha)
    return members


def _ci(r: dict[str, Any]) -> str:
    if r.get("identical"):
        return "exactly 0 on every seed"
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
        return "no pre-registration record (written before the tool recorded one): not in the README family"
    head = f"file sha256 `{pre['sha256'][:12]}…`, commit `{str(pre.get('commit'))[:12]}` ({pre.get('committed_at')})"
    if pre.get("exploratory"):
        return f"**exploratory** ({head}): not in the README family"
    return f"confirmatory ({head}), seeds {', '.join(map(str, pre.get('seeds', [])))}"


def render_page(studies: list[Study], command: str) -> str:
    """docs/results.md: the pooled family, then the verdict table of every study, linking each report."""
    pooled = pool(studies)
    lines = [
        "# Results: what the experiments support, contradict or leave open",
        "",
        f"Generated by `{command}` from the verdict files that `p3o compare` writes next to each report; every "
        "verdict is computed by `p3o.experiments.stats` (paired by seed, 95 % paired-t interval of A − B on the "
        "study's declared metric; an effect below the declared margin δ is *negligible*; *tracks* is TOST within ±δ "
        "and contradicted only by an interval entirely outside [−δ, δ]). A study is **confirmatory** when "
        "`p3o compare` produced it without `--exploratory`, which it does only for a committed, unchanged experiment "
        "file, an out_dir whose runs were all made from the same claims, metric and margins, and seeds no exploratory "
        "run of the study used (`p3o.experiments.prereg`; each verdict file records the file's sha256, commit, commit "
        "time and seeds).",
        "",
        f"## One family: the confirmatory verdicts ({len(pooled)})",
        "",
        "The README shows these: the primary verdicts of the pre-registered, confirmatory studies, with Holm's "
        "correction over all of them at once (column p (Holm, pooled)); the per-study tables below adjust within "
        "each study.",
        "",
        "| study | claim | regime | A | B | metric | n | A − B [95% CI] | p (Holm, pooled) | verdict |",
        "|---|---|---|---|---|---|---:|---|---:|---|",
    ]
    for study, r in pooled:
        lines.append(
            f"| {study.name} | {r['title']} | {r['regime']} | {r['a']} | {r['b']} | {r['metric']} | {r['n']} | "
            f"{_ci(r)} | {_p(r['p_pool'])} | **{r['verdict_pool']}** |"
        )
    lines.append("")
    for study in studies:
        prim = [r for r in study.records if _primary(r)]
        lines += [
            f"## [{study.name}]({study.name}.md)",
            "",
            f"Pre-registration: {_mode(study)}.",
            "",
            "Primary verdicts: "
            + ", ".join(f"{sum(1 for r in prim if r['verdict'] == v)} {v}" for v in VERDICTS)
            + ".",
            "",
            "| claim | regime | A | B | metric | role | n | A − B [95% CI] | p (Holm) | verdict |",
            "|---|---|---|---|---|---|---:|---|---:|---|",
        ]
        for r in study.records:
            mark = " (exploratory)" if r.get("exploratory") else ""
            lines.append(
                f"| {r['title']} | {r['regime']} | {r['a']} | {r['b']} | {r['metric']} | {r.get('role', 'primary')} "
                f"| {r['n']} | {_ci(r)} | {_p(r.get('p_adj'))} | **{r['verdict']}**{mark} |"
            )
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def render_block(studies: list[Study], page: str) -> str:
    """The README block: the confirmatory primary verdicts, decided in one pooled Holm family."""
    pooled = pool(studies)
    lines = [START, ""]
    names = list(dict.fromkeys(s.name for s, _ in pooled))
    left = [s.name for s in studies if not s.confirmatory]
    lines.append(
        f"{len(pooled)} confirmatory verdicts from {len(names)} pre-registered "
        f"stud{'y' if len(names) == 1 else 'ies'}, one Holm family across them"
        + (f" (left out, not pre-registered or exploratory: {', '.join(left)})" if left else "")
        + ":"
    )
    lines.append("")
    for name in names:
        lines.append(f"**{name}** ([report](docs/{name}.md)):")
        lines.append("")
        for _, r in [(s, r) for s, r in pooled if s.name == name]:
            lines.append(
                f"- {r['verdict_pool']}: {r['title']} — {r['regime']}, {r['a']} − {r['b']} on {r['metric']} = "
                f"{_ci(r)} (n = {r['n']}, Holm p {_p(r['p_pool'])})"
            )
        lines.append("")
    lines += [f"All verdicts with their tests: [{page}]({page}).", "", END]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """`python -m p3o.experiments.summary VERDICTS... --out docs/results.md [--readme README.md] [--block FILE]`."""
    parser = argparse.ArgumentParser(prog="python -m p3o.experiments.summary", description=__doc__.splitlines()[0])
    parser.add_argument("verdicts", nargs="+", type=Path, help="*.verdicts.json files written by p3o compare")
    parser.add_argument("--out", type=Path, required=True, help="the front page to write (docs/results.md)")
    parser.add_argument("--readme", type=Path, default=None, help="README whose verdict block to replace")
    parser.add_argument("--block", type=Path, default=None, help="also write the README block alone to this file")
    args = parser.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    command = "python -m p3o.experiments.summary " + " ".join(argv)
    try:
        studies = load(args.verdicts)
        args.out.write_text(render_page(studies, command))
        block = render_block(studies, str(args.out))
        if args.readme is not None:
            update_readme(args.readme, block)
        if args.block is not None:
            args.block.write_text(block + "\n")
    except ConfigError as err:
        print(f"p3o summary: error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}" + (f" and the verdict block of {args.readme}" if args.readme else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
