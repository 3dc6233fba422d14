"""p3o.logprobs: chunked log-probs / entropies and their gradients equal the naive full log-softmax."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tiny_lm import make_tiny_lm

from p3o.logprobs import (
    cache_kwarg,
    chunked_head_logprobs,
    position_ids_from_mask,
    prompt_groups,
    token_logprobs,
)
from p3o.types import Rollouts, SamplingMask


def naive_token_logprobs(
    model, prompt_ids, prompt_mask, response_ids, response_mask, *, temperature=1.0, with_entropy=False
):
    """The obviously-correct oracle of `token_logprobs`: full model logits → float32 log_softmax → gather
    (materialises (N, T, V)); 0 at masked positions."""
    p, t = prompt_ids.shape[1], response_ids.shape[1]
    mask = response_mask.bool()
    attn = torch.cat([prompt_mask.bool(), mask], dim=1).long()
    out = model(
        input_ids=torch.cat([prompt_ids, response_ids], dim=1),
        attention_mask=attn,
        position_ids=position_ids_from_mask(attn),
        use_cache=False,
    )
    logq = F.log_softmax(out.logits[:, p - 1 : p - 1 + t].float() / temperature, dim=-1)  # (N, T, V)
    logp = logq.gather(-1, response_ids[..., None]).squeeze(-1).masked_fill(~mask, 0.0)
    entropy = -(logq.exp() * logq).sum(-1).masked_fill(~mask, 0.0) if with_entropy else None
    return logp, entropy


def _batch(seed: int = 0, vocab: int = 64):
    """Two left-padded prompts of lengths 5 and 3, right-padded responses of lengths 6 and 2."""
    g = torch.Generator().manual_seed(seed)
    prompt_ids = torch.randint(3, vocab, (2, 5), generator=g)
    prompt_mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]], dtype=torch.bool)
    prompt_ids = prompt_ids.masked_fill(~prompt_mask, 0)
    response_ids = torch.randint(3, vocab, (2, 6), generator=g)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0]], dtype=torch.bool)
    response_ids = response_ids.masked_fill(~mask, 0)
    return prompt_ids, prompt_mask, response_ids, mask


def test_position_ids_from_mask():
    m = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    assert position_ids_from_mask(m).tolist() == [[1, 1, 0, 1, 2], [0, 1, 2, 3, 4]]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_logprobs_match_naive_values_and_gradients(temperature):
    batch = _batch()
    model_a, model_b = make_tiny_lm(), make_tiny_lm()
    lp_a, ent_a = token_logprobs(model_a, *batch, temperature=temperature, chunk_size=3, with_entropy=True)
    lp_b, ent_b = naive_token_logprobs(model_b, *batch, temperature=temperature, with_entropy=True)
    mask = batch[3]
    assert lp_a.dtype == torch.float32 and lp_a.shape == mask.shape
    torch.testing.assert_close(lp_a, lp_b, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent_a, ent_b, atol=1e-5, rtol=1e-5)
    assert (lp_a[~mask] == 0).all() and (ent_a[~mask] == 0).all()
    assert (lp_a[mask] < 0).all() and (ent_a[mask] > 0).all()

    # A loss that uses both outputs with different per-token weights exercises both backward paths.
    w = torch.linspace(-1.0, 2.0, mask.numel()).view_as(mask)
    ((lp_a * w).sum() + (ent_a * w.flip(-1)).sum()).backward()
    ((lp_b * w).sum() + (ent_b * w.flip(-1)).sum()).backward()
    grads_b = dict(model_b.named_parameters())
    for name, p in model_a.named_parameters():
        assert p.grad is not None, name
        torch.testing.assert_close(p.grad, grads_b[name].grad, atol=1e-5, rtol=1e-4, msg=name)


def test_left_padding_does_not_change_logprobs():
    model = make_tiny_lm()
    prompt = torch.tensor([[1, 7, 9]])
    resp = torch.tensor([[4, 5, 6]])
    m = torch.ones(1, 3, dtype=torch.bool)
    lp, _ = token_logprobs(model, prompt, m, resp, m)
    padded = torch.tensor([[0, 0, 1, 7, 9]])
    pmask = torch.tensor([[0, 0, 1, 1, 1]], dtype=torch.bool)
    lp_pad, _ = token_logprobs(model, padded, pmask, resp, m)
    torch.testing.assert_close(lp, lp_pad, atol=1e-5, rtol=1e-5)


def test_chunked_head_matches_naive_with_bias_and_bf16_hidden():
    g = torch.Generator().manual_seed(3)
    h = torch.randn(37, 16, generator=g, requires_grad=True)
    w = torch.randn(50, 16, generator=g, requires_grad=True)
    b = torch.randn(50, generator=g, requires_grad=True)
    y = torch.randint(0, 50, (37,), generator=g)
    up_lp, up_ent = torch.randn(37, generator=g), torch.randn(37, generator=g)
    lp, ent = chunked_head_logprobs(h, w, y, bias=b, temperature=1.3, chunk_size=8, with_entropy=True)
    ((lp * up_lp).sum() + (ent * up_ent).sum()).backward()
    got = [t.grad.clone() for t in (h, w, b)]
    for t in (h, w, b):
        t.grad = None
    logq = F.log_softmax((h @ w.t() + b) / 1.3, -1)
    lp_ref = logq.gather(-1, y[:, None]).squeeze(-1)
    ent_ref = -(logq.exp() * logq).sum(-1)
    ((lp_ref * up_lp).sum() + (ent_ref * up_ent).sum()).backward()
    torch.testing.assert_close(lp, lp_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent, ent_ref, atol=1e-5, rtol=1e-5)
    for a, ref in zip(got, (h.grad, w.grad, b.grad)):
        torch.testing.assert_close(a, ref, atol=1e-4, rtol=1e-4)

    # bf16 hidden states: the head runs in float32, the gradient comes back in bf16.
    hb = h.detach().bfloat16().requires_grad_(True)
    lpb, _ = chunked_head_logprobs(hb, w.detach(), y, bias=b.detach(), temperature=1.3, chunk_size=8)
    lpb.sum().backward()
    assert lpb.dtype == torch.float32 and hb.grad.dtype == torch.bfloat16
    torch.testing.assert_close(lpb, lp_ref.detach(), atol=0.05, rtol=0.05)


def test_no_entropy_and_bad_arguments():
    model = make_tiny_lm()
    batch = _batch()
    lp, ent = token_logprobs(model, *batch)
    assert ent is None and lp.requires_grad
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(model, *batch, temperature=0.0)
    with pytest.raises(ValueError, match="chunk_size"):
        token_logprobs(model, *batch, chunk_size=0)


def test_token_logprobs_on_a_rollouts_batch():
    model = make_tiny_lm()
    p_ids, p_mask, r_ids, mask = _batch()
    n, t = r_ids.shape
    ro = Rollouts(
        prompt_ids=p_ids,
        prompt_mask=p_mask,
        response_ids=r_ids,
        mask=mask,
        rollout_logp=torch.zeros(n, t),
        policy_version=torch.zeros(n, t, dtype=torch.long),
        group_ids=torch.arange(n),
        rewards=torch.zeros(n),
        truncated=torch.zeros(n, dtype=torch.bool),
    )
    rows = (ro.prompt_ids, ro.prompt_mask, ro.response_ids, ro.mask)  # the Rollouts fields token_logprobs reads
    lp, ent = token_logprobs(model, *rows, temperature=0.9, chunk_size=4, with_entropy=True)
    ref, ref_ent = naive_token_logprobs(model, p_ids, p_mask, r_ids, mask, temperature=0.9, with_entropy=True)
    torch.testing.assert_close(lp, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent, ref_ent, atol=1e-5, rtol=1e-5)


def _grouped_batch(prompt_lens, group: int, t: int = 6, p: int = 6, seed: int = 1, vocab: int = 64):
    """`group` consecutive rows per prompt (left-padded to `p`, lengths `prompt_lens`); right-padded responses of
    random lengths 1..t (one row per prompt has the full length t)."""
    g = torch.Generator().manual_seed(seed)
    ids, masks = [], []
    for length in prompt_lens:
        m = torch.arange(p) >= p - length
        row = torch.randint(3, vocab, (p,), generator=g).masked_fill(~m, 0)
        ids += [row] * group
        masks += [m] * group
    prompt_ids, prompt_mask = torch.stack(ids), torch.stack(masks)
    n = prompt_ids.shape[0]
    lens = torch.randint(1, t + 1, (n,), generator=g)
    lens[::group] = t
    mask = torch.arange(t)[None] < lens[:, None]
    response_ids = torch.randint(3, vocab, (n, t), generator=g).masked_fill(~mask, 0)
    return prompt_ids, prompt_mask, response_ids, mask


class _TokenCounter:
    """Counts backbone calls and the tokens they process (forward pre-hook on the decoder)."""

    def __init__(self, model):
        self.calls, self.tokens = 0, 0
        self.handle = model.get_decoder().register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs):
        self.calls += 1
        self.tokens += kwargs["input_ids"].numel()


def _values_and_grads(model, batch, temperature, share):
    lp, ent = token_logprobs(
        model, *batch, temperature=temperature, chunk_size=5, with_entropy=True, share_prompts=share
    )
    w = torch.linspace(-1.0, 2.0, lp.numel()).view_as(lp)
    ((lp * w).sum() + (ent * w.flip(-1)).sum()).backward()
    return lp.detach(), ent.detach(), {k: v.grad.clone() for k, v in model.named_parameters()}


def test_prompt_groups():
    ids = torch.tensor([[0, 5], [0, 5], [6, 5], [0, 5], [0, 5]])
    m = ids != 0
    m2 = m.clone()
    m2[4] = True  # same ids as row 3 but a different mask: a new run
    first, inverse = prompt_groups(ids, m2)
    assert first.tolist() == [0, 2, 3, 4] and inverse.tolist() == [0, 0, 1, 2, 3]
    first, inverse = prompt_groups(ids[:1], m[:1])
    assert first.tolist() == [0] and inverse.tolist() == [0]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize(("prompt_lens", "group"), [((6, 3, 1), 4), ((4, 2, 5, 5), 1), ((2, 6, 6, 3), 2)])
def test_shared_prompts_match_unshared_values_and_gradients(temperature, prompt_lens, group):
    """Groups of 4 identical left-padded prompts of different lengths, no sharing at all, and mixed runs (pairs, one
    of which is split into two single rows) give the plain path's values and parameter gradients."""
    batch = _grouped_batch(prompt_lens, group)
    if group == 2:  # mixed: make rows 2..3 a run of 1 + 1 by changing one prompt token of row 3
        batch[0][3, -1] = (batch[0][3, -1] + 1) % 60 + 3
    model_a, model_b = make_tiny_lm(), make_tiny_lm()
    counter = _TokenCounter(model_a)
    lp_a, ent_a, g_a = _values_and_grads(model_a, batch, temperature, share=True)
    lp_b, ent_b, g_b = _values_and_grads(model_b, batch, temperature, share=False)
    torch.testing.assert_close(lp_a, lp_b, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent_a, ent_b, atol=1e-5, rtol=1e-5)
    for name, g in g_a.items():
        torch.testing.assert_close(g, g_b[name], atol=1e-5, rtol=1e-4, msg=name)
    ref, _ = naive_token_logprobs(model_b, *batch, temperature=temperature)
    torch.testing.assert_close(lp_a, ref, atol=1e-5, rtol=1e-5)

    n, p = batch[0].shape
    t = batch[2].shape[1]
    u = prompt_groups(batch[0], batch[1])[0].numel()
    if u < n:  # shared path: the unique prompts once, then the responses on the cache
        assert counter.calls == 2 and counter.tokens == u * p + n * (t - 1)
    else:
        assert counter.calls == 1 and counter.tokens == n * (p + t)


