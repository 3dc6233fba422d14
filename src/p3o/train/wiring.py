"""Wiring: turn a TrainConfig into the objects the loop runs — model, task, verifier, engine factory, optimizer.

    comps = build_components(cfg)                          # model, tokenizer, prompts, reward_fn, make_engine, ...
    policy, tokenizer, ref = build_trainer_side(cfg)       # the trainer's half: the model it updates
    side = build_rollout_side(cfg)                         # the rollout half, from the config alone (Ray workers)
    side = harness_side(cfg, problems, eval_problems, tokenizer, pad, plain)    # agent.harness: the endpoint's side
    optimizer, scheduler = build_optimizer(comps.policy, cfg.optim, cfg.update, cfg.steps)
    check_run_dir(cfg.run_dir, resume=cfg.ckpt.resume, overwrite=cfg.overwrite)

Each component receives its own sub-config: the engine factory the rollout section, the optimizer the optim and
update sections; the task decides its default verifier (`p3o.tasks.default_verifier`).
"""

from __future__ import annotations

import copy
import difflib
import secrets
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn
from transformers import AutoModelForCausalLM

from p3o import dist, models  # models.load_policy looked up at call time: tests replace it
from p3o.config import from_dict
from p3o.dist import resolve_device
from p3o.envs import EnvLimits, EpisodeEngine, Renderer, default_mode, env_splits, make_env, stop_ids
from p3o.envs.harness import load_harness
from p3o.errors import ConfigError
from p3o.eval.harness import harness_prompts, serve_harness
from p3o.models.lora import is_lora, merged_copy, merged_weights
from p3o.rewards import make_reward_fn
from p3o.rollout.factory import make_engine as _make
from p3o.rollout.settings import EngineSettings
from p3o.serve.remote import RemoteEngine
from p3o.tasks import Mixture, format_prompt, load_eval_problems, load_mixture, load_train_problems, task_verifier
from p3o.train import checkpoint  # called through the module: tests patch its functions
from p3o.train.placement import FROM_RANK0
from p3o.train.run_dir import earlier_run, run_outputs
from p3o.train.step import make_optimizer, make_scheduler
from p3o.types import Rollouts

if TYPE_CHECKING:
    from p3o.config import OptimConfig, UpdateConfig


@dataclass
class RolloutSide:
    """What a rollout engine needs besides its weights: the task's prompts and answers, the verifier, the engine
    factory and the held-out prompts. Built from the config alone (`build_rollout_side`), so a rollout worker in
    another process (`p3o.cluster`) builds the same one the trainer would.

    Attributes:
        tokenizer: decodes completions for the verifier (None allowed).
        prompts: tokenized training prompts, one token-id list per problem.
        answers: the reference answer of each prompt (passed to the reward function).
        reward_fn: rewards of a batch: `reward_fn(rollouts) -> (N,) float32` (verifier scores in [0, 1]).
        make_engine: builds a RolloutEngine holding its OWN copy of a model: `make_engine(policy) -> engine`.
        pad_id: pad token id used when concatenating batches.
        eval_prompts, eval_answers: held-out prompts for `eval_accuracy` (empty: no evaluation).
        mixture: the tasks of a ``task.mixture`` run (`p3o.tasks.mixture.Mixture`: prompt i is its slot i, eval prompt
            j its task ``mixture.eval_task[j]``), else None.
        serve_through: a harness run's (`harness_side`): ``serve_through(source)`` makes the
            engines built from then on serve through `source`'s Ray rollout workers (``rollout.workers`` > 0: the
            episodes and endpoints stay in the trainer, every engine call goes to a worker); None elsewhere.
    """

    tokenizer: Any
    prompts: list[list[int]]
    answers: list[str]
    reward_fn: Callable[[Rollouts], Tensor]
    make_engine: Callable[[nn.Module], Any]
    pad_id: int = 0
    eval_prompts: list[list[int]] = field(default_factory=list)
    eval_answers: list[str] = field(default_factory=list)
    mixture: Mixture | None = None
    serve_through: Callable[[Any], None] | None = None


