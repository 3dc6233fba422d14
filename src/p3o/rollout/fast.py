"""A lean decode step for Llama-family HF models (Llama / SmolLM2, Qwen2, Qwen3) with a preallocated KV cache.

transformers' per-step forward is general: it rebuilds a 4D attention mask, concatenates onto a growing cache and
runs q/k/v and gate/up as separate matmuls. For the small models p3o trains on CPU that overhead is most of a
decode step. `FastDecoder` reuses the model's own modules (norms, rotary embedding, o/down projections, head, and
the modelling file's `apply_rotary_pos_emb`) but fuses q|k|v and gate|up into one matmul each (exact: the rows of
a Linear are independent, and per-output-channel weight / per-token activation fake quantisation commute with
stacking rows) and writes keys/values into a static buffer. The prefill still runs the full HF forward.

    fast = FastDecoder(model) if FastDecoder.supports(model) else None
    fast.start(cache, prompt_mask, max_new_tokens); logits = fast.step(tokens, positions, t)
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from p3o.rollout.quant import QuantLinear, fake_quant

__all__ = ["FastDecoder"]

_SUPPORTED = ("llama", "qwen2", "qwen3")


class _Fused:
    """Several Linears that read the same input, stacked into one (out_1 + out_2 + …, in) matmul."""

    def __init__(self, linears: list[nn.Linear]) -> None:
        self.linears = linears
        self.sizes = [lin.out_features for lin in linears]
        first = linears[0]
        self.fmt = first.fmt if isinstance(first, QuantLinear) else None
        self.refresh()

    @torch.no_grad()
    def refresh(self) -> None:
        self.weight = torch.cat([lin.weight for lin in self.linears])
        has_bias = [lin.bias is not None for lin in self.linears]
        self.bias = None
        if any(has_bias):
            self.bias = torch.cat(
                [lin.bias if lin.bias is not None else lin.weight.new_zeros(lin.out_features) for lin in self.linears]
            )

    def __call__(self, x: Tensor) -> list[Tensor]:
        if self.fmt is not None:
            x = fake_quant(x, self.fmt)
        return list(F.linear(x, self.weight, self.bias).split(self.sizes, dim=-1))


def _rms_norm(module: nn.Module, x: Tensor) -> Tensor:
    """HF Llama/Qwen RMSNorm, w · (x / sqrt(mean(x²) + ε)) normalised in float32, as one fused op when possible."""
    eps = getattr(module, "variance_epsilon", None)
    if eps is None:
        return module(x)
    if x.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), module.weight, eps)
    return module.weight * F.rms_norm(x.float(), (x.shape[-1],), None, eps).to(x.dtype)


def _cache_kv(cache, i: int) -> tuple[Tensor, Tensor]:
    """Keys/values (N, kv heads, L, head dim) of layer i of an HF DynamicCache (transformers ≥ 4.56 or older)."""
    if hasattr(cache, "layers"):
        return cache.layers[i].keys, cache.layers[i].values
    return cache.key_cache[i], cache.value_cache[i]


class FastDecoder:
    """Static-KV-cache single-token decode for Llama-family causal LMs (numerically the same ops as transformers)."""

    @staticmethod
    def supports(model: nn.Module) -> bool:
        """True for Llama / Qwen2 / Qwen3 models without sliding windows, with SiLU MLPs and the expected layout."""
        cfg = getattr(model, "config", None)
        if cfg is None or getattr(cfg, "model_type", None) not in _SUPPORTED:
            return False
        if getattr(cfg, "use_sliding_window", False) or getattr(cfg, "hidden_act", "silu") != "silu":
            return False
        if getattr(cfg, "_attn_implementation", "sdpa") not in ("sdpa", "eager", None):
            return False
        inner = getattr(model, "model", None)
        try:
            layer = inner.layers[0]
            attn, mlp = layer.self_attn, layer.mlp
            ok = all(hasattr(attn, a) for a in ("q_proj", "k_proj", "v_proj", "o_proj"))
            ok = ok and all(hasattr(mlp, a) for a in ("gate_proj", "up_proj", "down_proj"))
            ok = ok and hasattr(inner, "rotary_emb") and hasattr(inner, "norm") and hasattr(model, "lm_head")
        except (AttributeError, IndexError, TypeError):
            return False
        return bool(ok)

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        inner = model.model
        cfg = model.config
        self.embed = inner.embed_tokens
        self.rotary = inner.rotary_emb
        self.norm = inner.norm
        self.head = model.lm_head
        self.layers = list(inner.layers)
        self.n_heads = cfg.num_attention_heads
        self.n_kv = getattr(cfg, "num_key_value_heads", None) or self.n_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads
        attn0 = self.layers[0].self_attn
        self.scaling = getattr(attn0, "scaling", self.head_dim**-0.5)
        self.rope = sys.modules[type(attn0).__module__].apply_rotary_pos_emb
        self.qkv: list[_Fused] = []
        self.gate_up: list[_Fused] = []
        self.refresh()
        self.k: Tensor | None = None
        self.v: Tensor | None = None
        self.mask: Tensor | None = None
        self.bias: Tensor | None = None
        self.prompt_len = 0

    def refresh(self) -> None:
        """Rebuild the fused weights (call after the model's weights changed)."""
        self.qkv = [_Fused([l.self_attn.q_proj, l.self_attn.k_proj, l.self_attn.v_proj]) for l in self.layers]  # noqa: E741
        self.gate_up = [_Fused([l.mlp.gate_proj, l.mlp.up_proj]) for l in self.layers]  # noqa: E741

    def start(self, cache, prompt_mask: Tensor, max_new_tokens: int) -> None:
        """Copy a prefilled HF cache (N rows, P prompt columns) into static buffers with room for the response.

        Args:
            cache: the DynamicCache returned by the prefill forward (already repeated to N rows).
            prompt_mask: (N, P) bool, True = real prompt token.
        """
        n, p = prompt_mask.shape
        k0, _ = _cache_kv(cache, 0)
        shape = (len(self.layers), n, self.n_kv, p + max_new_tokens, self.head_dim)
        self.k = torch.empty(shape, dtype=k0.dtype, device=k0.device)
        self.v = torch.empty(shape, dtype=k0.dtype, device=k0.device)
        for i in range(len(self.layers)):
            k, v = _cache_kv(cache, i)
            self.k[i, :, :, :p] = k
            self.v[i, :, :, :p] = v
        self.mask = torch.ones((n, 1, 1, p + max_new_tokens), dtype=torch.bool, device=prompt_mask.device)
        self.mask[:, 0, 0, :p] = prompt_mask
        self.bias = torch.zeros(self.mask.shape, dtype=torch.float32, device=prompt_mask.device)
        self.bias.masked_fill_(~self.mask, float("-inf"))
        self.prompt_len = p

    def step(self, tokens: Tensor, positions: Tensor, t: int) -> Tensor:
        """Feed response token t of every row at its position; return next-token logits (N, V).

        Args:
            tokens: (N,) long, the token at response index t; positions: (N,) long, their position ids.
        """
        assert self.k is not None and self.v is not None and self.mask is not None, "call start() first"
        n = tokens.shape[0]
        col = self.prompt_len + t
        x = self.embed(tokens[:, None])  # (N, 1, H)
        cos, sin = self.rotary(x, positions[:, None])
        groups = self.n_heads // self.n_kv
        bias = self.bias[:, :, :, : col + 1]  # (N, 1, 1, L) additive mask: 0 or −inf
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            h = _rms_norm(layer.input_layernorm, x)
            q, k, v = self.qkv[i](h)
            q = q.view(n, 1, self.n_heads, self.head_dim)
            k = k.view(n, 1, self.n_kv, self.head_dim)
            if hasattr(attn, "q_norm"):
                q, k = _rms_norm(attn.q_norm, q), _rms_norm(attn.k_norm, k)
            q, k = self.rope(q.transpose(1, 2), k.transpose(1, 2), cos, sin)  # (N, heads, 1, D)
            self.k[i, :, :, col] = k[:, :, 0]
            self.v[i, :, :, col] = v.view(n, self.n_kv, self.head_dim)
            # Single-query attention as two batched matmuls over (kv head, query group): cheaper than SDPA here.
            keys, values = self.k[i, :, :, : col + 1], self.v[i, :, :, : col + 1]  # (N, KV, L, D)
            scores = torch.matmul(q.reshape(n, self.n_kv, groups, self.head_dim), keys.transpose(-1, -2))
            probs = scores.float().mul_(self.scaling).add_(bias).softmax(-1)  # (N, KV, G, L), float32 softmax
            o = torch.matmul(probs.to(values.dtype), values)  # (N, KV, G, D) = (N, heads, D) in head order
            x = x + attn.o_proj(o.reshape(n, 1, self.n_heads * self.head_dim))
            h = _rms_norm(layer.post_attention_layernorm, x)
            g, u = self.gate_up[i](h)
            x = x + layer.mlp.down_proj(F.silu(g) * u)
        return self.head(_rms_norm(self.norm, x))[:, -1]  # (N, V)