def test_shared_prompts_single_response_token_and_no_grad():
    batch = _grouped_batch((3, 5), 3, t=1)
    model = make_tiny_lm()
    counter = _TokenCounter(model)
    with torch.no_grad():
        lp, _ = token_logprobs(model, *batch)
    assert counter.calls == 1 and counter.tokens == 2 * 6  # only the two unique prompts
    ref, _ = token_logprobs(model, *batch, share_prompts=False)
    torch.testing.assert_close(lp, ref, atol=1e-5, rtol=1e-5)


def test_shared_prompts_fall_back_under_gradient_checkpointing():
    """Checkpointed layers drop the KV cache in transformers: the plain path must be taken (and give its values)."""
    batch = _grouped_batch((4, 2), 3)
    model = make_tiny_lm()
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    disable = getattr(model, "activation_checkpointing_disable", None) or model.gradient_checkpointing_disable
    enable()
    model.train()
    counter = _TokenCounter(model)
    lp, _ = token_logprobs(model, *batch)
    lp.sum().backward()
    assert counter.calls == 1
    disable()
    model.eval()
    with torch.no_grad():
        ref, _ = naive_token_logprobs(model, *batch)
    torch.testing.assert_close(lp.detach(), ref, atol=1e-5, rtol=1e-5)


def test_cache_kwarg_names_the_kv_cache_argument_of_either_transformers_generation():
    class New(torch.nn.Module):
        def forward(self, input_ids, cache=None): ...

    class Old(torch.nn.Module):
        def forward(self, input_ids, past_key_values=None): ...

    class NoCache(torch.nn.Module):
        def forward(self, input_ids): ...

    assert (cache_kwarg(New()), cache_kwarg(Old()), cache_kwarg(NoCache())) == ("cache", "past_key_values", None)


