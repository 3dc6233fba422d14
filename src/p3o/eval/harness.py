"""`p3o eval` on a harness run (``agent.harness``): full harness episodes through p3o's endpoint on the held-out
problems, with the run's own limits, drawn as the in-loop evaluation draws them.

    result = evaluate_harness(model, tokenizer, problems, sampling, agent=run_cfg.agent, model_name="tiny-chat")
    result.pass_at_k[1], result.extra["in_loop"]["eval_accuracy"], result.extra["faults"]

The engine is built as the training run builds its held-out evaluation's (`p3o.train.wiring.harness_side`, a floor
above this one, which can call `serve_harness` and `harness_prompts`): an `p3o.serve.EndpointServer` on the loaded
policy — bound here to localhost on a free port, with a key generated for this evaluation and written nowhere —
wrapped in a `p3o.envs.harness.HarnessEngine` that runs the run's harness under its limits
(``agent.episode_timeout_s``, ``harness_concurrency``, ``tool_format``, ``serve_gather_s``). The episodes are drawn
by `p3o.eval.runner.heldout_metrics`, the in-loop evaluation's sampler, in its batches of 64 problems; its
``eval_accuracy`` / ``eval_score`` (per recorded row, as metrics.jsonl logs them) are kept in ``extra["in_loop"]``
beside pass@k (per episode: its reward ≥ the threshold is a solve). The harness engine ignores batch seeds (each
request carries its own sampling); the endpoint's engine samples from its generator, seeded by the engine settings'
seed (the run's ``seed``, as in training).

Same numbers as the in-loop evaluation of the same checkpoint: with ``agent.harness_concurrency 1`` the episodes
run one by one and every engine call is one request, so the draws are a function of the weights and the
generator's state. The in-loop evaluator keeps one engine for the run, so only its first evaluation
(``log.eval_every 0``: the last) starts from the seed as this one does. With several episodes at once the endpoint
batches the calls that arrive together, and which calls share an engine call depends on timing: the in-loop number
itself then varies from one evaluation to the next.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch

from p3o import serve
from p3o.envs.harness import FAULTS, HarnessEngine, load_harness
from p3o.errors import ConfigError
from p3o.eval.runner import EVAL_ENGINE, Counting, EvalResult, Tally, heldout_metrics
from p3o.rollout.factory import make_engine
from p3o.rollout.settings import EngineSettings
from p3o.tasks.base import Problem
from p3o.types import Rollouts

__all__ = ["IN_LOOP", "evaluate_harness", "harness_prompts", "serve_harness"]

IN_LOOP = Counting(n_samples=1, ks=(1,), batch_prompts=64)
"""How the in-loop evaluation counts (`p3o.train.evaluation.Evaluator`): one episode per problem, pass@1, batches of
64 problems."""


def harness_prompts(problems: Sequence[Problem], tokenizer: Any, pad_id: int, by_prompt: dict[Any, Problem]) -> Any:
    """The prompt ids that name `problems` for a `HarnessEngine` (each problem's text, tokenized; [pad_id] for an
    empty one), one list per problem; `by_prompt` gains each one's entry (ids, and (ids, answer) for two problems of
    one text)."""
    out = []
    for p in problems:
        ids = [int(t) for t in tokenizer(p.prompt, add_special_tokens=False)["input_ids"]] or [pad_id]
        by_prompt.setdefault(tuple(ids), p)
        by_prompt[(tuple(ids), p.answer)] = p  # two problems with one text: the answer tells them apart
        out.append(ids)
    return out


def serve_harness(
    engine: Any,
    tokenizer: Any,
    agent: Any,
    by_prompt: dict[Any, Problem],
    *,
    model_name: str,
    pad_id: int,
    host: str = "127.0.0.1",
    port: int = 0,
    api_key: str | None = None,
    log: Callable[[str], None] | None = None,
    harness: Callable[..., Any] | None = None,
) -> HarnessEngine:
    """A started `p3o.serve.EndpointServer` on the rollout engine `engine` (an HF or vLLM engine of the policy, or a
    `p3o.serve.remote.RemoteEngine` on a Ray worker), wrapped in a `HarnessEngine` running ``agent.harness`` over the
    problems `by_prompt` names, under the run's limits (``agent``: a run's `AgentConfig`; `harness`: the loaded
    harness, default ``load_harness(agent.harness)``); its batcher gathers the running episodes' next calls.
    `api_key` None: one generated. The returned engine's ``close()`` stops the endpoint."""
    harness = harness if harness is not None else load_harness(agent.harness)
    try:
        endpoint = serve.EndpointServer  # imported on first use: FastAPI and uvicorn (extra serve)
    except ImportError as err:
        raise ConfigError(
            f"agent.harness: the endpoint needs the serve extra (pip install 'p3o[serve]'): {err}"
        ) from None
    server = endpoint(
        engine,
        tokenizer,
        model_name=model_name,
        api_key=api_key,
        host=host,
        port=port,
        tool_format=agent.tool_format,
        log=log,
    )
    spec = agent.harness if isinstance(agent.harness, str) and not agent.harness.startswith("verifiers:") else None
    try:
        engine = HarnessEngine(
            server,
            harness,
            by_prompt,
            timeout_s=agent.episode_timeout_s,
            concurrency=agent.harness_concurrency,
            pad_id=pad_id,
            processes=min(agent.harness_processes, agent.harness_concurrency) if spec is not None else 0,
            spec=spec,
        )
    except BaseException:
        server.stop()
        raise
    server.batcher.gather(expect=lambda: engine.active, max_wait_s=agent.serve_gather_s)  # episodes share calls
    server.start()
    return engine


