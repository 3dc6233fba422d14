#!/usr/bin/env bash
# The main job on seeds 0..4, and one common evaluation of the base and of each final policy:
#   bash scripts/main_job_seeds.sh [OUT_DIR] [extra p3o train options...]
# Each seed is `p3o train --seed K` (the embedded default otherwise); a finished seed is not trained again. Every
# policy, the base included, is scored on the same 256 held-out problems x 4 samples (1024 samples) with the same
# sampling seed, so the gains are paired by problem. Prints one row per seed and writes OUT_DIR/seeds.json.
set -euo pipefail
P3O=${P3O:-.venv/bin/p3o}
PY=${PY:-.venv/bin/python}
OUT=${1:-runs/main-seeds}
shift || true
EVAL=(--n-problems 256 --n-samples 4 --k 1 --seed 0 --quiet)
mkdir -p "$OUT"
for seed in 0 1 2 3 4; do
    if [ ! -f "$OUT/seed$seed/final/config.json" ]; then
        "$P3O" train --seed "$seed" --run_dir "$OUT/seed$seed" --overwrite --log.progress false "$@"
    fi
    # an evaluation already written is not run again (same policy, same problems and seed: the same numbers)
    [ -f "$OUT/seed$seed.eval.json" ] || "$P3O" eval --model "$OUT/seed$seed" "${EVAL[@]}" --out "$OUT/seed$seed.eval.json"
done
[ -f "$OUT/base.eval.json" ] || "$P3O" eval --model tiny --task arithmetic --difficulty 2 "${EVAL[@]}" --out "$OUT/base.eval.json"
"$PY" - "$OUT" <<'EOF'
import json
import sys
from pathlib import Path

out = Path(sys.argv[1])
base = json.loads((out / "base.eval.json").read_text())["pass_at_k"]["1"]
rows = []
for seed in range(5):
    run = [json.loads(line) for line in (out / f"seed{seed}" / "metrics.jsonl").read_text().splitlines()]
    final = json.loads((out / f"seed{seed}.eval.json").read_text())["pass_at_k"]["1"]
    first = sum(r["reward_mean"] for r in run[:10]) / 10
    last = sum(r["reward_mean"] for r in run[-10:]) / 10
    rows.append({"seed": seed, "base": base, "final": final, "gain": final - base, "reward_first10": first,
                 "reward_last10": last})
print("| seed | base pass@1 | final pass@1 | gain | train reward, first → last 10 steps |")
print("|---:|---:|---:|---:|---|")
for r in rows:
    print(f"| {r['seed']} | {r['base']:.3f} | {r['final']:.3f} | {r['gain']:+.3f} | "
          f"{r['reward_first10']:.3f} → {r['reward_last10']:.3f} |")
print(f"seeds with a gain of at least +0.05: {sum(r['gain'] >= 0.05 for r in rows)}/5")
(out / "seeds.json").write_text(json.dumps(rows, indent=1))
EOF
