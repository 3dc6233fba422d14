"""``python -m p3o.experiments.summary``: render the results pages from the verdict files.

    python -m p3o.experiments.summary docs/results/*.verdicts.json --out docs/results/verdicts.md \\
        --index docs/results/README.md --claims docs/paper-claims.md --readme README.md

``--out``: every verdict, the confirmatory ones in one Holm family; ``--index``: the index of the results pages;
``--claims``: the papers' claims against our verdicts (mapping ``--claims-map``) with its forest plot
(``--forest``); ``--readme`` / ``--block``: the README's short generated block (replaced in place / also written
alone), the claims' front page (three short lists: decided on the LM testbed, only in the simulator, not tested
here) and one count line of the pooled family when ``--claims`` is given.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from p3o.errors import ConfigError
from p3o.experiments.summary.blocks import update_readme, write_block
from p3o.experiments.summary.claims import (
    claim_row_keys,
    front_page,
    load_caveats,
    load_instruments,
    load_mapping,
    plot_forest,
    render_claims,
)
from p3o.experiments.summary.pages import Study, load, render_block, render_index, render_page
from p3o.experiments.summary.reports import regenerate
from p3o.experiments.summary.words import closing_words


def build_parser() -> argparse.ArgumentParser:
    """The summary command's arguments."""
    parser = argparse.ArgumentParser(prog="python -m p3o.experiments.summary", description=__doc__.splitlines()[0])
    parser.add_argument("verdicts", nargs="+", type=Path, help="*.verdicts.json files written by p3o compare")
    parser.add_argument(
        "--out", type=Path, required=True, help="the verdicts page to write (docs/results/verdicts.md)"
    )
    parser.add_argument("--index", type=Path, default=None, help="the results index to write (docs/results/README.md)")
    parser.add_argument("--claims", type=Path, default=None, help="the claims page to write (docs/paper-claims.md)")
    parser.add_argument(
        "--claims-map",
        type=Path,
        default=Path("configs/experiments/records/paper-claims.yaml"),
        help="the declared mapping of the papers' claims to verdicts",
    )
    parser.add_argument(
        "--forest",
        type=Path,
        default=None,
        help="the forest plot's PNG (default: docs/results/figures/paper-claims-forest.png beside --out)",
    )
    parser.add_argument("--readme", type=Path, default=None, help="README whose verdict block to replace")
    parser.add_argument("--block", type=Path, default=None, help="also write the README block alone to this file")
    return parser


def _mark_reports(studies: list[Study]) -> None:
    """Regenerate each report's verdicts under today's rule from its verdict file, the old labels in a dated appendix
    (:func:`p3o.experiments.summary.reports.regenerate`), and append to each whose peak verdicts the ledger marks
    selection-biased a block stating the bias (``selection-bias``); the rest of the report is kept byte for byte."""
    for study in studies:
        regenerate(study)
        report = study.path.with_name(study.name + ".md")
        if study.bias and report.is_file():  # a peak chosen and scored on the same evaluations (the ledger's mark)
            b = study.bias
            write_block(
                report,
                "selection-bias",
                "## Selection bias of the peak\n\nWritten by `python -m p3o.experiments.summary` from the ledger's "
                "mark "
                f"(configs/experiments/records/ledger.yaml) and this report's run records: {b['text']}. The expected "
                f"best of {b['k']} under no learning is √(p0(1 − p0)/n) · E[max of {b['k']} standard normals] "
                "(`p3o.experiments.grid.peak.expected_best_of_k`); compare the peaks above with step 0 plus "
                f"{b['bias']:+.3f}, not with step 0.",
            )


def main(argv: list[str] | None = None) -> int:
    """Write the pages; exit 2 with one line on a missing or malformed verdict file or README block."""
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    command = "python -m p3o.experiments.summary " + " ".join(argv)
    try:
        studies = load(args.verdicts)
        _mark_reports(studies)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(render_page(studies, command))
        pages = {"every verdict": args.out}
        if args.index is not None:
            extra = {"claims": args.claims} if args.claims is not None else {}
            args.index.write_text(render_index(studies, command, args.index, {"verdicts": args.out, **extra}))
            pages = {"results": args.index, **pages}
        readme = args.readme or Path("README.md")
        statements, in_rows, lead = None, None, ""
        if args.claims is not None:
            claims = load_mapping(args.claims_map)
            forest = args.forest or args.out.parent / "figures" / "paper-claims-forest.png"
            plot_forest(claims, studies, forest)
            caveats = load_caveats(args.claims_map)
            instruments = load_instruments(args.claims_map)
            page = render_claims(claims, studies, args.claims, forest, command, caveats, instruments)
            args.claims.write_text(page)
            statements = front_page(claims, studies, readme, args.claims, instruments, caveats)
            in_rows = claim_row_keys(claims, studies)
            lead = closing_words(claims, studies, caveats)
            pages = {"the papers' claims": args.claims, **pages}
        block = render_block(studies, readme, pages, statements, in_rows, lead)
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
