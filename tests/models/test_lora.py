"""LoRA adapters (p3o.models.lora) on a tiny random Qwen3: which parameters train, merged weights ≡ adapter forward,
the engine sync, the adapters-off reference and the one-line errors."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from tiny_lm import make_tiny_lm

pytest.importorskip("peft")

from p3o.config import LoraConfig
from p3o.errors import ConfigError
from p3o.logprobs import token_logprobs
from p3o.models.lora import AdaptersOff, apply_lora, is_lora, merged_copy, merged_weights, resolve_target_modules
from p3o.rollout import HFEngine

N, P, T = 8, 5, 6


def _batch(seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    prompt_ids = torch.randint(3, 64, (N, P), generator=g)
    prompt_mask = torch.ones(N, P, dtype=torch.bool)
    response_ids = torch.randint(3, 64, (N, T), generator=g)
    mask = torch.arange(T)[None] < torch.randint(1, T + 1, (N,), generator=g)[:, None]
    return prompt_ids, prompt_mask, response_ids, mask


def _logp(model: torch.nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    with torch.no_grad():
        return token_logprobs(model, *batch)[0]


def _lora_model(r: int = 4, targets: str | None = None) -> torch.nn.Module:
    model = apply_lora(make_tiny_lm(), LoraConfig(r=r, alpha=8.0, target_modules=targets), seed=0)
    with torch.no_grad():  # B = 0 at init makes every adapter a no-op: give them a non-zero update
        g = torch.Generator().manual_seed(1)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
    return model


def _step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: tuple[torch.Tensor, ...]) -> None:
    logp, _ = token_logprobs(model, *batch)
    (-(logp * batch[3]).sum()).backward()
    optimizer.step()
    optimizer.zero_grad()


def test_only_adapters_get_gradients_and_optimizer_state():
    from p3o.train.step import make_optimizer

    model = _lora_model()
    base_before = {k: v.clone() for k, v in model.state_dict().items() if "lora_" not in k}
    opt = make_optimizer(model, 1e-2)
    logp, _ = token_logprobs(model, *_batch())
    (-logp.sum()).backward()
    with_grad = {n for n, p in model.named_parameters() if p.grad is not None}
    adapters = {n for n, _ in model.named_parameters() if "lora_" in n}
    assert with_grad == adapters and adapters
    assert {n for n, p in model.named_parameters() if p.requires_grad} == adapters
    opt.step()
    in_state = {id(p) for p in opt.state}
    assert in_state == {id(p) for n, p in model.named_parameters() if "lora_" in n}
    for k, v in model.state_dict().items():  # the base is frozen
        if "lora_" not in k:
            assert torch.equal(v, base_before[k]), k


def test_default_targets_are_attention_and_mlp_projections():
    model = make_tiny_lm()
    assert resolve_target_modules(model, None) == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                   "down_proj"]  # fmt: skip
    assert resolve_target_modules(model, "q_proj, v_proj") == ["q_proj", "v_proj"]
    assert "lm_head" not in resolve_target_modules(model, "all-linear")


def test_merged_weights_give_the_adapter_forward_log_probs():
    model = _lora_model()
    batch = _batch()
    plain = merged_copy(model)
    assert not is_lora(plain) and is_lora(model)
    assert set(merged_weights(model)) <= set(plain.state_dict())
    torch.testing.assert_close(_logp(plain, batch), _logp(model, batch), atol=1e-5, rtol=0)
    base = _logp(make_tiny_lm(), batch)
    assert (_logp(model, batch) - base).abs().max() > 1e-3  # the adapters do change the model


def test_engine_sync_after_an_update_follows_the_policy():
    from p3o.train.step import make_optimizer

    model = _lora_model()
    batch = _batch()
    engine = HFEngine(merged_copy(model), None, max_new_tokens=4, pad_token_id=0)
    before = _logp(engine.model, batch)
    opt = make_optimizer(model, 5e-2)
    _step(model, opt, batch)
    assert torch.equal(_logp(engine.model, batch), before)  # not synced yet
    sent = merged_weights(model)
    assert all(".lora_" not in k and "embed" not in k for k in sent)  # only the adapted layers travel
    engine.load_weights(sent, version=1)
    after = _logp(engine.model, batch)
    assert (after - before).abs().max() > 1e-3
    torch.testing.assert_close(after, _logp(model, batch), atol=1e-5, rtol=0)


def test_reference_is_the_base_with_adapters_off_and_shares_its_tensors():
    model = _lora_model()
    batch = _batch()
    ref = AdaptersOff(model).eval().requires_grad_(False)
    assert list(ref.parameters()) == []  # nothing copied, nothing registered
    torch.testing.assert_close(_logp(ref, batch), _logp(make_tiny_lm(), batch), atol=1e-6, rtol=0)
    assert any(p.requires_grad for p in model.parameters())  # freezing the view left the adapters trainable
    assert (_logp(model, batch) - _logp(ref, batch)).abs().max() > 1e-3  # and the adapters are back on after


def test_bad_target_modules_is_one_clear_line():
    with pytest.raises(ConfigError) as err:
        apply_lora(make_tiny_lm(), LoraConfig(r=4, target_modules="q_proj,qkv"), seed=0)
    msg = str(err.value)
    assert "\n" not in msg and "'qkv'" in msg and "model.lora.target_modules" in msg and "q_proj" in msg


def test_bad_target_modules_from_the_cli_exits_2_with_one_line(tmp_path):
    cmd = [sys.executable, "-m", "p3o", "train", "--model.name", "tiny-random", "--model.lora.r", "4"]
    cmd += ["--model.lora.target_modules", "attn", "--steps", "1", "--run_dir", str(tmp_path / "run")]
    cmd += ["--task.n_eval", "0", "--log.progress", "false"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "model.lora.target_modules" in lines[0] and "'attn'" in lines[0], proc.stderr


def test_missing_peft_names_the_extra(monkeypatch):
    from p3o.models import lora

    monkeypatch.setitem(sys.modules, "peft", None)
    with pytest.raises(ImportError, match=r"p3o\[lora\]"):
        lora.require_peft()
