"""The rollout side of a harness run (``agent.harness``): p3o's endpoint inside ``p3o train``, the harness's episodes
through it, the training rows from the endpoint's records (never from the harness's text).

    side = harness_side(cfg, problems, eval_problems, settings, tokenizer, pad)   # RolloutSide's fields
    engine = side["make_engine"](model)          # an EndpointServer started on the engine, wrapped in a HarnessEngine
    rollouts = engine.generate(prompt_ids, n=4)  # n harness episodes per problem, the endpoint's rows

Every engine the run builds (the rollout engine, the held-out evaluator's) is an `p3o.serve.EndpointServer` on
``agent.serve_host`` (localhost by default) with the run's one key (``agent.serve_api_key``, else generated per
run): the first binds ``agent.serve_port`` and writes its URL, model and key to ``<run_dir>/endpoint.json``
(readable by its owner only; the key is never logged in full), later ones a free port. A prompt's ids (the
problem's text, tokenized) name its problem for the engine, as for `p3o.envs.EpisodeEngine`; the rows the engine
returns are what the endpoint rendered and sampled. Sync, stale and async sources take these rows as they take
tick-loop episodes: each sampled token keeps its own recorded version, admission is by the oldest one.
"""

from __future__ import annotations

import secrets
import sys
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from p3o.envs import env_splits
from p3o.envs.harness import HarnessEngine, load_harness
from p3o.rollout.factory import make_engine as _make
from p3o.rollout.settings import EngineSettings
from p3o.types import Rollouts

__all__ = ["ENDPOINT_FILE", "harness_problems", "harness_side"]

ENDPOINT_FILE = "endpoint.json"
"""In the run directory: {url, base_url, api_key, model, max_model_len} of the run's endpoint (mode 0600)."""


def harness_problems(cfg: Any) -> tuple[list[Any], list[Any]] | None:
    """The problems of a harness run: a `verifiers` environment's own rows (``agent.harness: verifiers:<module>``:
    `p3o.envs.verifiers_harness.VerifiersHarness.problems`, the last ``task.n_eval`` held out), else a built-in
    environment's own problems when ``task.name`` names one (``calc-small``: disjoint train / test splits,
    `p3o.envs.env_problems`), else None (the task's problems); None outside a harness run."""
    spec = getattr(cfg.agent, "harness", None)
    if not spec:
        return None
    if isinstance(spec, str) and spec.startswith("verifiers:"):
        return load_harness(spec).problems(cfg.task.n_train, cfg.task.n_eval)
    return env_splits(cfg.task.name, seed=cfg.seed, n_train=cfg.task.n_train, n_eval=cfg.task.n_eval)


def harness_side(
    cfg: Any, problems: list[Any], eval_problems: list[Any], settings: EngineSettings, tokenizer: Any, pad: int
) -> dict[str, Any]:
    """`p3o.train.wiring.RolloutSide`'s fields for a harness run: prompts that name the problems, the episodes'
    rewards as the reward function, and an engine factory that starts an endpoint per engine. The harness is
    imported here, before any model loads, so a wrong ``agent.harness`` fails in one line at once."""
    a = cfg.agent
    harness = load_harness(a.harness)
    key = a.serve_api_key or f"p3o-{secrets.token_urlsafe(24)}"
    by_prompt: dict[Any, Any] = {}

    def encode(probs: list[Any]) -> list[list[int]]:
        out = []
        for p in probs:
            ids = [int(t) for t in tokenizer(p.prompt, add_special_tokens=False)["input_ids"]] or [pad]
            by_prompt.setdefault(tuple(ids), p)
            by_prompt[(tuple(ids), p.answer)] = p  # two problems with one text: the answer tells them apart
            out.append(ids)
        return out

    prompts, eval_prompts = encode(problems), encode(eval_problems)
    started: list[Any] = []

    def make_engine(model: nn.Module) -> Any:
        from p3o.serve import EndpointServer  # optional: FastAPI and uvicorn (extra serve)

        first = not started
        server = EndpointServer(
            _make(settings, model, tokenizer),
            tokenizer,
            model_name=cfg.model.name,
            api_key=key,
            host=a.serve_host,
            port=a.serve_port if first else 0,
            tool_format=a.tool_format,
            log=_stderr,
        )
        engine = HarnessEngine(
            server, harness, by_prompt, timeout_s=a.episode_timeout_s, concurrency=a.harness_concurrency, pad_id=pad
        )
        server.batcher.gather(expect=lambda: engine.active, max_wait_s=a.serve_gather_s)  # episodes share calls
        server.start()
        started.append(server)
        if first:
            server.write_info(Path(cfg.run_dir) / ENDPOINT_FILE)
        return engine

    def episode_rewards(rollouts: Rollouts) -> Tensor:
        return rollouts.rewards.clone()  # the harness's rewards, filled in per episode (0 for a failed one)

    return {
        "tokenizer": tokenizer,
        "prompts": prompts,
        "answers": [p.answer for p in problems],
        "reward_fn": episode_rewards,
        "make_engine": make_engine,
        "pad_id": pad,
        "eval_prompts": eval_prompts,
        "eval_answers": [p.answer for p in eval_problems],
    }


def _stderr(line: str) -> None:
    print(f"p3o train: {line}", file=sys.stderr)