@dataclass
class Components:
    """Everything the loop needs that is not a config value: the trainer side (policy, reference) and the rollout
    side (`RolloutSide`'s fields). Built by `build_components`; tests inject fakes.

    Attributes:
        policy: the trainer's causal LM (updated in place).
        tokenizer: saved with checkpoints (None allowed).
        prompts, answers, reward_fn, make_engine, pad_id, eval_prompts, eval_answers, mixture, serve_through: see
            `RolloutSide`.
        ref_model: frozen reference policy (for ref_kl_coef), or None.
    """

    policy: nn.Module
    tokenizer: Any
    prompts: list[list[int]]
    answers: list[str]
    reward_fn: Callable[[Rollouts], Tensor]
    make_engine: Callable[[nn.Module], Any]
    ref_model: nn.Module | None = None
    pad_id: int = 0
    eval_prompts: list[list[int]] = field(default_factory=list)
    eval_answers: list[str] = field(default_factory=list)
    mixture: Mixture | None = None
    serve_through: Callable[[Any], None] | None = None

    def rollout_side(self) -> RolloutSide:
        """The rollout half of these components (shares their objects)."""
        return RolloutSide(
            self.tokenizer,
            self.prompts,
            self.answers,
            self.reward_fn,
            self.make_engine,
            self.pad_id,
            self.eval_prompts,
            self.eval_answers,
            self.mixture,
            self.serve_through,
        )


def build_trainer_side(cfg: Any) -> tuple[nn.Module, Any, nn.Module | None]:
    """(policy, tokenizer, frozen reference or None): the model named by `cfg.model`, on its device and dtype
    ("tiny": the warm-started base, built on first use by `load_policy`).

    Under `train.strategy fsdp` at world size > 1 only rank 0 reads the weights (`read_on_rank0`): the model stays
    on its CPU, the other ranks build its structure on the meta device, and `p3o.train.placement.Placement`
    broadcasts rank 0's tensors into every rank's shards once the model is sharded."""
    dtype = getattr(torch, cfg.model.dtype)
    if cfg.train.strategy == "fsdp" and dist.world_size() > 1:
        policy, tokenizer = read_on_rank0(cfg.model.name, cfg.model.cache_dir, dtype, resolve_device(cfg.model.device))
    else:
        policy, tokenizer = models.load_policy(cfg.model.name, cache_dir=cfg.model.cache_dir)
        policy = policy.to(device=resolve_device(cfg.model.device), dtype=dtype)
    if cfg.train.gradient_checkpointing and hasattr(policy, "gradient_checkpointing_enable"):
        # non-reentrant: the form DDP and FSDP2 support (hooks fire once per parameter)
        policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ref = None
    if cfg.train.ref_model and not cfg.model.lora.r:  # with LoRA, `run` uses the base with adapters disabled
        ref = copy.deepcopy(policy).eval().requires_grad_(False)
    return policy, tokenizer, ref


def read_on_rank0(name: str, cache_dir: str | None, dtype: torch.dtype, device: torch.device) -> tuple[nn.Module, Any]:
    """(model, tokenizer) of `name` where rank 0 alone reads the weights (to its CPU, in `dtype`) and every other
    rank gets the model's structure on the meta device (no memory) and rank 0's tokenizer; the model is marked with
    `device` (`p3o.train.placement.FROM_RANK0`) so that sharding fills every rank's shards there from rank 0's
    tensors. A load that fails on rank 0 fails on every rank with its message."""
    model, shared, failure = None, None, None
    if dist.is_main():
        try:
            model, tokenizer = models.load_policy(name, cache_dir=cache_dir)
            model = model.to(dtype=dtype)
            shared = (model.config, tokenizer, model.training)
        except Exception as err:  # every rank stops with rank 0's message (the others wait in the broadcast)
            failure = err
    message, shared = dist.broadcast_object((None if failure is None else str(failure), shared))
    if failure is not None:
        raise failure
    if message is not None:
        raise ConfigError(f"model.name {name!r}: rank 0 could not load it: {message}")
    config, tokenizer, training = shared
    if model is None:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, torch_dtype=dtype)
        model.train(training)  # rank 0's mode (a loaded model is in eval mode: no dropout, no checkpointing)
    setattr(model, FROM_RANK0, device)
    return model, tokenizer


