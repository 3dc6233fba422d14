"""scripts/gpu_check.sh without a GPU: every check says SKIP with the reason (exit 0), and --dry-run prints commands
whose options p3o's config accepts, so the script is ready to run once a device is lent."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from p3o.config import load_config

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
CHECKS = [
    "vllm_in_process",
    "vllm_in_a_worker",
    "vllm_fp8_weights",
    "collective_weight_group",
    "hf_model_device_cuda",
    "fsdp_one_gpu",
    "fsdp_two_gpus",
    "fsdp_bf16_mixed_precision",
    "bf16_mixed_precision_one_process",
    "fsdp_vllm_in_process",
    "fsdp_cpu_offload",
    "fsdp_bf16_reference_accumulation",
    "vllm_sampling_mask_replay",
]
TORCHRUN = {
    "fsdp_one_gpu": 1,
    "fsdp_two_gpus": 2,
    "fsdp_bf16_mixed_precision": 1,
    "fsdp_vllm_in_process": 1,
    "fsdp_cpu_offload": 1,
    "fsdp_bf16_reference_accumulation": 1,
}


def _script(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PY": sys.executable, "OUT": str(tmp_path)}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=120, env=env)


def test_dry_run_prints_one_valid_command_per_check(tmp_path):
    proc = _script("--dry-run", tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert [line.split()[1].rstrip(":") for line in lines] == CHECKS
    cfgs = {}
    for line in lines:
        name = line.split()[1].rstrip(":")
        argv = shlex.split(line.split(": ", 1)[1])
        if name in TORCHRUN:  # python -m torch.distributed.run --standalone --nproc_per_node N -m p3o train ...
            launch = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(TORCHRUN[name])]
            assert argv[1:6] == launch
            argv = argv[:1] + argv[6:]
        assert argv[1:4] == ["-m", "p3o", "train"]
        cfg = cfgs[name] = load_config(argv[4:])  # every option exists and every value is valid
        assert cfg.model.device == "cuda" and cfg.steps == 3
        if name in TORCHRUN:
            assert cfg.train.strategy == "fsdp"
        if "bf16" in name:
            assert cfg.train.mixed_precision == "bf16"
    assert cfgs["fsdp_vllm_in_process"].rollout.engine == "vllm"
    assert cfgs["fsdp_one_gpu"].ckpt.every == 3  # the check reads the sharded checkpoint of its last step


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: the checks would run for real")
def test_without_a_gpu_every_check_skips_with_the_reason(tmp_path):
    proc = _script(tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert [line.split()[1].rstrip(":") for line in lines] == CHECKS
    assert all(line.startswith("SKIP ") and "no CUDA GPU" in line and "unverified on GPU" in line for line in lines)