def evaluate_harness(
    model: Any,
    tokenizer: Any,
    problems: Sequence[Problem],
    sampling: EngineSettings = EVAL_ENGINE,
    *,
    agent: Any,
    model_name: str,
    counting: Counting = IN_LOOP,
) -> EvalResult:
    """pass@k of ``counting.n_samples`` full harness episodes per problem through p3o's endpoint (see the module
    docstring).

    Args:
        agent: the run's ``agent`` section (its harness and limits); model_name: the served name (``model.name``).
        sampling: the endpoint engine's settings (the run's ``rollout.*`` and seed); the harness's requests set their
            own temperature, top-p and token budget.
        counting: episodes per problem, the k of pass@k, problems per batch … (`p3o.eval.runner.Counting`; default
            `IN_LOOP`, the in-loop evaluation's: one episode per problem, 64 problems per batch).

    Returns `evaluate`'s result, and in ``extra``: ``in_loop``, the in-loop evaluation's numbers (``eval_accuracy``,
    ``eval_score``: over the recorded rows, as metrics.jsonl logs them); ``faults``, failed episodes per `FAULTS`
    reason; ``episode``, the rows' statistics (means of turns, tool calls, version span, ``stop_<how>`` shares, the
    harness's own metrics); ``endpoint``, the episodes run, rows split off rewritten histories (``split_rows``), rows
    abandoned episodes sent late (``late_rows``, dropped) and the endpoint's counters (requests, tool calls, 4xx).
    """
    tally = Tally(problems, counting)
    n_samples = counting.n_samples
    pad = int(tokenizer.pad_token_id) if getattr(tokenizer, "pad_token_id", None) is not None else 0
    by_prompt: dict[Any, Problem] = {}
    prompts = harness_prompts(problems, tokenizer, pad, by_prompt)
    engine = serve_harness(
        make_engine(sampling, model, tokenizer), tokenizer, agent, by_prompt, model_name=model_name, pad_id=pad,
        log=_stderr,
    )  # fmt: skip
    split_rows = 0

    def on_batch(lo: int, rows: Rollouts, scores: torch.Tensor) -> None:
        """Per episode (its first row: rows of one episode follow each other), its reward, tokens and truncation."""
        nonlocal split_rows
        first = rows.extras["split"] == 0
        episode = torch.cumsum(first.long(), 0) - 1  # each row's episode in the batch
        n_ep = int(first.sum())
        lengths = torch.zeros(n_ep).index_add_(0, episode, rows.mask.sum(-1).float())
        cut = torch.zeros(n_ep).index_add_(0, episode, rows.truncated.float()) > 0
        split_rows += len(rows) - n_ep
        tally.add(lo, scores[first].view(-1, n_samples), lengths, cut, rows.extras)

    try:
        in_loop = heldout_metrics(
            None,  # unused: the engine already holds the policy
            tokenizer,
            prompts,
            [p.answer for p in problems],
            lambda rows: rows.rewards.clone(),  # the harness's rewards, filled in per episode (0 for a failed one)
            n_samples=n_samples,
            engine=lambda _policy: engine,
            batch_size=counting.batch_prompts,
            on_batch=on_batch,
        )
    finally:
        engine.close()
    result = tally.result(model, sampling.temperature, sampling.max_new_tokens)
    result.extra["in_loop"] = in_loop
    result.extra["faults"] = {f: engine.faults[f] for f in FAULTS}
    counters = {k: float(v) for k, v in engine.server.counters().items()}
    result.extra["endpoint"] = {
        "episodes": engine.episodes_run,
        "split_rows": split_rows,
        "late_rows": engine.late_rows,
        **counters,
    }
    return result


def _stderr(line: str) -> None:
    print(f"p3o eval: {line}", file=sys.stderr)