def load_tokenizer(cfg: Any) -> Any:
    """The tokenizer of `cfg.model.name` alone, no weights read (a rollout worker loads its model through the
    engine factory)."""
    return models.load_policy(cfg.model.name, cache_dir=cfg.model.cache_dir, with_model=False)[1]


def build_rollout_side(cfg: Any, get_tokenizer: Callable[[], Any] | None = None) -> RolloutSide:
    """The task's prompts, the verifier and the rollout-engine factory named by `cfg` (a TrainConfig), from the config
    alone (`get_tokenizer`: called once the verifier is resolved; default `load_tokenizer(cfg)`).

    Problems come from `p3o.tasks.load_train_problems` / `load_eval_problems`: a single data file is split by a
    hash of the question (share `task.test_fraction`), `task.eval_name` names other evaluation data, and no
    evaluation problem is a training problem unless `task.allow_train_eval_overlap`. Every prompt is
    `format_prompt(problem, tokenizer, task.template, system=task.system_prompt)`. The task and the verifier are
    resolved before the model is loaded, so a wrong path or `module:function` fails at once.

    ``task.mixture`` (`p3o.tasks.mixture`): every task's problems and verifier; the prompts are the weighted pool's
    slots (task k fills a share w_k of them), each row scored by its own task's verifier.
    """
    task = cfg.task
    env = getattr(getattr(cfg, "agent", None), "env", None)
    mix = load_mixture(task, seed=cfg.seed, env=env) if getattr(task, "mixture", None) else None
    if mix is not None:
        problems = [p for ps in mix.problems for p in ps]
        eval_problems = [p for ps in mix.eval_problems for p in ps]
        reward_fn: Callable[[Rollouts], Tensor] = mix.reward_fn(timeout_s=task.reward_timeout_s)
    else:
        problems, eval_problems = _env_problems(cfg) or harness_problems(cfg) or _task_problems(cfg)
        # the task owns its default verifier; resolved before the model loads, so a bad module:function fails at once
        reward_fn = make_reward_fn(task_verifier(task, problems), timeout_s=task.reward_timeout_s)
    # the one engine record, built (and checked) before the model loads
    settings = EngineSettings.from_config(cfg.rollout, seed=cfg.seed, device=resolve_device(cfg.model.device))
    tokenizer = get_tokenizer() if get_tokenizer is not None else load_tokenizer(cfg)

    pad = tokenizer.pad_token_id if getattr(tokenizer, "pad_token_id", None) is not None else 0
    if getattr(cfg, "agent", None) is not None and cfg.agent.env:
        return _agent_rollout_side(cfg, problems, eval_problems, settings, tokenizer, int(pad))

    def make_engine(model: nn.Module) -> Any:
        return _make(settings, model, tokenizer)

    if getattr(cfg, "agent", None) is not None and getattr(cfg.agent, "harness", None):
        return harness_side(cfg, problems, eval_problems, tokenizer, int(pad), make_engine)

    def encode(probs: list[Any]) -> list[list[int]]:
        texts = [format_prompt(p, tokenizer, task.template, system=task.system_prompt) for p in probs]
        return [list(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]

    prompts, answers = encode(problems), [p.answer for p in problems]
    if mix is not None:  # prompt i = pool slot i: (task k, its problem j), each task's problems encoded once
        first = [sum(len(ps) for ps in mix.problems[:k]) for k in range(len(mix.problems))]
        prompts = [prompts[first[k] + j] for k, j in mix.pool]
        answers = [answers[first[k] + j] for k, j in mix.pool]
    return RolloutSide(
        tokenizer,
        prompts,
        answers,
        reward_fn,
        make_engine,
        int(pad),
        eval_prompts=encode(eval_problems) if eval_problems else [],
        eval_answers=[p.answer for p in eval_problems],
        mixture=mix,
    )


def _task_problems(cfg: Any) -> tuple[list[Any], list[Any]]:
    """(training, held-out) problems of ``task.name`` (`p3o.tasks.load_train_problems` / `load_eval_problems`)."""
    task = cfg.task
    problems = load_train_problems(task, seed=cfg.seed, n=task.n_train)
    eval_problems = []
    if task.n_eval > 0:
        eval_problems = load_eval_problems(task, seed=cfg.seed, n=task.n_eval, train=problems)
    return problems, eval_problems


def _env_problems(cfg: Any) -> tuple[list[Any], list[Any]] | None:
    """A built-in environment's own problems when ``task.name`` names one (``task.name calc-small``:
    `p3o.envs.env_problems`, disjoint train / test splits), whichever environment ``agent.env`` runs on them (a
    built-in or your own ``package.module:Name``), else None (the task's problems)."""
    env = getattr(getattr(cfg, "agent", None), "env", None)
    if not env:
        return None
    make_env(env, **dict(cfg.agent.env_kwargs or {})).close()  # an unknown name or option: one line, before the task
    return env_splits(cfg.task.name, seed=cfg.seed, n_train=cfg.task.n_train, n_eval=cfg.task.n_eval)


def _agent_rollout_side(
    cfg: Any, problems: list[Any], eval_problems: list[Any], settings: EngineSettings, tokenizer: Any, pad: int
) -> RolloutSide:
    """The rollout side of an agent run (``agent.env`` set): every prompt is the rendered first messages of an
    episode's environment, every engine an `EpisodeEngine` (episodes in, one row each), every reward the environment's.

    The environment name, its stop strings (one token each) and the renderer are checked here, before any model
    weights load; a prompt's token ids name its problem for the engine.
    """
    a = cfg.agent
    limits = EnvLimits.from_config(a)

    options = dict(getattr(a, "env_kwargs", None) or {})

    def new_env() -> Any:
        return make_env(a.env, limits=limits, **options)

    probe = new_env()
    stops = stop_ids(tokenizer, tuple(getattr(probe, "stop_strings", ())), a.env)
    renderer = Renderer(
        tokenizer,
        mode=default_mode(tokenizer, probe),
        max_obs_tokens=limits.max_obs_tokens,
        tools=getattr(probe, "tools", None),
    )
    by_prompt: dict[Any, Any] = {}

    def encode(probs: list[Any]) -> list[list[int]]:
        out = []
        for p in probs:
            env = new_env()
            try:
                ids = list(renderer.prompt_ids(env.reset(p, seed=0)))
            finally:
                env.close()
            by_prompt.setdefault(tuple(ids), p)
            by_prompt[(tuple(ids), p.answer)] = p  # a prompt shared by several problems: its answer tells them apart
            out.append(ids)
        return out

    prompts, eval_prompts = encode(problems), encode(eval_problems)
    probe.close()
    eos = [int(tokenizer.eos_token_id)] if getattr(tokenizer, "eos_token_id", None) is not None else []

    def make_engine(model: nn.Module) -> Any:
        inner = _make(settings, model, tokenizer, stop_token_ids=stops)
        return EpisodeEngine(
            inner, new_env, by_prompt, renderer=renderer, limits=limits, eos_ids=eos, stop_ids=stops, overlap=a.overlap
        )

    return _episode_side(tokenizer, problems, prompts, eval_problems, eval_prompts, make_engine, pad)


def _episode_side(
    tokenizer: Any,
    problems: list[Any],
    prompts: list[list[int]],
    eval_problems: list[Any],
    eval_prompts: list[list[int]],
    make_engine: Callable[[nn.Module], Any],
    pad: int,
    serve_through: Callable[[Any], None] | None = None,
) -> RolloutSide:
    """The `RolloutSide` of a run whose rewards the episodes bring (an environment's returns, a harness's): the
    reward function reads them off the rows (0 for a failed episode); answers are the problems'."""
    return RolloutSide(
        tokenizer,
        prompts,
        [p.answer for p in problems],
        episode_rewards,
        make_engine,
        pad,
        eval_prompts,
        [p.answer for p in eval_problems],
        serve_through=serve_through,
    )


def episode_rewards(rollouts: Rollouts) -> Tensor:
    """(N,) the rewards the episodes filled in (an environment's returns, a harness's; 0 for a failed episode)."""
    return rollouts.rewards.clone()


# -- a harness run's rollout side (``agent.harness``) ---------------------------------------------------------------
# p3o's endpoint inside ``p3o train``, the harness's episodes through it, the training rows from the endpoint's
# records (never from the harness's text). Every engine the run builds (the rollout engine, the held-out
# evaluator's) is an `p3o.serve.EndpointServer` on ``agent.serve_host`` (localhost by default) with the run's one key
# (``agent.serve_api_key``, else generated per run): the first binds ``agent.serve_port`` and writes its URL, model
# and key to ``<run_dir>/endpoint.json`` (readable by its owner only; the key is never logged in full), later ones a
# free port. A prompt's ids (the problem's text, tokenized) name its problem for the engine, as for
# `p3o.envs.EpisodeEngine`; the rows the engine returns are what the endpoint rendered and sampled. Sync, stale and
# async sources take these rows as they take tick-loop episodes: each sampled token keeps its own recorded version,
# admission is by the oldest one.

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
    cfg: Any,
    problems: list[Any],
    eval_problems: list[Any],
    tokenizer: Any,
    pad: int,
    plain_engine: Callable[[nn.Module], Any],
) -> RolloutSide:
    """The `RolloutSide` of a harness run: prompts that name the problems, the episodes' rewards as the reward
    function, and an engine factory that starts an endpoint per engine, on the engine
    ``plain_engine(model)`` builds (the run's rollout engine, as a run without a harness samples with) or on a Ray
    worker's. The harness is imported here, before any model loads, so a wrong ``agent.harness`` fails in one line
    at once."""
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
        if workers:
            inner = RemoteEngine.from_source(workers[0], worker=len(started) % len(workers[0].actors))
        else:
            inner = plain_engine(model)
        engine = serve_harness(
            inner, tokenizer, a, by_prompt, model_name=cfg.model.name, pad_id=pad, host=a.serve_host,
            port=a.serve_port if first else 0, api_key=key, log=_say, harness=harness,
        )  # fmt: skip
        started.append(engine.server)
        if first:
            engine.server.write_info(Path(cfg.run_dir) / ENDPOINT_FILE)
        return engine

    def serve_through(source: Any) -> None:
        """rollout.workers > 0: the engines built from now on serve through `source`'s Ray workers (a
        `p3o.cluster.RaySource` over `worker_config(cfg)`, which the loop builds and closes)."""
        workers[:] = [source]

    return _episode_side(tokenizer, problems, prompts, eval_problems, eval_prompts, make_engine, pad, serve_through)


