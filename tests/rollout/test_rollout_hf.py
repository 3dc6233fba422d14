"""p3o.rollout.HFEngine: recorded log-probs, sampling distribution, stops, masks, versions, determinism."""

from __future__ import annotations

import math
import threading

import pytest
import torch
import torch.nn.functional as F
from tiny_lm import make_tiny_lm

from p3o.errors import ConfigError, P3OError
from p3o.logprobs import token_logprobs
from p3o.rollout import HFEngine, RolloutEngine
from p3o.rollout.hf import process_logits

PROMPTS = [[1, 5, 7, 9], [1, 3], [1, 11, 12]]


class _ByteTok:
    """Minimal tokenizer stand-in: decodes ids as space-separated numbers, drops special ids 0-2."""

    eos_token_id = 2
    pad_token_id = 0

    def batch_decode(self, rows, skip_special_tokens=True):
        return [" ".join(str(i) for i in r if not (skip_special_tokens and i <= 2)) for r in rows]


def _next_token_logits(model, prompt: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([prompt])).logits[0, -1].float()  # (V,)


def _chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    keep = expected > 0
    return float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())


def test_is_a_rollout_engine_and_validates_options(tiny_lm):
    assert isinstance(HFEngine(tiny_lm), RolloutEngine)
    for kw, field in [
        ({"precision": "fp4"}, "rollout.precision"),
        ({"logprob_mode": "x"}, "rollout.logprob_mode"),
        ({"top_p": 0.0}, "rollout.top_p"),
        ({"top_k": -1}, "rollout.top_k"),
        ({"temperature": -1.0}, "rollout.temperature"),
        ({"max_new_tokens": 0}, "rollout.max_new_tokens"),
    ]:
        with pytest.raises(ConfigError, match=field):
            HFEngine(tiny_lm, **kw)
    eng = HFEngine(tiny_lm)
    with pytest.raises(P3OError, match="prompt_ids"):
        eng.generate([[]], n=1)
    with pytest.raises(P3OError, match="answers"):
        eng.generate(PROMPTS, n=1, answers=["1"])


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_fp32_processed_logp_equals_trainer_logp(tiny_lm, temperature):
    eng = HFEngine(tiny_lm, temperature=temperature, max_new_tokens=10, stop_token_ids=[2, 3, 4, 5])
    ro = eng.generate(PROMPTS, n=3, seed=1)
    lp, _ = token_logprobs(tiny_lm, ro.prompt_ids, ro.prompt_mask, ro.response_ids, ro.mask, temperature=temperature)
    assert ro.num_tokens > 10
    torch.testing.assert_close(ro.rollout_logp, lp.detach(), atol=1e-5, rtol=0)


def test_raw_mode_records_unscaled_logsoftmax(tiny_lm):
    eng = HFEngine(tiny_lm, temperature=0.5, max_new_tokens=6, logprob_mode="raw")
    ro = eng.generate(PROMPTS, n=2, seed=0)
    lp, _ = token_logprobs(tiny_lm, ro.prompt_ids, ro.prompt_mask, ro.response_ids, ro.mask, temperature=1.0)
    torch.testing.assert_close(ro.rollout_logp, lp.detach(), atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"), [(1.0, 0, 1.0), (1.5, 0, 1.0), (1.0, 5, 1.0), (1.0, 0, 0.6), (0.8, 6, 0.7)]
)
def test_sampling_frequencies_match_processed_distribution(temperature, top_k, top_p):
    vocab, samples = 16, 12000
    model = make_tiny_lm(vocab_size=vocab, seed=4)
    prompt = [1, 7, 9, 4]
    eng = HFEngine(model, temperature=temperature, top_k=top_k, top_p=top_p, max_new_tokens=1)
    ro = eng.generate([prompt], n=samples, seed=123)
    z = process_logits(_next_token_logits(model, prompt)[None], temperature=temperature, top_k=top_k, top_p=top_p)
    probs = F.softmax(z, -1)[0]  # (V,)
    support = probs > 0
    if top_k:
        assert int(support.sum()) == top_k if top_p == 1 else int(support.sum()) <= top_k
    if top_p < 1:
        assert int(support.sum()) < vocab
    tokens = ro.response_ids[:, 0]
    assert support[tokens].all(), "sampled a token outside the top-k / top-p support"
    counts = torch.bincount(tokens, minlength=vocab).double()
    df = int(support.sum()) - 1
    # Wilson–Hilferty approximation of the 0.999 chi-square quantile: df·(1 − 2/(9df) + 3.09·sqrt(2/(9df)))³.
    crit = df * (1 - 2 / (9 * df) + 3.09 * math.sqrt(2 / (9 * df))) ** 3
    assert _chi_square(counts, probs.double()) < crit
    # The recorded log-probs are those of the processed distribution.
    torch.testing.assert_close(ro.rollout_logp[:, 0], probs.log()[tokens], atol=1e-5, rtol=0)


