"""``python -m p3o.experiments.summary``: render the results pages from the verdict files.

    python -m p3o.experiments.summary docs/results/*.verdicts.json --out docs/results/verdicts.md \\
        --index docs/results/README.md --readme README.md

``--out``: every verdict, the confirmatory ones in one Holm family; ``--index``: the index of the results pages;
``--readme`` / ``--block``: the README's short generated block (replaced in place / also written alone).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from p3o.errors import ConfigError
from p3o.experiments.summary.blocks import update_readme
from p3o.experiments.summary.pages import load, render_block, render_index, render_page


def build_parser() -> argparse.ArgumentParser:
    """The summary command's arguments."""
    parser = argparse.ArgumentParser(prog="python -m p3o.experiments.summary", description=__doc__.splitlines()[0])
    parser.add_argument("verdicts", nargs="+", type=Path, help="*.verdicts.json files written by p3o compare")
    parser.add_argument(
        "--out", type=Path, required=True, help="the verdicts page to write (docs/results/verdicts.md)"
    )
    parser.add_argument("--index", type=Path, default=None, help="the results index to write (docs/results/README.md)")
    parser.add_argument("--readme", type=Path, default=None, help="README whose verdict block to replace")
    parser.add_argument("--block", type=Path, default=None, help="also write the README block alone to this file")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Write the pages; exit 2 with one line on a missing or malformed verdict file or README block."""
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    command = "python -m p3o.experiments.summary " + " ".join(argv)
    try:
        studies = load(args.verdicts)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(render_page(studies, command))
        pages = {"every verdict": args.out}
        if args.index is not None:
            args.index.write_text(render_index(studies, command, args.index, {"verdicts": args.out}))
            pages = {"results": args.index, **pages}
        readme = args.readme or Path("README.md")
        block = render_block(studies, readme, pages)
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
