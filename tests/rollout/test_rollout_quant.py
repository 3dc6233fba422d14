"""p3o.rollout.quant and precision modes: W8A8 fake quantisation, untied embeddings, real rollout/trainer mismatch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tiny_lm import make_tiny_lm
from torch import nn

from p3o.errors import ConfigError
from p3o.logprobs import token_logprobs
from p3o.rollout import HFEngine
from p3o.rollout.quant import QuantLinear, fake_quant, quantize_model

PROMPTS = [[1, *torch.randint(3, 64, (6,), generator=torch.Generator().manual_seed(i)).tolist()] for i in range(8)]


def test_fake_quant_int8_grid_and_error_bound():
    x = torch.randn(5, 40, generator=torch.Generator().manual_seed(0))
    x[2] = 0.0  # an all-zero row must stay zero (scale 1, no division by zero)
    q = fake_quant(x, "int8")
    scale = x.abs().amax(-1, keepdim=True) / 127
    scale[2] = 1.0
    steps = q / scale
    torch.testing.assert_close(steps, steps.round(), atol=1e-4, rtol=0)  # on the integer grid
    assert (steps.abs() <= 127 + 1e-4).all()
    assert ((q - x).abs() <= scale / 2 + 1e-6).all()
    assert (q[2] == 0).all()
    # The row maximum is exactly representable (it maps to ±127).
    torch.testing.assert_close(q.abs().amax(-1), x.abs().amax(-1))


def test_fake_quant_fp8_is_representable_and_per_row():
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(1)) * torch.tensor([[1e-3], [1.0], [30.0], [1e4]])
    q = fake_quant(x, "fp8")
    scale = x.abs().amax(-1, keepdim=True) / 448
    scaled = q / scale
    torch.testing.assert_close(scaled.to(torch.float8_e4m3fn).float(), scaled, atol=1e-3, rtol=1e-5)
    rel = ((q - x).abs() / x.abs().amax(-1, keepdim=True)).max()
    assert 0 < rel < 0.07  # e4m3 has 3 mantissa bits: relative step 2^-3 at the top of the range
    # Per-row scales: each row is quantised independently of the others.
    torch.testing.assert_close(fake_quant(x[1:2], "fp8"), q[1:2])
    with pytest.raises(ConfigError, match=r"rollout\.precision"):
        fake_quant(x, "int4")


def test_quant_linear_is_w8a8():
    lin = nn.Linear(12, 7)
    ql = QuantLinear(lin, "int8")
    x = torch.randn(3, 5, 12)
    expected = F.linear(fake_quant(x, "int8"), fake_quant(lin.weight, "int8"), lin.bias)
    torch.testing.assert_close(ql(x), expected)
    before = ql.weight.detach().clone()
    ql.requantize_()
    torch.testing.assert_close(ql.weight.detach(), before)  # idempotent


def test_quantize_model_replaces_every_linear_and_unties_embeddings(tiny_lm):
    orig_emb = tiny_lm.model.embed_tokens.weight.detach().clone()
    n_linear = sum(type(m) is nn.Linear for m in tiny_lm.modules())
    eng = HFEngine(tiny_lm, precision="fp8")
    model = eng.model
    assert sum(isinstance(m, QuantLinear) for m in model.modules()) == n_linear
    assert not any(type(m) is nn.Linear for m in model.modules())
    # Input embedding untouched (full precision); the head is a separate, quantised copy.
    assert model.lm_head.weight is not model.model.embed_tokens.weight
    torch.testing.assert_close(model.model.embed_tokens.weight, orig_emb, atol=0, rtol=0)
    torch.testing.assert_close(model.lm_head.weight, fake_quant(orig_emb, "fp8"))
    assert not torch.equal(model.lm_head.weight, orig_emb)
    # The caller's model is still tied and unchanged.
    assert tiny_lm.lm_head.weight is tiny_lm.model.embed_tokens.weight
    assert type(tiny_lm.lm_head) is nn.Linear
    with pytest.raises(ConfigError, match=r"rollout\.precision"):
        quantize_model(make_tiny_lm(), "fp4")


def test_bf16_fp16_cast_the_engine_copy(tiny_lm):
    for prec, dtype in [("bf16", torch.bfloat16), ("fp16", torch.float16)]:
        eng = HFEngine(tiny_lm, precision=prec)
        assert {p.dtype for p in eng.model.parameters()} == {dtype}
    assert {p.dtype for p in tiny_lm.parameters()} == {torch.float32}


def test_load_weights_requantises(tiny_lm):
    eng = HFEngine(tiny_lm, precision="int8", max_new_tokens=4)
    new = make_tiny_lm(seed=9)
    sd = new.state_dict()
    eng.load_weights(sd, version=2)
    q = eng.model.model.layers[0].self_attn.q_proj.weight
    torch.testing.assert_close(q, fake_quant(new.model.layers[0].self_attn.q_proj.weight, "int8"))
    torch.testing.assert_close(eng.model.lm_head.weight, fake_quant(new.model.embed_tokens.weight, "int8"))
    torch.testing.assert_close(eng.model.model.embed_tokens.weight, new.model.embed_tokens.weight, atol=0, rtol=0)
    # A tied checkpoint saved without lm_head.weight: the untied head follows the input embedding.
    newer = make_tiny_lm(seed=10)
    sd = {k: v for k, v in newer.state_dict().items() if k != "lm_head.weight"}
    eng.load_weights(sd, version=3)
    torch.testing.assert_close(eng.model.lm_head.weight, fake_quant(newer.model.embed_tokens.weight, "int8"))
    ro = eng.generate(PROMPTS[:2], n=2, seed=0)
    assert (ro.policy_version[ro.mask] == 3).all()


def _mismatch(model: nn.Module, precision: str) -> float:
    ro = HFEngine(model, precision=precision, max_new_tokens=16).generate(PROMPTS, n=4, seed=0)
    lp, _ = token_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.response_ids, ro.mask)
    return float((lp.detach() - ro.rollout_logp)[ro.mask].abs().mean())


def test_precisions_really_change_logprobs_in_order():
    model = make_tiny_lm(hidden=64)
    mm = {p: _mismatch(model, p) for p in ("fp32", "fp16", "bf16", "int8", "fp8")}
    assert mm["fp32"] < 1e-5
    assert mm["fp32"] < mm["fp16"] < mm["bf16"] < mm["fp8"], mm
    assert mm["int8"] > 10 * mm["fp32"], mm
    assert mm["fp8"] > 1e-3, mm


@pytest.mark.parametrize("precision", ["bf16", "fp16", "int8", "fp8"])
def test_quantised_engines_still_generate_sensible_tokens(precision):
    model = make_tiny_lm(hidden=64)
    ref = HFEngine(model, temperature=0.0, max_new_tokens=8).generate(PROMPTS, n=1)
    got = HFEngine(model, temperature=0.0, precision=precision, max_new_tokens=8).generate(PROMPTS, n=1)
    assert (got.response_ids[:, 0] == ref.response_ids[:, 0]).float().mean() >= 0.85
    assert (got.response_ids == ref.response_ids).float().mean() >= 0.7


def test_fp8_tensor_is_per_tensor_with_the_head_in_full_precision(tiny_lm):
    """vLLM's online FP8 layout: one scale per weight tensor and per activation tensor, the head left unquantised."""
    w = torch.randn(6, 32, generator=torch.Generator().manual_seed(1))
    w[0] *= 50.0  # one outlier row sets the scale of the whole tensor
    q = fake_quant(w, "fp8-tensor")
    s = w.abs().max() / 448.0
    torch.testing.assert_close(q, (w / s).to(torch.float8_e4m3fn).float() * s)
    per_row = fake_quant(w, "fp8")
    assert (q[1:] - w[1:]).abs().mean() > (per_row[1:] - w[1:]).abs().mean()  # coarser than per-row on small rows
    n_linear = sum(type(m) is nn.Linear for m in tiny_lm.modules())
    model = HFEngine(tiny_lm, precision="fp8-tensor").model
    assert sum(isinstance(m, QuantLinear) for m in model.modules()) == n_linear - 1  # all but the head
    assert type(model.lm_head) is nn.Linear
    torch.testing.assert_close(model.lm_head.weight, tiny_lm.lm_head.weight, atol=0, rtol=0)
    lin = next(m for m in model.modules() if isinstance(m, QuantLinear))
    x = torch.randn(3, 5, lin.in_features)
    sx = x.abs().max() / 448.0
    expect = F.linear((x / sx).to(torch.float8_e4m3fn).float() * sx, lin.weight, lin.bias)
    torch.testing.assert_close(lin(x), expect)