def test_chi_square_detects_a_wrong_distribution():
    # Guard that the test above can fail: the τ=1 samples do not fit the τ=1.5 distribution.
    model = make_tiny_lm(vocab_size=16, seed=4)
    prompt = [1, 7, 9, 4]
    ro = HFEngine(model, temperature=1.0, max_new_tokens=1).generate([prompt], n=12000, seed=123)
    wrong = F.softmax(_next_token_logits(model, prompt) / 1.5, -1)
    counts = torch.bincount(ro.response_ids[:, 0], minlength=16).double()
    assert _chi_square(counts, wrong.double()) > 37.7  # the 0.999 quantile at df = 15


def test_stops_masks_truncation_and_layout():
    model = make_tiny_lm(vocab_size=32, seed=2)
    stops = list(range(2, 8))  # EOS (2) plus five more stop ids: most rows stop within a few tokens
    eng = HFEngine(model, _ByteTok(), temperature=1.0, max_new_tokens=12, stop_token_ids=stops[1:])
    assert eng.stop_token_ids == stops and eng.pad_token_id == 0
    ro = eng.generate(PROMPTS, n=8, seed=0, answers=["a", "b", "c"])
    n = len(PROMPTS) * 8
    assert ro.response_ids.shape[0] == n and ro.response_ids.shape[1] <= 12
    assert ro.group_ids.tolist() == [i for i in range(3) for _ in range(8)]
    assert ro.answers == [a for a in "abc" for _ in range(8)]
    assert (ro.prompt_ids[:8] == torch.tensor([1, 5, 7, 9])).all()
    assert ro.prompt_mask[8:16].tolist() == [[False, False, True, True]] * 8
    assert ro.truncated.any() or ro.response_ids.shape[1] < 12
    assert (~ro.truncated).any()
    for i in range(n):
        ids, m = ro.response_ids[i], ro.mask[i]
        length = int(m.sum())
        assert m[:length].all() and not m[length:].any(), "mask must be a prefix"
        is_stop = torch.isin(ids[:length], torch.tensor(stops))
        if ro.truncated[i]:
            assert length == 12 and not is_stop.any()
        else:
            assert is_stop[-1] and not is_stop[:-1].any(), "valid up to and including the first stop token"
        assert (ids[length:] == 0).all()
        assert (ro.rollout_logp[i, length:] == 0).all() and (ro.rollout_logp[i, :length] < 0).all()
        assert (ro.policy_version[i, length:] == -1).all() and (ro.policy_version[i, :length] == 0).all()
        assert ro.texts[i] == " ".join(str(t) for t in ids[:length].tolist() if t > 2)
    # Group ids keep counting across calls.
    assert eng.generate([[1, 4]], n=2, seed=0).group_ids.tolist() == [3, 3]


def test_max_new_tokens_truncates_everything_without_stops(tiny_lm):
    eng = HFEngine(tiny_lm, max_new_tokens=5, stop_token_ids=[], pad_token_id=0)
    eng._stop = torch.tensor([-1])  # no stop id at all (not even EOS)
    ro = eng.generate(PROMPTS, n=2, seed=0)
    assert ro.response_ids.shape == (6, 5) and ro.mask.all() and ro.truncated.all()


