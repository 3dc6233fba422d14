"""Simulated low-precision rollout weights and activations (the source of rollout/trainer mismatch).

`int8` / `fp8` are W8A8 in the style of vLLM's dynamic FP8 / int8 schemes, simulated by quantise–dequantise
("fake quantisation") so they run anywhere, CPU included:

* weights: symmetric per-output-channel scales s_o = max_i |W_oi| / q_max, W̃ = s_o · Q(W / s_o);
* activations: symmetric dynamic per-token scales s_t = max_i |x_ti| / q_max computed at every call,
  x̃ = s_t · Q(x / s_t);
* Q = round-and-clamp to [−127, 127] for int8, a cast to torch.float8_e4m3fn (q_max = 448, round-to-nearest-even)
  for fp8. The matmul then runs in float32 on the dequantised values, which is what an exact int8/fp8 GEMM with
  float32 accumulation computes up to accumulation order.

`fp8-tensor` is the layout of vLLM's online dynamic FP8 (`quantization="fp8"` on an unquantised checkpoint): one
scale per weight tensor, s = max |W| / 448, one dynamic scale per activation tensor at every call,
s_t = max |x| / 448 over the whole (..., in) input, and the vocabulary head left in full precision. Its error is
larger than the per-channel / per-token `fp8` (one outlier sets the scale of a whole tensor).

Every `nn.Linear` is replaced (for `fp8-tensor`, all but the vocabulary head). Tied input/output embeddings are
untied first: the input embedding stays full precision (as in vLLM, where embeddings are not quantised) and only
the head copy is quantised. `bf16` / `fp16` simply cast the whole engine copy.

    model = quantize_model(copy.deepcopy(model), "fp8")
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from p3o.errors import ConfigError

__all__ = ["PRECISIONS", "QuantLinear", "fake_quant", "quantize_model", "requantize_", "untie_embeddings"]

PRECISIONS = ("fp32", "bf16", "fp16", "int8", "fp8", "fp8-tensor")
_QMAX = {"int8": 127.0, "fp8": 448.0, "fp8-tensor": 448.0}  # 448 = largest finite float8_e4m3fn


def fake_quant(x: Tensor, fmt: str) -> Tensor:
    """Quantise–dequantise `x` with one symmetric scale per row (scale over the last dim), or per tensor.

    s = max |x_row| / q_max (rows of zeros get s = 1), x̃ = s · Q(x / s). For weights (out, in) that is
    per-output-channel; for activations (..., in) it is per-token. `fmt` "fp8-tensor": one s = max |x| / 448 for the
    whole tensor (vLLM's online dynamic FP8).
    """
    if fmt not in _QMAX:
        raise ConfigError(f"rollout.precision: fake_quant supports {sorted(_QMAX)}, got {fmt!r}")
    xf = x.float()
    amax = xf.abs().amax() if fmt == "fp8-tensor" else xf.abs().amax(dim=-1, keepdim=True)
    scale = torch.where(amax > 0, amax / _QMAX[fmt], torch.ones_like(amax))
    y = xf / scale
    if fmt == "int8":
        q = y.round().clamp_(-127.0, 127.0)
    else:
        q = y.clamp(-448.0, 448.0).to(torch.float8_e4m3fn).float()
    return (q * scale).to(x.dtype)


class QuantLinear(nn.Linear):
    """An `nn.Linear` whose weight holds fake-quantised values and whose input is fake-quantised per token.

    The parameter names (`weight`, `bias`) are those of the wrapped Linear, so a full-precision state dict loads
    into it unchanged; call `requantize_()` after loading.
    """

    def __init__(self, linear: nn.Linear, fmt: str) -> None:
        super().__init__(
            linear.in_features,
            linear.out_features,
            bias=linear.bias is not None,
            device=linear.weight.device,
            dtype=linear.weight.dtype,
        )
        self.fmt = fmt
        with torch.no_grad():
            self.weight.copy_(linear.weight)
            if linear.bias is not None:
                self.bias.copy_(linear.bias)
        self.requantize_()

    @torch.no_grad()
    def requantize_(self) -> None:
        """Replace the weight by its per-output-channel fake quantisation (idempotent)."""
        self.weight.copy_(fake_quant(self.weight, self.fmt))

    def forward(self, x: Tensor) -> Tensor:  # (..., in) -> (..., out)
        return F.linear(fake_quant(x, self.fmt), self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, fmt={self.fmt}"


def untie_embeddings(model: nn.Module) -> None:
    """Give the output head its own copy of the weight when it is tied to the input embedding."""
    get_in = getattr(model, "get_input_embeddings", None)
    get_out = getattr(model, "get_output_embeddings", None)
    if get_in is None or get_out is None:
        return
    emb, head = get_in(), get_out()
    if emb is not None and head is not None and head.weight is emb.weight:
        head.weight = nn.Parameter(emb.weight.detach().clone(), requires_grad=False)
    cfg = getattr(model, "config", None)
    if cfg is not None and hasattr(cfg, "tie_word_embeddings"):
        cfg.tie_word_embeddings = False  # so that nothing re-ties them later (e.g. post_init / tie_weights)
    if hasattr(model, "_tied_weights_keys"):
        model._tied_weights_keys = None if not isinstance(model._tied_weights_keys, dict) else {}


def quantize_model(model: nn.Module, precision: str) -> nn.Module:
    """Convert `model` in place to a rollout precision and return it.

    fp32 / bf16 / fp16: cast every parameter and buffer. int8 / fp8: untie embeddings, then replace every
    `nn.Linear` (vocab head included) by a `QuantLinear` (float32 compute on fake-quantised values). fp8-tensor:
    the same with per-tensor scales, the vocabulary head kept in float32 (as vLLM leaves it unquantised).
    """
    if precision not in PRECISIONS:
        raise ConfigError(f"rollout.precision: unknown precision {precision!r}; choose from {', '.join(PRECISIONS)}")
    if precision in ("fp32", "bf16", "fp16"):
        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
        return model.to(dtype)
    model.float()
    untie_embeddings(model)
    get_out = getattr(model, "get_output_embeddings", None)
    head = get_out() if get_out is not None and precision == "fp8-tensor" else None
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and child is not head:
                setattr(parent, name, QuantLinear(child, precision))
    return model


def requantize_(model: nn.Module) -> None:
    """Re-apply weight quantisation to every `QuantLinear` (after new full-precision weights were loaded)."""
    for mod in model.modules():
        if isinstance(mod, QuantLinear):
            mod.requantize_()
