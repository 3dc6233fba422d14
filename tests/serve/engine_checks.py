"""What the endpoint must do on any engine behind it, as plain functions (no pytest): used by test_serve_remote.py
(an HF engine in a Ray rollout worker) and by vllm_serve_checks.py (vLLM in process and in a worker, in .venv-vllm).

    drawn = concurrent_chats(server, model_name, k=4)     # k episodes' first turns at once; their rows
    check_logprobs(model, rows)                           # every sampled token's recorded log-prob is the trainer's
    row = two_versions(server, model_name, shifted)       # a weight load between two calls of one episode
"""

from __future__ import annotations

import concurrent.futures as cf
from typing import Any

import openai
import torch

from p3o.logprobs import token_logprobs

TOL = 1e-4  # fp32 engines against the fp32 trainer (tests/rollout/vllm_checks.py, tests/serve/test_endpoint.py)


def client(server: Any, episode: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.episode_url(episode), api_key=server.api_key, max_retries=0, timeout=300)


def ask(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"What is {i + 3} + {2 * i + 1}?"}]


def concurrent_chats(server: Any, model_name: str, k: int, tag: str, **sampling: Any) -> list[Any]:
    """`k` chat completions sent at once (the batcher told to expect `k` jobs, so they share one engine call, which
    the caller checks in the counters); returns each episode's one row (`p3o.serve.episodes.Row`) and response."""
    server.batcher.gather(expect=lambda: k, max_wait_s=30.0)
    try:

        def one(i: int) -> Any:
            return client(server, f"{tag}-{i}").chat.completions.create(
                model=model_name, messages=ask(i), max_tokens=12, **sampling
            )

        with cf.ThreadPoolExecutor(k) as pool:
            responses = list(pool.map(one, range(k)))
    finally:
        server.batcher.gather(expect=lambda: 1, max_wait_s=0.0)  # back to plain batching (nothing to wait for)
    rows = []
    for i, r in enumerate(responses):
        (row,) = server.store.pop(f"{tag}-{i}")
        assert row.ids[: len(r.choices[0].model_extra["token_ids"])] == r.choices[0].model_extra["token_ids"]
        rows.append(row)
    return list(zip(rows, responses))


def trainer_logprobs(model: torch.nn.Module, row: Any, temperature: float = 1.0) -> torch.Tensor:
    """The fp32 trainer's log π(y_t) of the row's response ids at `temperature` (logits / τ), (T,)."""
    p, r = torch.tensor([row.prompt_ids]), torch.tensor([row.ids])
    every = torch.ones_like
    with torch.no_grad():
        logp, _ = token_logprobs(
            model,
            p,
            every(p, dtype=torch.bool),
            r,
            every(r, dtype=torch.bool),
            loss_mask=torch.tensor([row.mask]),
            temperature=temperature,
        )
    return logp[0]


def check_logprobs(
    model: torch.nn.Module, rows: list[Any], versions: set[int] | None = None, temperature: float = 1.0
) -> float:
    """Every sampled token's recorded log-prob equals the trainer's at `temperature` within `TOL` (and its version
    is in `versions` when given); returns the largest gap."""
    gap = 0.0
    for row in rows:
        mask = torch.tensor(row.mask)
        assert bool(mask.any()), "a row without a sampled token"
        recorded, trainer = torch.tensor(row.logprobs)[mask], trainer_logprobs(model, row, temperature)[mask]
        gap = max(gap, float((recorded - trainer).abs().max()))
        if versions is not None:
            got = {v for v, m in zip(row.versions, row.mask) if m}
            assert got <= versions, f"versions {got}, expected within {versions}"
    assert gap <= TOL, f"recorded vs trainer log-prob: max gap {gap:.2e} > {TOL}"
    return gap


def shifted(model: torch.nn.Module, delta: float = 0.02, seed: int = 1) -> dict[str, torch.Tensor]:
    """`model`'s weights, each floating tensor moved by delta · N(0, 1) noise (a new policy version)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for k, v in model.state_dict().items():
        noise = torch.randn(v.shape, generator=g, dtype=torch.float32).to(v.dtype)
        out[k] = v + delta * noise if v.is_floating_point() else v
    return out


def two_versions(server: Any, model_name: str, new_weights: dict[str, torch.Tensor], tag: str) -> Any:
    """Two calls of one episode with a weight load between them (version + 1); the episode's one row, whose
    sampled tokens hold both versions (the first turn's then the second's)."""
    c = client(server, tag)
    v0 = server.version
    first = c.chat.completions.create(model=model_name, messages=ask(0), max_tokens=8)
    server.load_weights(new_weights, v0 + 1)
    history = [*ask(0), first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "and?"}]
    second = c.chat.completions.create(model=model_name, messages=history, max_tokens=8)
    assert set(second.choices[0].model_extra["p3o"]["versions"]) == {v0 + 1}
    (row,) = server.store.pop(tag)
    sampled = [v for v, m in zip(row.versions, row.mask) if m]
    assert set(sampled) == {v0, v0 + 1} and row.calls == 2, (sampled, row.calls)
    n1 = len(first.choices[0].model_extra["token_ids"])
    assert sampled[:n1] == [v0] * n1 and set(sampled[n1:]) == {v0 + 1}
    return row


def split_by_version(row: Any, version: int) -> Any:
    """A copy of `row` whose mask keeps only the sampled tokens of `version` (to score each against its weights)."""
    import copy

    out = copy.copy(row)
    out.mask = [bool(m) and v == version for m, v in zip(row.mask, row.versions)]
    return out
