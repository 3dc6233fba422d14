#!/usr/bin/env bash
# GPU readiness of the scale-out pipeline, one line per check (PASS / FAIL / SKIP name (seconds): detail), in at most
# ~8 minutes on one GPU. Every check is a short `p3o train` run (tiny-random model, 3 steps) and fails on its exit
# status; its log is kept under $OUT.
#   bash scripts/gpu_check.sh                    # python: $PY, else .venv-vllm/bin/python, else python3
#   PY=/opt/venv/bin/python MODEL=smollm2 bash scripts/gpu_check.sh
#   bash scripts/gpu_check.sh --dry-run          # print the commands only (works on any machine)
# Checks: vLLM engine in-process; vLLM engine in a Ray worker; fp8 weights (vLLM); the collective weight group with
# one worker (NCCL when the worker has a GPU of its own, gloo when it shares the trainer's); --model.device cuda (HF
# engine). Without a CUDA GPU every check prints SKIP with the reason, and the script exits 0.
# Until a device has run it, docs/gpu.md and docs/scaling.md say "unverified on GPU" next to each check.
set -uo pipefail
cd "$(dirname "$0")/.."
DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1
if [ -n "${PY:-}" ]; then :; elif [ -x .venv-vllm/bin/python ]; then PY=.venv-vllm/bin/python; else PY=python3; fi
MODEL="${MODEL:-tiny-random}"
OUT="${OUT:-$(mktemp -d /tmp/p3o-gpu-check.XXXXXX)}"
PER_CHECK_S="${PER_CHECK_S:-90}"
BASE=(-m p3o train --model.name "$MODEL" --steps 3 --rollout.prompts_per_step 4 --rollout.group_size 2
      --rollout.max_new_tokens 16 --task.n_eval 0 --log.eval_every 0 --ckpt.every 0 --log.progress false
      --log.plot false --log.tensorboard false --model.device cuda)

GPUS=0
if [ "$DRY" = 0 ]; then
    GPUS=$("$PY" -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)" 2>/dev/null \
        || echo 0)
fi
failed=0

check() {  # check NAME ARGS...: one p3o train run
    local name=$1; shift
    local cmd=("$PY" "${BASE[@]}" --run_dir "$OUT/$name" "$@")
    if [ "$DRY" = 1 ]; then
        echo "DRY  $name: ${cmd[*]}"
        return
    fi
    if [ "$GPUS" = 0 ]; then
        echo "SKIP $name: no CUDA GPU visible to $PY (unverified on GPU)"
        return
    fi
    local t0=$SECONDS
    if timeout "$PER_CHECK_S" "${cmd[@]}" >"$OUT/$name.log" 2>&1; then
        echo "PASS $name ($((SECONDS - t0)) s)"
    else
        failed=1
        echo "FAIL $name ($((SECONDS - t0)) s): $(grep -v '^\s*$' "$OUT/$name.log" | tail -1 | cut -c1-200) [$OUT/$name.log]"
    fi
}

check vllm_in_process --rollout.engine vllm --loop.mode sync
check vllm_in_a_worker --rollout.engine vllm --rollout.workers 1 --rollout.colocate true --loop.mode async
check vllm_fp8_weights --rollout.engine vllm --rollout.precision fp8 --loop.mode sync
if [ "$DRY" = 0 ] && [ "$GPUS" = 1 ]; then
    echo "NOTE collective_weight_group: 1 GPU, the worker shares the trainer's device: the group is gloo (NCCL needs a GPU per member)"
fi
check collective_weight_group --rollout.workers 1 --rollout.weight_sync collective --rollout.colocate "$([ "$GPUS" -ge 2 ] && echo false || echo true)" --loop.mode sync
check hf_model_device_cuda --rollout.engine hf --loop.mode sync
exit $failed
