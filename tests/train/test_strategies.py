"""`torchrun -m p3o train` with `train.strategy ddp` and `fsdp`, end to end over gloo (2 CPU ranks).

* ddp and fsdp end with the same parameters (each rank generates the same rollouts under both, so only the reduction
  order differs), and the fsdp checkpoint holds one shard file per rank, each about half the states;
* an fsdp checkpoint written at 2 ranks resumes at 1 rank (DCP reshards), a 1-process checkpoint resumes under fsdp
  at 2 ranks;
* SIGKILL of the whole process group, then `--resume` at 2 ranks, ends with the uninterrupted parameters exactly;
* LoRA (frozen base sharded, adapters trained) in the async loop with gradient checkpointing: ddp and fsdp agree.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
FAST = [
    "--loop.mode", "sync", "--log.eval_every", "0", "--log.progress", "false", "--log.plot", "false",
    "--rollout.prompts_per_step", "8", "--rollout.max_new_tokens", "32", "--update.micro_batch_size", "4",
    "--optim.schedule", "constant", "--ckpt.every", "1", "--ckpt.keep_last", "4", "--seed", "3",
]  # fmt: skip


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cmd(nproc: int, run_dir: Path, *args: str) -> list[str]:
    launch = [TORCHRUN, "--nproc_per_node", str(nproc), "--master_port", str(_port())]
    return [*launch, "-m", "p3o", "train", "--run_dir", str(run_dir), *FAST, *args]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}


def _train(nproc: int, run_dir: Path, *args: str, single: bool = False) -> subprocess.CompletedProcess:
    cmd = _cmd(nproc, run_dir, *args)
    if single:  # one plain process, no torchrun
        cmd = [sys.executable, "-m", "p3o", "train", "--run_dir", str(run_dir), *FAST, *args]
    done = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _final(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / "final" / "model.safetensors"))


def _steps(run_dir: Path) -> list[int]:
    return [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("fsdp") / "run"
    _train(2, run_dir, "--steps", "3", "--train.strategy", "fsdp")
    return run_dir


def test_ddp_and_fsdp_end_equal_and_fsdp_shards_the_states(fsdp_run, tmp_path):
    ddp = tmp_path / "ddp"
    _train(2, ddp, "--steps", "3", "--train.strategy", "ddp")
    losses = [json.loads(x).get("loss", 0.0) for x in (ddp / "metrics.jsonl").read_text().splitlines()]
    assert any(abs(v) > 0 for v in losses), "no gradient signal: the comparison would not bite"
    init_diff = _max_diff(_final(ddp), _final(fsdp_run))
    assert init_diff <= 1e-5
    shards = sorted((fsdp_run / "checkpoints" / "step_000003" / "sharded").glob("*.distcp"))
    assert len(shards) == 2
    sizes = [p.stat().st_size for p in shards]
    assert max(sizes) <= 0.55 * sum(sizes), sizes  # each rank wrote about half of the parameters + AdamW states
    assert all(v.dtype == torch.float32 for v in _final(fsdp_run).values())


def test_fsdp_checkpoint_resumes_at_one_rank(fsdp_run, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(fsdp_run, run_dir)
    shutil.rmtree(run_dir / "final")
    shutil.rmtree(run_dir / "checkpoints" / "step_000003")
    (run_dir / "checkpoints" / "latest").write_text("step_000002\n")
    _train(1, run_dir, "--steps", "3", "--train.strategy", "fsdp", "--resume")
    assert _steps(run_dir)[-1] == 3
    # and in one plain process (strategy auto: no process group at all), DCP reading both shards itself
    plain = tmp_path / "plain"
    shutil.copytree(run_dir, plain)
    shutil.rmtree(plain / "final")
    shutil.rmtree(plain / "checkpoints" / "step_000003")
    (plain / "checkpoints" / "latest").write_text("step_000002\n")
    _train(1, plain, "--steps", "3", "--train.strategy", "auto", "--resume", single=True)
    assert _steps(plain)[-1] == 3
    # one rank from the same step-2 state: the two one-rank continuations agree
    assert _max_diff(_final(run_dir), _final(plain)) <= 1e-5


def test_one_process_checkpoint_resumes_under_fsdp_at_two_ranks(tmp_path):
    run_dir = tmp_path / "run"
    _train(1, run_dir, "--steps", "1", single=True)
    _train(2, run_dir, "--steps", "2", "--train.strategy", "fsdp", "--resume")
    assert _steps(run_dir)[-1] == 2
    assert (run_dir / "checkpoints" / "step_000002" / "sharded").is_dir()


def test_sigkill_then_resume_gives_the_uninterrupted_parameters(fsdp_run, tmp_path):
    run_dir = tmp_path / "killed"
    proc = subprocess.Popen(
        _cmd(2, run_dir, "--steps", "3", "--train.strategy", "fsdp"),
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own process group: the launcher and both ranks die together
    )
    deadline = time.time() + 500
    while not (run_dir / "checkpoints" / "step_000002").is_dir():
        assert proc.poll() is None and time.time() < deadline, "the run ended before its second checkpoint"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (run_dir / "final").exists()
    _train(2, run_dir, "--steps", "3", "--train.strategy", "fsdp", "--resume")
    a, b = _final(run_dir), _final(fsdp_run)
    assert all(torch.equal(a[k], b[k]) for k in a), _max_diff(a, b)


def test_lora_async_checkpointed_agrees_between_ddp_and_fsdp(tmp_path):
    both = ("--steps", "2", "--model.lora.r", "8", "--loop.mode", "async", "--loop.max_lag", "1")
    both += ("--train.gradient_checkpointing", "true")  # non-reentrant checkpointing under DDP and FSDP2
    _train(2, tmp_path / "ddp", *both, "--train.strategy", "ddp")
    _train(2, tmp_path / "fsdp", *both, "--train.strategy", "fsdp")
    rows = [json.loads(x) for x in (tmp_path / "ddp" / "metrics.jsonl").read_text().splitlines()]
    assert any(abs(r.get("loss", 0.0)) > 0 for r in rows), "no gradient signal: the comparison would not bite"
    assert _max_diff(_final(tmp_path / "ddp"), _final(tmp_path / "fsdp")) <= 1e-5
