"""HFEngine: a transformers causal LM with its own KV-cached sampling loop that records what it sampled from.

The engine keeps its OWN deep copy of the model, converted to the rollout precision (see `p3o.rollout.quant`), so
rollout/trainer mismatch is real: a bf16 or fp8 engine samples from a slightly different distribution than the
float32 trainer, and `rollout_logp` records the engine's log-probs, not the trainer's.

    engine = HFEngine(model, tokenizer, precision="fp8", temperature=1.0, top_p=1.0, max_new_tokens=64)
    engine = HFEngine(model, tokenizer, settings)           # the same from one EngineSettings record
    rollouts = engine.generate(prompt_ids, n=8, seed=0)     # (N = len(prompt_ids) · 8) rows
    engine.load_weights(trainer.state_dict(), version=1)    # later tokens are stamped with version 1
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from p3o.dist import resolve_device
from p3o.errors import ConfigError, P3OError
from p3o.logprobs import cache_kwarg, position_ids_from_mask, truncate_logits
from p3o.rollout.base import LOGPROB_MODES, Draws, SamplingEngine, stop_and_pad_ids
from p3o.rollout.fast import FastDecoder
from p3o.rollout.quant import QuantLinear, quantize_model, requantize_
from p3o.rollout.settings import EngineSettings
from p3o.types import SamplingMask

__all__ = ["LOGPROB_MODES", "HFEngine", "process_logits"]


def process_logits(logits: Tensor, *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """The logits of the distribution actually sampled from: z/τ, then top-k, then top-p (−inf outside the support).

    top-k keeps the k largest (ties with the k-th value are kept, as in transformers' TopKLogitsWarper); top-p keeps
    the smallest prefix of tokens sorted by probability whose mass reaches `top_p` (the first token always stays).

    Args:
        logits: (N, V) float32 raw logits.
    Returns:
        (N, V) float32; log_softmax of it is the processed log-distribution.
    """
    z = logits / temperature if temperature != 1.0 else logits
    return truncate_logits(z, top_k=top_k, top_p=top_p)


def _sample_categorical(probs: Tensor, generator: torch.Generator) -> Tensor:
    """One draw per row by inverse CDF: the first v with cdf_v > u · cdf_V, u ~ U[0, 1) (zero-mass tokens never win).

    Same distribution as torch.multinomial(probs, 1) but one uniform per row instead of V exponentials.

    Args:
        probs: (N, V) float32, rows sum to ~1.
    Returns:
        (N, 1) long.
    """
    cdf = probs.cumsum(-1)  # (N, V)
    u = torch.rand((probs.shape[0], 1), generator=generator, device=probs.device, dtype=cdf.dtype) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).clamp_(max=probs.shape[-1] - 1)


class HFEngine(SamplingEngine):
    """Batched, seedable sampling from an HF causal LM with a KV cache; implements `RolloutEngine`.

    Args:
        model: an HF causal LM; the engine deep-copies it (the caller's model is never touched).
        tokenizer: optional; used to decode `texts` and to find EOS / pad ids.
        settings: precision ("fp32" | "bf16" | "fp16" | "int8" | "fp8": W8A8 fake-quantised, see
            `p3o.rollout.quant`), temperature, top_p, top_k, max_new_tokens, logprob_mode, seed and device of the
            engine copy (`p3o.rollout.settings.EngineSettings`, default: its defaults); `overrides` are fields of
            it given as keywords (``HFEngine(model, tok, precision="bf16")``). The vLLM-only KV-cache fields are
            ignored (an FP8 KV cache is refused by the record itself).
        stop_token_ids: extra stop ids, on top of the model's / tokenizer's EOS ids.
        pad_token_id: id written after a row stops (default: tokenizer / config pad id, else EOS, else 0).
        fast_decode: decode with `p3o.rollout.fast.FastDecoder` (static KV cache, fused q|k|v and gate|up);
            None = whenever the architecture supports it (Llama / Qwen2 / Qwen3), False = transformers' forward.
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer=None,
        settings: EngineSettings | None = None,
        *,
        stop_token_ids: Iterable[int] | None = None,
        pad_token_id: int | None = None,
        fast_decode: bool | None = None,
        **overrides: Any,
    ) -> None:
        self.settings = s = EngineSettings.for_engine("hf", settings, overrides)
        self.tokenizer = tokenizer
        self.device = resolve_device(s.device)
        self.version = 0
        self.on_decode_step: Callable[[int], None] | None = None
        """In-flight weight updates (`p3o.cluster`): called between decode steps t and t + 1 of a running batch, in
        the generating thread, which may `load_weights` there; later tokens carry the new version."""
        self._lock = threading.RLock()
        self._group_offset = 0
        self._generator = torch.Generator(device=self.device).manual_seed(s.seed)
        self._record_mask = s.records_sampling_mask

        engine_model = copy.deepcopy(model).to(self.device).eval()
        self.model = quantize_model(engine_model, s.precision)
        self.model.requires_grad_(False)
        self._cache_kw = cache_kwarg(self.model)
        supported = FastDecoder.supports(self.model)
        if fast_decode and not supported:
            raise ConfigError(f"fast_decode: not supported for {type(self.model).__name__}")
        self._fast = FastDecoder(self.model) if (fast_decode is not False and supported) else None

        sources = (tokenizer, getattr(self.model, "config", None), getattr(self.model, "generation_config", None))
        self.stop_token_ids, self.pad_token_id = stop_and_pad_ids(sources, stop_token_ids, pad_token_id)
        self._stop = torch.tensor(self.stop_token_ids or [-1], dtype=torch.long, device=self.device)

    # ------------------------------------------------------------------ weights
    def load_weights(self, state_dict: dict[str, Tensor], version: int) -> None:
        """Copy `state_dict` (full-precision trainer weights) into the engine copy and re-apply its precision.

        Thread-safe: waits for a running `generate` to finish, so every token of one `generate` call has the same
        version. The tensors are copied before returning, so the caller may keep updating its own weights.
        Keys the engine does not have raise `P3OError`; missing keys keep their old values. When the engine untied
        the embeddings (int8/fp8) and only the input embedding is given, the head copy follows it.
        """
        with self._lock, torch.no_grad():
            own = self.model.state_dict(keep_vars=True)
            unknown = [k for k in state_dict if k not in own]
            if unknown:
                raise P3OError(f"load_weights: {len(unknown)} unknown parameter name(s), e.g. {unknown[:3]}")
            for k, v in state_dict.items():
                own[k].data.copy_(v.detach().to(self.device))
            head = self.model.get_output_embeddings() if hasattr(self.model, "get_output_embeddings") else None
            emb = self.model.get_input_embeddings() if hasattr(self.model, "get_input_embeddings") else None
            head_key = next((k for k, p in own.items() if head is not None and p is head.weight), None)
            emb_key = next((k for k, p in own.items() if emb is not None and p is emb.weight), None)
            if (
                head is not None
                and emb is not None
                and head.weight is not emb.weight
                and head_key not in state_dict
                and emb_key in state_dict
                and isinstance(head, QuantLinear)
            ):
                head.weight.data.copy_(state_dict[emb_key].detach().to(self.device))
            requantize_(self.model)
            if self._fast is not None:
                self._fast.refresh()
            self.version = int(version)

    # ------------------------------------------------------------------ sampling
    def _sample(self, logits: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor, Tensor | None]:
        """Sample one token per row; returns (tokens (N,) long, recorded log-probs (N,) float32, the support sampled
        from (N, V) bool when the sampling mask is recorded, else None)."""
        raw, s = logits.float(), self.settings
        if s.temperature == 0.0:
            tok = raw.argmax(-1)
            if s.logprob_mode == "processed":
                return tok, torch.zeros(tok.shape, dtype=torch.float32, device=tok.device), None
            return tok, F.log_softmax(raw, -1).gather(-1, tok[:, None]).squeeze(-1), None
        z = process_logits(raw, temperature=s.temperature, top_k=s.top_k, top_p=s.top_p)
        logq = F.log_softmax(z, dim=-1)  # (N, V)
        tok = _sample_categorical(logq.exp(), generator)  # (N, 1)
        if s.logprob_mode == "processed":
            lp = logq.gather(-1, tok)
        else:
            lp = F.log_softmax(raw, -1).gather(-1, tok)
        keep = torch.isfinite(z) if self._record_mask else None
        return tok.squeeze(-1), lp.squeeze(-1), keep

    def _forward(self, **kw) -> tuple[Tensor, object]:
        cache = kw.pop("cache", None)
        if cache is not None:
            kw[self._cache_kw] = cache
        out = self.model(use_cache=True, logits_to_keep=1, **kw)
        new_cache = getattr(out, "cache", None)
        if new_cache is None:
            new_cache = out.past_key_values
        return out.logits[:, -1], new_cache

    @torch.no_grad()
    def _draw(
        self, prompt_ids: list[list[int]], ids: Tensor, pmask: Tensor, n: int, seed: int | None, t_max: int
    ) -> Draws:
        """The sampling loop (`SamplingEngine.generate` lays its draws out as `Rollouts`).

        The prompts are prefilled once (left-padded, positions from the mask) and the KV cache is repeated n times.
        Each step records log π_b(y_t) (per `logprob_mode`); rows stop at the first stop token (kept, mask True)
        and are padded afterwards. `seed` makes the call reproducible; without it the engine's own generator runs on.
        """
        gen = self._generator
        if seed is not None:
            gen = torch.Generator(device=self.device).manual_seed(int(seed))
        dev, b = self.device, len(prompt_ids)
        p_len = ids.shape[1]
        ids, pmask = ids.to(dev), pmask.to(dev)
        attn = torch.ones((b, p_len + t_max), dtype=torch.long, device=dev)
        attn[:, :p_len] = pmask.long()
        pos0 = position_ids_from_mask(pmask)
        logits, cache = self._forward(input_ids=ids, attention_mask=attn[:, :p_len], position_ids=pos0)
        if n > 1:
            cache.batch_repeat_interleave(n)
            logits = logits.repeat_interleave(n, dim=0)
            attn = attn.repeat_interleave(n, dim=0)
        if self._fast is not None:
            self._fast.start(cache, attn[:, :p_len].bool(), t_max)
        num = b * n
        next_pos = pmask.long().sum(-1).repeat_interleave(n)  # (N,) position of the first response token
        tokens = torch.full((num, t_max), self.pad_token_id, dtype=torch.long, device=dev)
        logps = torch.zeros((num, t_max), dtype=torch.float32, device=dev)
        valid = torch.zeros((num, t_max), dtype=torch.bool, device=dev)
        done = torch.zeros(num, dtype=torch.bool, device=dev)
        versions = torch.full((num, t_max), -1, dtype=torch.long, device=dev)  # per token: who sampled it
        kept: list[Tensor] = []  # per step: (row, id) of every kept id of a live row
        steps = 0
        for t in range(t_max):
            tok, lp, keep = self._sample(logits, gen)
            alive = ~done
            if keep is not None:
                kept.append((keep & alive[:, None]).nonzero())
            tok = torch.where(alive, tok, self.pad_token_id)
            tokens[:, t] = tok
            logps[:, t] = lp.masked_fill(done, 0.0)
            valid[:, t] = alive
            versions[:, t] = self.version
            done = done | torch.isin(tok, self._stop)
            steps = t + 1
            if t == t_max - 1 or bool(done.all()):
                break
            if self.on_decode_step is not None:
                self.on_decode_step(t)
            if self._fast is not None:
                logits = self._fast.step(tok, next_pos + t, t)
                continue
            logits, cache = self._forward(
                input_ids=tok[:, None],
                attention_mask=attn[:, : p_len + t + 1],
                position_ids=(next_pos + t)[:, None],
                cache=cache,
            )
        return Draws(
            response_ids=tokens[:, :steps],
            rollout_logp=logps[:, :steps],
            mask=valid[:, :steps],
            policy_version=versions[:, :steps],
            truncated=~done,
            sampling_mask=_sampling_mask(kept, num, steps) if self._record_mask else None,
        )


def _sampling_mask(kept: list[Tensor], num: int, steps: int) -> SamplingMask:
    """The `SamplingMask` (num, steps) of the per-step (row, id) pairs `kept` (each step's pairs sorted by row)."""
    if not kept:
        return SamplingMask.empty(num, steps)
    step = torch.cat([torch.full((k.shape[0],), t, dtype=torch.long, device=k.device) for t, k in enumerate(kept)])
    pairs = torch.cat(kept)  # (K, 2) step-major
    token = pairs[:, 0] * steps + step  # row-major (row, step) position of every kept id
    order = torch.sort(token, stable=True).indices  # stable: each set's ids stay together, in id order
    counts = torch.bincount(token, minlength=num * steps).view(num, steps).to(torch.int32)
    return SamplingMask(counts, pairs[order, 1].to(torch.int32))