def worker_config(cfg: Any) -> Any:
    """The config of a harness run's Ray rollout workers: the run's, without the harness (a worker hosts a bare
    engine; the episodes and the endpoint stay in the trainer's process) and with a task of 8 arithmetic problems
    (the worker's own batch producer is never asked for a batch here)."""
    task = {"name": "arithmetic", "n_train": 8, "n_eval": 0, "eval_name": None, "mixture": None, "verifier": None}
    return from_dict({"agent": {"harness": None}, "task": task}, base=cfg)


def _say(line: str) -> None:
    print(f"p3o train: {line}", file=sys.stderr)


def build_components(cfg: Any) -> Components:
    """Both halves for an in-process run: `build_rollout_side` (task and verifier first, so a bad one fails before
    the model loads), whose tokenizer is `build_trainer_side`'s."""
    trainer: list[Any] = []

    def trainer_tokenizer() -> Any:
        trainer.extend(build_trainer_side(cfg))
        return trainer[1]

    ro = build_rollout_side(cfg, trainer_tokenizer)
    policy, tokenizer, ref = trainer
    return Components(
        policy,
        tokenizer,
        ro.prompts,
        ro.answers,
        ro.reward_fn,
        ro.make_engine,
        ref,
        ro.pad_id,
        eval_prompts=ro.eval_prompts,
        eval_answers=ro.eval_answers,
        mixture=ro.mixture,
        serve_through=ro.serve_through,
    )


