"""``python -m p3o.experiments.stats.supersede FILE ...``: mark the superseded verdicts of verdict files from the
record file (configs/experiments/records/ledger.yaml, ``superseded:``;
:func:`p3o.experiments.stats.ledger.mark_superseded`).

    python -m p3o.experiments.stats.supersede docs/results/minpro-stale3.verdicts.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from p3o.errors import ConfigError
from p3o.experiments.stats.ledger import mark_superseded


def main(argv: list[str] | None = None) -> int:
    """``python -m p3o.experiments.stats.supersede FILE [...]``: mark the superseded verdicts of each
    verdict file from configs/experiments/records/ledger.yaml; exit 2 with one line on bad input."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or any(a.startswith("-") for a in argv):
        print("supersede: error: usage: python -m p3o.experiments.stats.supersede FILE ...", file=sys.stderr)
        return 2
    try:
        for name in argv:
            print(f"{name}: {mark_superseded(Path(name), Path('configs/experiments'))} verdicts marked superseded")
    except (ConfigError, OSError, json.JSONDecodeError) as err:
        print(f"supersede: error: {str(err).splitlines()[0]}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