def test_determinism_under_seed(tiny_lm):
    eng = HFEngine(tiny_lm, max_new_tokens=8, seed=7)
    a = eng.generate(PROMPTS, n=4, seed=11)
    b = eng.generate(PROMPTS, n=4, seed=11)
    c = eng.generate(PROMPTS, n=4, seed=12)
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.rollout_logp, b.rollout_logp)
    assert not torch.equal(a.response_ids, c.response_ids)
    # Without a seed the engine's own generator (seeded at construction) runs on: reproducible per engine.
    e1, e2 = HFEngine(tiny_lm, max_new_tokens=8, seed=7), HFEngine(tiny_lm, max_new_tokens=8, seed=7)
    x1, y1 = e1.generate(PROMPTS, n=2), e1.generate(PROMPTS, n=2)
    x2 = e2.generate(PROMPTS, n=2)
    assert torch.equal(x1.response_ids, x2.response_ids) and not torch.equal(x1.response_ids, y1.response_ids)


def test_greedy_is_argmax(tiny_lm):
    eng = HFEngine(tiny_lm, temperature=0.0, max_new_tokens=1)
    ro = eng.generate(PROMPTS, n=2, seed=0)
    for i, p in enumerate(PROMPTS):
        assert (ro.response_ids[2 * i : 2 * i + 2, 0] == _next_token_logits(tiny_lm, p).argmax()).all()
    assert (ro.rollout_logp == 0).all()  # processed greedy: a point mass


def test_engine_owns_its_copy_and_load_weights_stamps_versions(tiny_lm):
    eng = HFEngine(tiny_lm, max_new_tokens=6)
    assert eng.model is not tiny_lm
    with torch.no_grad():
        tiny_lm.model.embed_tokens.weight.mul_(3.0)  # changing the trainer's model does not touch the engine
    ro0 = eng.generate(PROMPTS, n=2, seed=0)
    assert (ro0.policy_version[ro0.mask] == 0).all()
    lp_old, _ = token_logprobs(tiny_lm, ro0.prompt_ids, ro0.prompt_mask, ro0.response_ids, ro0.mask)
    assert (lp_old.detach() - ro0.rollout_logp).abs().max() > 1e-3

    eng.load_weights(tiny_lm.state_dict(), version=5)
    ro = eng.generate(PROMPTS, n=2, seed=0)
    assert eng.version == 5 and (ro.policy_version[ro.mask] == 5).all() and (ro.policy_version[~ro.mask] == -1).all()
    lp, _ = token_logprobs(tiny_lm, ro.prompt_ids, ro.prompt_mask, ro.response_ids, ro.mask)
    torch.testing.assert_close(ro.rollout_logp, lp.detach(), atol=1e-5, rtol=0)
    with pytest.raises(P3OError, match="unknown parameter"):
        eng.load_weights({"nope.weight": torch.zeros(1)}, version=6)


def test_load_weights_from_another_thread_between_generates(tiny_lm):
    eng = HFEngine(tiny_lm, max_new_tokens=4)
    sd = {k: v.clone() for k, v in tiny_lm.state_dict().items()}
    results, errors = [], []

    def loop():
        try:
            for s in range(6):
                results.append(eng.generate(PROMPTS, n=2, seed=s))
        except Exception as exc:  # pragma: no cover - surfaced by the assert below
            errors.append(exc)

    th = threading.Thread(target=loop)
    th.start()
    for v in range(1, 4):
        eng.load_weights(sd, version=v)
    th.join()
    assert not errors
    for ro in results:
        versions = ro.policy_version[ro.mask].unique()
        assert versions.numel() == 1, "one generate call must see one weight version"
    assert eng.version == 3