def engine_model(policy: nn.Module) -> nn.Module:
    """What a rollout engine copies: the policy, or with LoRA a plain HF model with the adapters merged."""
    return merged_copy(policy) if is_lora(policy) else policy


def sync_weights(policy: nn.Module) -> dict[str, Tensor]:
    """The tensors an engine sync sends: the full state dict, or with LoRA only the merged adapted layers."""
    return merged_weights(policy) if is_lora(policy) else policy.state_dict()


def build_optimizer(
    policy: nn.Module, optim: OptimConfig, update: UpdateConfig, steps: int
) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over the trainable parameters and its schedule over the run's optimizer steps.

    total optimizer steps = steps × update.num_mini_batches × update.epochs (the schedule's horizon).
    """
    optimizer = make_optimizer(
        policy, optim.lr, weight_decay=optim.weight_decay, betas=tuple(optim.betas), eps=optim.eps
    )
    scheduler = make_scheduler(
        optimizer,
        warmup_steps=optim.warmup_steps,
        total_steps=steps * update.num_mini_batches * update.epochs,
        schedule=optim.schedule,
        min_factor=optim.min_lr_ratio,
    )
    return optimizer, scheduler


def check_run_dir(run_dir: Path, *, resume: bool, overwrite: bool) -> None:
    """Refuse (ConfigError, on every rank together) a run_dir this run must not write into. It does not create it:
    the run does, once everything it can refuse (data, verifier, model, base building) has been built.

    A fresh run (no `resume`) never silently replaces another: a run_dir holding an earlier run that completed a
    step (`p3o.train.run_dir.earlier_run`) is refused unless `overwrite`. `resume` needs something to resume
    (`resume_problem`): a missing or empty run_dir, a run with no checkpoint and one whose checkpoints are all damaged
    are refused with one line.
    """
    problem = None
    if dist.is_main():
        outputs = earlier_run(run_dir)
        if outputs and not resume and not overwrite:
            problem = (
                f"run_dir {run_dir} holds an earlier run ({', '.join(outputs)}); pass --resume to continue it or "
                f"--overwrite to replace it (or choose another --run_dir)"
            )
        elif resume:
            problem = resume_problem(run_dir)
    problem = dist.broadcast_object(problem)  # every rank stops together (identity at world size 1)
    if problem:
        raise ConfigError(problem)


def resume_problem(run_dir: str | Path) -> str | None:
    """Why `--resume` has nothing to continue in `run_dir` (one line), or None when it holds an intact checkpoint.

    Missing directory (with the nearest sibling's name when one is close), an empty one, a run without a checkpoint
    (finished with ckpt.every 0, or stopped before its first), every checkpoint damaged (each named with why).
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        parent = run_dir.parent if str(run_dir.parent) else Path(".")
        siblings = [p.name for p in parent.iterdir() if p.is_dir()] if parent.is_dir() else []
        near = difflib.get_close_matches(run_dir.name, siblings, n=1, cutoff=0.6)
        hint = f" (did you mean {parent / near[0]}?)" if near else ""
        return f"run_dir {run_dir} does not exist: nothing to resume{hint}"
    outputs = run_outputs(run_dir)
    if not checkpoint.list_checkpoints(run_dir):
        if not outputs:
            return f"run_dir {run_dir} holds no run: nothing to resume (drop --resume to start a run there)"
        if "final" in outputs:
            return (
                f"run_dir {run_dir} holds a finished run with no checkpoint to resume from; pass --overwrite "
                f"(without --resume) to replace it, or choose another --run_dir"
            )
        return (
            f"run_dir {run_dir} holds no checkpoint to resume from (the run stopped before its first one); start it "
            f"again with --overwrite (without --resume)"
        )
    intact, damaged = checkpoint.intact_checkpoint(run_dir)
    if intact is None:
        listed = "; ".join(f"{p.name}: {why}" for p, why in damaged)
        return f"run_dir {run_dir}: no intact checkpoint to resume from ({listed})"
    return None


__all__ = [
    "Components",
    "ENDPOINT_FILE",
    "RolloutSide",
    "build_components",
    "build_optimizer",
    "build_rollout_side",
    "build_trainer_side",
    "check_run_dir",
    "engine_model",
    "harness_problems",
    "harness_side",
    "load_tokenizer",
    "read_on_rank0",
    "resolve_device",
    "resume_problem",
    "sync_weights",
    "worker_config",
]
