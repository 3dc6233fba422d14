"""The placement's one-process behaviour and its one-line refusals (the 2-rank behaviour: tests/invariants/
test_partition.py and tests/train/test_strategies.py)."""

from __future__ import annotations

import pytest
import torch
from train_fakes import make_tiny_lm, random_batch

from p3o.errors import ConfigError
from p3o.objectives import get_objective
from p3o.train.loop import _own_source_state
from p3o.train.placement import Placement, PlacementSettings, check_placement, decoder_layers
from p3o.train.step import update


def test_unknown_strategy_or_precision_is_one_line():
    with pytest.raises(ConfigError, match=r"train\.strategy: unknown strategy 'zero3'"):
        PlacementSettings("zero3")
    with pytest.raises(ConfigError, match=r"train\.mixed_precision: unknown precision 'fp8'"):
        PlacementSettings("auto", "fp8")


def test_what_this_process_cannot_run_is_refused_before_any_model_loads():
    cpu = torch.device("cpu")
    with pytest.raises(ConfigError, match=r"fsdp: needs a process group; launch with torchrun"):
        check_placement(PlacementSettings("fsdp"), cpu)
    with pytest.raises(ConfigError, match=r"cpu_offload: offloads FSDP shards"):
        check_placement(PlacementSettings("ddp", cpu_offload=True), cpu)
    check_placement(PlacementSettings("auto", "bf16"), cpu)  # bf16 autocast exists on every CPU torch supports


def test_decoder_layers_are_the_hf_no_split_blocks():
    model = make_tiny_lm(seed=0)
    layers = decoder_layers(model)
    assert [type(m).__name__ for m in layers] == ["Qwen3DecoderLayer"] * 2


def test_one_process_is_unwrapped_and_describes_itself():
    model = make_tiny_lm(seed=0)
    p = Placement(model, PlacementSettings("auto", "bf16"))
    assert p.strategy == "single" and not p.sharded and p.weights().keys() == model.state_dict().keys()
    assert p.describe() == {"strategy": "single", "world_size": 1, "param_dtype": "float32", "compute": "bfloat16"}


def test_bf16_mixed_precision_keeps_fp32_master_weights_and_adam_states():
    """The forward and backward run in bf16 (the log-probs differ from fp32's), the parameters, their gradients and
    AdamW's moments stay float32."""
    model = make_tiny_lm(seed=0)
    batch = random_batch(make_tiny_lm(seed=0), n=4, seed=1, noise=0.3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    placement = Placement(model, PlacementSettings("auto", "bf16"))
    stats = update(model, opt, None, batch, get_objective("grpo"), {}, micro_batch_size=4, placement=placement)
    assert stats["grad_norm"] > 0
    assert all(p.dtype == torch.float32 for p in model.parameters())
    states = [v for s in opt.state.values() for k, v in s.items() if k != "step"]
    assert states and all(v.dtype == torch.float32 for v in states)
    fp32 = Placement(make_tiny_lm(seed=0))
    plan_mb = type("MB", (), {k: getattr(batch, k) for k in ("prompt_ids", "prompt_mask", "response_ids", "mask")})
    lp32, _ = fp32.logprobs(plan_mb, grad=False)
    lp16, _ = Placement(make_tiny_lm(seed=0), PlacementSettings("auto", "bf16")).logprobs(plan_mb, grad=False)
    assert lp16.dtype == torch.float32 and not torch.equal(lp32[batch.mask], lp16[batch.mask])


def test_queued_batches_of_another_world_size_are_dropped(capsys):
    two = {"rank_source": {0: {"queue": [1]}, 1: {"queue": [2]}}}
    assert _own_source_state(two, 5) is None
    assert "queued batches are dropped" in capsys.readouterr().err
    assert _own_source_state({"rank_source": {0: {"queue": [1]}}}, 5) == {"queue": [1]}
    assert _own_source_state({}, 5) is None
