"""``python -m p3o.experiments.stats.relabel --rule ID FILE ...``: re-take every verdict of verdict files under
today's analysis rules, after an amendment of the rules recorded in configs/experiments/records/ledger.yaml
(``rules:``; :mod:`p3o.experiments.stats.ledger`).

Each file's primary and secondary families are decided again from their stored paired results
(:func:`p3o.experiments.stats.paired.decide_family`, the code ``p3o compare`` and ``p3o compare --check`` use): every
record gets today's ``p_adj`` and ``verdict``; a label that changes keeps the one its report printed as
``verdict_report`` (the summary appends a "today's rule" block to that report); the file's ``relabelled`` list names
the rule, its date and how many labels changed. Nothing is typed by hand, and the file is rewritten as
``p3o compare`` writes it.

    python -m p3o.experiments.stats.relabel --rule negligible-holm-tost docs/results/*.verdicts.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from p3o.errors import ConfigError
from p3o.experiments.scripts import run_script, script_parser
from p3o.experiments.stats.ledger import records_for, rule
from p3o.experiments.stats.paired import PairedResult, decide_family


def relabel_records(records: list[dict[str, Any]]) -> int:
    """Re-take ``p_adj`` and ``verdict`` of every record in place, within its family (primary, secondary); returns
    how many labels changed (each keeps the label before as ``verdict_report`` unless it already has one)."""
    changed = 0
    for role in ("primary", "secondary"):
        family = [r for r in records if r.get("role", "primary") == role]
        if not family:
            continue
        alpha = float(family[0].get("alpha", 0.05))
        results = [PairedResult.from_record(r) for r in family]
        decided = decide_family([r["kind"] for r in family], results, alpha=alpha)
        for r, (p_adj, verdict) in zip(family, decided):
            r["p_adj"] = p_adj
            if verdict != r["verdict"]:
                r.setdefault("verdict_report", r["verdict"])
                r["verdict"] = verdict
                changed += 1
            elif r.get("verdict_report") == verdict:
                del r["verdict_report"]
    return changed


def relabel(path: Path, rule_id: str) -> int:
    """Relabel verdict file ``path`` under the recorded rule amendment ``rule_id``; returns how many labels changed
    (ConfigError when the file is malformed or the rule is not recorded)."""
    records = records_for(path)
    if records is None:
        raise ConfigError(f"{path}: not inside a repository with configs/experiments/records/ledger.yaml")
    amendment = rule(records, rule_id)
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ConfigError(f"{path}: cannot read verdicts: {str(err).splitlines()[0]}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("verdicts"), list):
        raise ConfigError(f"{path}: expected {{preregistration, verdicts: [...]}}")
    changed = relabel_records(doc["verdicts"])
    done = [e for e in doc.get("relabelled") or [] if e.get("rule") != rule_id]
    doc["relabelled"] = [*done, {"rule": rule_id, "date": str(amendment["date"]), "changed": changed}]
    path.write_text(json.dumps(doc, indent=1, default=float) + "\n")
    return changed


def main(argv: list[str] | None = None) -> int:
    """Relabel each file; exit 2 with one line on bad input."""
    parser = script_parser("p3o.experiments.stats.relabel", __doc__)
    parser.add_argument("--rule", required=True, help="the id of a rule amendment recorded in the ledger (rules:)")
    parser.add_argument("files", nargs="+", type=Path, help="*.verdicts.json files")

    def each(args: argparse.Namespace) -> int:
        for path in args.files:
            print(f"{path}: {relabel(path, args.rule)} labels changed under {args.rule}")
        return 0

    return run_script("relabel", parser, argv, each)


if __name__ == "__main__":
    sys.exit(main())
