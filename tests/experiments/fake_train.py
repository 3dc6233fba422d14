"""A stand-in for `python -m p3o train` used by the runner tests: parses `--key value` overrides, writes
config.yaml and a metrics.jsonl whose reward curve depends on the objective and seed, and final/.

objective.name = "boom" exits 3; "collapse" makes the reward rise then fall to 0; `fake.bonus` b adds b·(1 + seed/10)
to every reward (an objective that differs from another by a known, seed-dependent amount). Each call appends a line
to $FAKE_TRAIN_CALLS so tests can count launches.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import yaml


def main(argv: list[str]) -> int:
    assert len(argv) % 2 == 0, argv
    flat = {argv[i][2:]: yaml.safe_load(argv[i + 1]) for i in range(0, len(argv), 2)}
    calls = os.environ.get("FAKE_TRAIN_CALLS")
    if calls:
        with open(calls, "a") as f:
            f.write(json.dumps(flat) + "\n")
    if flat.get("objective.name") == "boom":
        print("boom: objective exploded", file=sys.stderr)
        return 3
    run_dir = Path(flat["run_dir"])
    run_dir.mkdir(parents=True, exist_ok=True)
    nested: dict = {}
    for key, value in flat.items():
        node = nested
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    (run_dir / "config.yaml").write_text(yaml.safe_dump(nested))
    steps, seed = int(flat.get("steps", 10)), int(flat.get("seed", 0))
    collapse = flat.get("objective.name") == "collapse"
    bonus = float(flat.get("fake.bonus", 0.0)) * (1 + seed / 10)
    with open(run_dir / "metrics.jsonl", "w") as f:
        for s in range(1, steps + 1):
            r = min(1.0, 0.05 * s + 0.01 * seed) + bonus
            if collapse and s > steps // 2:
                r = 0.0
            f.write(json.dumps({"step": s, "reward_mean": r, "ess": 1.0 - 0.01 * s, "kl_weight": 0.01 * s}) + "\n")
    (run_dir / "final").mkdir(exist_ok=True)
    (run_dir / "final" / "config.json").write_text("{}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
