"""The training loop with LoRA (model.lora.r > 0) on the tiny fakes: bit-identical resume in the sync loop, PEFT
checkpoints and a merged plain-HF final/, the adapters-off reference, every loop mode and data parallel on gloo."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
import torch
import train_fakes

pytest.importorskip("peft")

from p3o.train import checkpoint, loop

LORA = {"model.lora.r": 4, "model.lora.alpha": 8.0, "optim.lr": 5e-2}


def _adapters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items() if "lora_" in k}


def _run(run_dir: Path, **overrides) -> loop.Components:
    cfg = train_fakes.fake_config(run_dir, **{**LORA, **overrides})
    comps = train_fakes.fake_components(cfg.seed)
    loop.run(cfg, components=comps)
    return comps


def test_lora_checkpoint_resume_is_bit_identical(tmp_path, monkeypatch):
    steps = {"steps": 4, "ckpt.every": 1, "objective.ref_kl_coef": 0.05}
    reference = _adapters(_run(tmp_path / "a", **steps).policy)

    real_save, calls = checkpoint.save_checkpoint, {"n": 0}

    def crash_after_two(*a, **kw):  # the process "dies" right after the step-2 checkpoint
        out = real_save(*a, **kw)
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return out

    monkeypatch.setattr(checkpoint, "save_checkpoint", crash_after_two)
    with pytest.raises(KeyboardInterrupt):
        _run(tmp_path / "b", **steps)
    monkeypatch.setattr(checkpoint, "save_checkpoint", real_save)
    policy_dir = tmp_path / "b" / "checkpoints" / "step_000002" / "policy"
    assert (policy_dir / "adapter_config.json").is_file() and (policy_dir / "adapter_model.safetensors").is_file()
    assert not (policy_dir / "model.safetensors").exists()  # adapters only, PEFT format
    resumed = _run(tmp_path / "b", **steps, **{"ckpt.resume": True})
    got = _adapters(resumed.policy)
    assert got.keys() == reference.keys() and got
    for k in got:
        assert torch.equal(got[k], reference[k]), k
    rows = [json.loads(x) for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and all("time_sync_s" in r for r in rows)


def test_final_is_a_plain_merged_hf_checkpoint(tmp_path):
    from transformers import AutoModelForCausalLM

    from p3o.models.lora import merged_weights

    comps = _run(tmp_path, steps=2)
    final = tmp_path / "final"
    assert not (final / "adapter_config.json").exists()
    plain = AutoModelForCausalLM.from_pretrained(final)
    own = plain.state_dict()
    merged = merged_weights(comps.policy)
    base = train_fakes.make_tiny_lm(0).state_dict()
    assert any(not torch.equal(v, base[k]) for k, v in merged.items())  # training moved the merged weights
    for k, v in merged.items():
        assert torch.equal(own[k], v), k


@pytest.mark.parametrize("mode", ["stale", "async", "reuse"])
def test_every_loop_mode_trains_only_the_adapters(tmp_path, mode):
    comps = _run(tmp_path, steps=3, **{"loop.mode": mode, "loop.staleness": 1, "loop.max_lag": 1})
    params = dict(comps.policy.named_parameters())
    base = train_fakes.make_tiny_lm(0).state_dict()
    for name, p in params.items():
        if "lora_" not in name:
            key = name.replace("base_model.model.", "").replace(".base_layer", "")
            assert torch.equal(p.detach(), base[key]), name
    assert any(not torch.equal(v, torch.zeros_like(v)) for k, v in _adapters(comps.policy).items() if "lora_B" in k)


def _dp_rank(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    from p3o import dist

    try:
        comps = _run(Path(out_dir) / "run", steps=2)
        torch.save(_adapters(comps.policy), Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy()


def test_data_parallel_ranks_keep_identical_adapters(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.multiprocessing.start_processes(
        _dp_rank, args=(2, port, str(tmp_path)), nprocs=2, join=True, start_method="fork"
    )
    a, b = torch.load(tmp_path / "rank0.pt"), torch.load(tmp_path / "rank1.pt")
    assert a.keys() == b.keys() and a
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert any(not torch.equal(v, torch.zeros_like(v)) for k, v in a.items() if "lora_B" in k)
