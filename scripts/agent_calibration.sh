#!/usr/bin/env bash
# Issue 53 item 5: does off-policy agent data bite? Exploratory calibration of the agent testbed
# (`p3o train --config agent`: tiny-agent, calc-small), one short run per candidate setting, one at a time.
#   bash scripts/agent_calibration.sh [NAME...]                  # all runs, or only the named ones
#   .venv/bin/python scripts/agent_calibration_table.py runs/agent-calibration --out docs/results/agent-calibration.md
# The runs use the source of one commit (COMMIT, default the one the recorded table was measured at), unpacked by
# `git archive` into OUT/src and put first on PYTHONPATH, so that edits in the working tree do not move them.
# A run whose final/ and wall_s exist is not run again (rerun the script after an interruption; an unfinished run
# starts over: --overwrite). Every run: seed 3100 (calibration only, never a study seed; a later --seed 3101 in a
# run's options for the second seed), no held-out evaluation unless its options say so, no checkpoints, one thread (OMP_NUM_THREADS=1).
# Runs go to OUT/NAME (default runs/agent-calibration); each one's wall time to NAME/wall_s, its options to
# OUT/options/NAME.
set -uo pipefail
PY=${PY:-.venv/bin/python}
OUT=${OUT:-runs/agent-calibration}
SEED=${SEED:-3100}
COMMIT=${COMMIT:-5d4fb11}
COMMON=(--config agent --seed "$SEED" --task.n_eval 0 --ckpt.every 0 --log.progress false --log.plot false
        --log.tensorboard false --log.wandb false --overwrite true)
RAY=(--rollout.workers 1 --rollout.inflight_updates true --ray.num_cpus 2)

declare -A RUNS
ORDER=()
add() { ORDER+=("$1"); RUNS[$1]="$2"; }
# name                  options after COMMON (steps included)
add base-lag2           "--steps 30"
add mb8-lag2            "--steps 30 --update.num_mini_batches 8"
add lag8                "--steps 30 --loop.max_lag 8"
add ray-free-mb8        "--steps 30 ${RAY[*]} --loop.schedule free --loop.max_lag 2 --update.num_mini_batches 8"
add ray-fixed-mb8       "--steps 30 ${RAY[*]} --loop.schedule fixed --loop.max_lag 2 --update.num_mini_batches 8"
add ray-free-lat50      "--steps 30 ${RAY[*]} --loop.schedule free --loop.max_lag 2 --agent.env_kwargs.latency_s 0.05"
add epochs4-lag2        "--steps 30 --update.epochs 4"
add stale4-mb8          "--steps 30 --loop.mode stale --loop.staleness 4 --update.num_mini_batches 8"
add ray-fixed-mb16      "--steps 30 ${RAY[*]} --loop.schedule fixed --loop.max_lag 2 --update.num_mini_batches 16"
add ray-fixed-mb8-lr4e-4 "--steps 30 ${RAY[*]} --loop.schedule fixed --loop.max_lag 2 --update.num_mini_batches 8 --optim.lr 4e-4"
add mb4-lag2            "--steps 30 --update.num_mini_batches 4"
add ray-fixed-guess     "--steps 30 ${RAY[*]} --loop.schedule fixed --loop.max_lag 2 --update.num_mini_batches 8 --agent.env guess --task.name guess --agent.max_turns 6 --agent.max_turn_tokens 8 --agent.max_total_tokens 96"
# the study's unit: 60 steps with the in-loop held-out evaluation (256 problems, full episodes) at 0, 20, 40, 60
add cost-ray-fixed-mb8-60 "--steps 60 ${RAY[*]} --loop.schedule fixed --loop.max_lag 2 --update.num_mini_batches 8 --task.n_eval 256 --log.eval_every 20"
# the study's unit as registered (30 steps, evaluations at 0, 10, 20, 30), in its two regimes
add cost-lag8-30        "--steps 30 --loop.max_lag 8 --task.n_eval 256 --log.eval_every 10"
add cost-inflight-mb8-lr4e-4-30 "--steps 30 ${RAY[*]} --loop.schedule fixed --loop.max_lag 2 --update.num_mini_batches 8 --optim.lr 4e-4 --task.n_eval 256 --log.eval_every 10"
# the two biting settings on a second calibration seed (3101: how far a 30-step mean moves with the seed)
add lag8-s3101          "--steps 30 --loop.max_lag 8 --seed 3101"
add ray-fixed-mb8-lr4e-4-s3101 "--steps 30 ${RAY[*]} --loop.schedule fixed --loop.max_lag 2 --update.num_mini_batches 8 --optim.lr 4e-4 --seed 3101"

want=("$@")
[ ${#want[@]} -eq 0 ] && want=("${ORDER[@]}")
for name in "${want[@]}"; do
    [ -n "${RUNS[$name]+x}" ] || { echo "agent_calibration.sh: unknown run '$name' (one of: ${ORDER[*]})" >&2; exit 2; }
done
mkdir -p "$OUT/options"
if [ ! -f "$OUT/src/commit" ]; then
    rm -rf "$OUT/src" && mkdir -p "$OUT/src"
    git archive "$COMMIT" src | tar -x -C "$OUT/src" || { echo "agent_calibration.sh: cannot unpack $COMMIT" >&2; exit 2; }
    git rev-parse "$COMMIT" >"$OUT/src/commit"
fi
SRC=$(cd "$OUT/src/src" && pwd)
echo "${ORDER[*]}" >"$OUT/order"
for name in "${want[@]}"; do
    dir="$OUT/$name"
    if [ -d "$dir/final" ] && [ -f "$dir/wall_s" ]; then echo "skip $name (done)"; continue; fi
    echo "run $name: ${RUNS[$name]}"
    echo "${RUNS[$name]}" >"$OUT/options/$name"
    start=$(date +%s.%N)
    # shellcheck disable=SC2086  # the options are words
    if PYTHONPATH="$SRC" OMP_NUM_THREADS=1 "$PY" -m p3o train "${COMMON[@]}" --run_dir "$dir" ${RUNS[$name]} \
        >"$OUT/$name.log" 2>&1; then
        python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$start" "$(date +%s.%N)" \
            >"$dir/wall_s"
        echo "done $name: $(cat "$dir/wall_s") s"
    else
        echo "FAILED $name (see $OUT/$name.log)" >&2
    fi
done