def test_process_logits_by_hand():
    # Shuffled probabilities [0.05, 0.5, 0.15, 0.3]; sorted: 0.5, 0.3, 0.15, 0.05 with mass before = 0, .5, .8, .95.
    logits = torch.tensor([[0.05, 0.5, 0.15, 0.3]]).log()
    keep = lambda z: torch.isfinite(z)[0].tolist()  # noqa: E731
    assert keep(process_logits(logits, top_p=0.7)) == [False, True, False, True]  # .5 + .3 reaches .7
    assert keep(process_logits(logits, top_p=0.8)) == [False, True, False, True]  # mass before 0.15 is .8 >= .8
    assert keep(process_logits(logits, top_p=0.81)) == [False, True, True, True]
    assert keep(process_logits(logits, top_p=0.1)) == [False, True, False, False]  # the top token always stays
    assert keep(process_logits(logits, top_k=3)) == [False, True, True, True]
    assert keep(process_logits(logits, top_k=2, top_p=0.9)) == [False, True, False, True]
    torch.testing.assert_close(process_logits(logits, temperature=2.0), logits / 2)


@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8"])
def test_fast_decode_matches_transformers_forward(tiny_lm, precision):
    kw = dict(precision=precision, max_new_tokens=10, temperature=0.9)
    fast, slow = HFEngine(tiny_lm, fast_decode=True, **kw), HFEngine(tiny_lm, fast_decode=False, **kw)
    assert fast._fast is not None and slow._fast is None
    a, b = fast.generate(PROMPTS, n=3, seed=5), slow.generate(PROMPTS, n=3, seed=5)
    agree = (a.response_ids == b.response_ids).float().mean()
    assert agree >= (1.0 if precision != "bf16" else 0.9), agree
    same = (a.response_ids == b.response_ids).all(-1)
    tol = 1e-5 if precision != "bf16" else 2e-2
    torch.testing.assert_close(a.rollout_logp[same], b.rollout_logp[same], atol=tol, rtol=0)
    # After new weights, the fused copies follow.
    new = make_tiny_lm(seed=3).state_dict()
    fast.load_weights(new, 1)
    slow.load_weights(new, 1)
    a, b = fast.generate(PROMPTS, n=2, seed=6), slow.generate(PROMPTS, n=2, seed=6)
    same = (a.response_ids == b.response_ids).all(-1)
    assert same.float().mean() >= (1.0 if precision != "bf16" else 0.5)
    torch.testing.assert_close(a.rollout_logp[same], b.rollout_logp[same], atol=tol, rtol=0)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_fast_decode_other_architectures(arch):
    import transformers

    kw = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=(arch == "llama"),
              bos_token_id=1, eos_token_id=2, pad_token_id=0)  # fmt: skip
    torch.manual_seed(0)
    if arch == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**kw)).eval()
    else:  # Qwen2 has biases on q/k/v: the fused matmul must carry them
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**kw)).eval()
    fast, slow = HFEngine(model, max_new_tokens=8), HFEngine(model, max_new_tokens=8, fast_decode=False)
    assert fast._fast is not None
    a, b = fast.generate(PROMPTS, n=2, seed=1), slow.generate(PROMPTS, n=2, seed=1)
    assert torch.equal(a.response_ids, b.response_ids)
    torch.testing.assert_close(a.rollout_logp, b.rollout_logp, atol=1e-5, rtol=0)
    lp, _ = token_logprobs(model, a.prompt_ids, a.prompt_mask, a.response_ids, a.mask)
    torch.testing.assert_close(a.rollout_logp, lp.detach(), atol=1e-5, rtol=0)


@pytest.mark.parametrize(("kw", "setting"), [({"top_p": 0.9}, "rollout.top_p 0.9"), ({"top_k": 5}, "rollout.top_k 5")])
def test_sampling_contract_refuses_raw_logprobs_under_truncation(tiny_lm, kw, setting):
    """Raw log-probs under top-p / top-k are not the sampling distribution's: refused with one line naming the
    setting and both fixes; processed log-probs under the same truncation, and raw ones at another temperature
    (the deliberate temperature-mismatch regime), are fine."""
    with pytest.raises(ConfigError, match=r"rollout\.logprob_mode: raw") as err:
        HFEngine(tiny_lm, logprob_mode="raw", **kw)
    msg = str(err.value)
    assert "\n" not in msg and setting in msg and "logprob_mode processed" in msg
    HFEngine(tiny_lm, logprob_mode="processed", **kw)
    HFEngine(tiny_lm, logprob_mode="raw", temperature=1.2)