# -- the sampling mask replayed (issue 45) ---------------------------------------------------------------------------
def _kept_sets(vocab: int, mask, seed: int = 1):
    """(N, T, V) bool: a random kept set of every masked-in token, of random size."""
    g = torch.Generator().manual_seed(seed)
    n, t = mask.shape
    keep = torch.rand((n, t, vocab), generator=g) < torch.rand((n, t, 1), generator=g)
    return keep & mask[..., None]


def _replayed_reference(model, batch, keep, temperature):
    """The slow oracle: full logits / τ, −inf outside the kept set (tokens with a set), log_softmax, gather."""
    prompt_ids, prompt_mask, response_ids, mask = batch
    p, t = prompt_ids.shape[1], response_ids.shape[1]
    attn = torch.cat([prompt_mask, mask], dim=1).long()
    out = model(
        input_ids=torch.cat([prompt_ids, response_ids], 1),
        attention_mask=attn,
        position_ids=position_ids_from_mask(attn),
    )
    z = out.logits[:, p - 1 : p - 1 + t].float() / temperature  # (N, T, V)
    has = keep.any(-1, keepdim=True)
    zk = z.masked_fill(has & ~keep, float("-inf"))
    logp = F.log_softmax(zk, -1).gather(-1, response_ids[..., None]).squeeze(-1).masked_fill(~mask, 0.0)
    ent = -(F.log_softmax(z, -1).exp() * F.log_softmax(z, -1)).sum(-1).masked_fill(~mask, 0.0)
    mass = (F.softmax(z, -1) * keep).sum(-1).masked_fill(~has.squeeze(-1), 1.0).masked_fill(~mask, 0.0)
    return logp, ent, mass


