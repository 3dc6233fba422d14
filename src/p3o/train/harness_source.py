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

from p3o.config import from_dict
from p3o.envs import env_splits
from p3o.envs.harness import load_harness
from p3o.eval.harness import harness_prompts, serve_harness
from p3o.rollout.settings import EngineSettings
from p3o.serve.remote import RemoteEngine
from p3o.types import Rollouts

__all__ = ["ENDPOINT_FILE", "harness_problems", "harness_side", "worker_config"]

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
    prompts = harness_prompts(problems, tokenizer, pad, by_prompt)
    eval_prompts = harness_prompts(eval_problems, tokenizer, pad, by_prompt)
    started: list[Any] = []
    workers: list[Any] = []  # rollout.workers > 0: the Ray workers' source (`serve_through`), handed by the loop

    def make_engine(model: nn.Module) -> Any:
        first = not started
        # engine k serves through worker k mod N: the episodes stay here, each engine call is a worker's
        inner = RemoteEngine.from_source(workers[0], worker=len(started) % len(workers[0].actors)) if workers else None
        engine = serve_harness(
            model, tokenizer, settings, a, by_prompt, model_name=cfg.model.name, pad_id=pad, host=a.serve_host,
            port=a.serve_port if first else 0, api_key=key, log=_stderr, harness=harness, engine=inner,
        )  # fmt: skip
        started.append(engine.server)
        if first:
            engine.server.write_info(Path(cfg.run_dir) / ENDPOINT_FILE)
        return engine

    def episode_rewards(rollouts: Rollouts) -> Tensor:
        return rollouts.rewards.clone()  # the harness's rewards, filled in per episode (0 for a failed one)

    def serve_through(source: Any) -> None:
        """rollout.workers > 0: the engines built from now on serve through `source`'s Ray workers (a
        `p3o.cluster.RaySource` over `worker_config(cfg)`, which the loop builds and closes)."""
        workers[:] = [source]

    return {
        "tokenizer": tokenizer,
        "prompts": prompts,
        "answers": [p.answer for p in problems],
        "reward_fn": episode_rewards,
        "make_engine": make_engine,
        "pad_id": pad,
        "eval_prompts": eval_prompts,
        "eval_answers": [p.answer for p in eval_problems],
        "serve_through": serve_through,
    }


def worker_config(cfg: Any) -> Any:
    """The config of a harness run's Ray rollout workers: the run's, without the harness (a worker hosts a bare
    engine; the episodes and the endpoint stay in the trainer's process) and with a task of 8 arithmetic problems
    (the worker's own batch producer is never asked for a batch here)."""
    task = {"name": "arithmetic", "n_train": 8, "n_eval": 0, "eval_name": None, "mixture": None, "verifier": None}
    return from_dict({"agent": {"harness": None}, "task": task}, base=cfg)


def _stderr(line: str) -> None:
    print(f"p3o train: {line}", file=sys.stderr)