@pytest.mark.parametrize("temperature,chunk", [(1.0, 3), (0.7, 256)])
def test_replayed_logprobs_match_the_masked_log_softmax_in_value_and_gradient(temperature, chunk):
    batch = _batch()
    response_ids, mask = batch[2], batch[3]
    keep = _kept_sets(64, mask)
    keep[(*mask.nonzero(as_tuple=True), response_ids[mask])] = True  # the sampled token is in its own set
    keep[0, 1] = False  # a model token without a recorded set: the whole vocabulary
    kept = SamplingMask.from_dense(keep)
    model_a, model_b = make_tiny_lm(), make_tiny_lm()
    lp_a, ent_a, mass_a = token_logprobs(
        model_a, *batch, temperature=temperature, chunk_size=chunk, with_entropy=True, kept=kept
    )
    lp_b, ent_b, mass_b = _replayed_reference(model_b, batch, keep, temperature)
    torch.testing.assert_close(lp_a, lp_b, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent_a, ent_b, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(mass_a, mass_b, atol=1e-5, rtol=1e-5)
    full, _ = naive_token_logprobs(model_b, *batch, temperature=temperature)
    assert (lp_a[mask] >= full[mask] - 1e-6).all()  # renormalised over a subset: never below the full log-prob

    w = torch.linspace(-1.0, 2.0, mask.numel()).view_as(mask)
    ((lp_a * w).sum() + (ent_a * w.flip(-1)).sum()).backward()
    ((lp_b * w).sum() + (ent_b * w.flip(-1)).sum()).backward()
    grads_b = dict(model_b.named_parameters())
    for name, p in model_a.named_parameters():
        torch.testing.assert_close(p.grad, grads_b[name].grad, atol=1e-5, rtol=1e-4, msg=name)


def test_replay_without_sets_is_the_default_path_bit_for_bit():
    batch = _batch()
    model = make_tiny_lm()
    lp, ent = token_logprobs(model, *batch, chunk_size=3, with_entropy=True)
    lp_k, ent_k, mass = token_logprobs(
        model, *batch, chunk_size=3, with_entropy=True, kept=SamplingMask.empty(*batch[3].shape)
    )
    assert torch.equal(lp, lp_k) and torch.equal(ent, ent_k)
    assert torch.equal(mass, batch[3].float())
