"""The training loop: sync, stale, async and reuse pipelines around the ONE update step.

    run_dir = run(load_config(["--loop.mode", "async", "--loop.max_lag", "2"]))

One loop serves every regime; only the batch source differs (see `p3o.train.buffer`):

    for step s in [start, steps):
        batch  = source.get(s)            # sync: produce(s) now · stale: FIFO, produced at s − n ·
                                          # async: from the generator thread, ≤ max_lag versions old · reuse
        stats  = update(policy, ..., batch)           # p3o.train.step: mini-/micro-batches, one objective
        source.push_weights(policy, version = s + 1)  # the engine samples with the new weights
        log one JSONL line; checkpoint every ckpt.every steps

`produce(b, engine)` makes the b-th batch of the data stream: its prompts, the sampling seed and the data order are
functions of (seed, b, rank) only, so a resumed run sees exactly the batches an uninterrupted run would have seen
(bit-identical parameters on CPU in the sync, stale and reuse modes; async is timing-dependent by design).
It generates G completions per prompt, scores them with the verifier, adds DAPO's soft overlong penalty
(optional), drops groups whose rewards are all equal and refills (DAPO dynamic sampling, optional) and
computes group-relative advantages.

The policy version is the number of completed update calls: the engine starts at version 0, the batch trained at
step s is compared against trainer version s, and `lag = s − policy_version` of every valid token is logged.

Data parallel (torchrun, gloo/nccl): every rank generates prompts_per_step / world_size prompts with its own seed,
the update all-reduces the token count, ESS sums and gradients, rank 0 writes metrics and checkpoints.
"""

from __future__ import annotations

import contextlib
import copy
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from p3o import dist
from p3o.errors import ConfigError
from p3o.train.buffer import Batch, BatchSource, make_source, token_lag
from p3o.train.step import make_optimizer, make_scheduler, objective_needs, update
from p3o.types import Rollouts

_SEED_MOD = 2**62


def stream_seed(*parts: int) -> int:
    """A deterministic 62-bit seed from integers (seed, index, round, rank, ...) — a simple polynomial hash."""
    h = 1469598103934665603
    for p in parts:
        h = (h * 1099511628211 + int(p) + 0x9E3779B97F4A7C15) % _SEED_MOD
    return h


@dataclass
class Components:
    """Everything the loop needs that is not a config value (built by `build_components`; tests inject fakes).

    Attributes:
        policy: the trainer's causal LM (updated in place).
        tokenizer: saved with checkpoints (None allowed).
        prompts: tokenized training prompts, one token-id list per problem.
        answers: the reference answer of each prompt (passed to the reward function).
        reward_fn: rewards of a batch: `reward_fn(rollouts) -> (N,) float32` (verifier scores in [0, 1]).
        make_engine: builds a RolloutEngine holding its OWN copy of a model: `make_engine(policy) -> engine`.
        ref_model: frozen reference policy (for ref_kl_coef), or None.
        pad_id: pad token id used when concatenating batches.
        eval_prompts, eval_answers: held-out prompts for `eval_accuracy` (empty: no evaluation).
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


def _device(cfg_device: str) -> torch.device:
    if cfg_device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(cfg_device)


def build_components(cfg: Any) -> Components:
    """Load the model, tokenizer, task, verifier and rollout-engine factory named by `cfg` (a TrainConfig).

    Problems come from `p3o.tasks.load_train_problems` / `load_eval_problems`: a single data file is split by a
    hash of the question (share `task.test_fraction`), `task.eval_name` names other evaluation data, and no
    evaluation problem is a training problem unless `task.allow_train_eval_overlap`. Every prompt is
    `format_prompt(problem, tokenizer, task.template, system=task.system_prompt)`. The task and the verifier are
    resolved before the model is loaded, so a wrong path or `module:function` fails at once.
    """
    from p3o.models import load_policy
    from p3o.rewards import get_verifier, score
    from p3o.rollout.factory import make_engine as _make
    from p3o.tasks import format_prompt, load_eval_problems, load_train_problems

    task = cfg.task
    problems = load_train_problems(task, seed=cfg.seed, n=task.n_train)
    eval_problems = []
    if task.n_eval > 0:
        eval_problems = load_eval_problems(task, seed=cfg.seed, n=task.n_eval, train=problems)
    verifier_name = task.verifier or _default_verifier(task.name, problems)
    try:
        verifier = get_verifier(verifier_name)
    except ConfigError as err:
        raise ConfigError(f"task.verifier: {err}") from None
    timeout = task.reward_timeout_s

    device = _device(cfg.model.device)
    policy, tokenizer = load_policy(cfg.model.name, cache_dir=cfg.model.cache_dir)
    policy = policy.to(device=device, dtype=getattr(torch, cfg.model.dtype))
    if cfg.train.gradient_checkpointing and hasattr(policy, "gradient_checkpointing_enable"):
        policy.gradient_checkpointing_enable()

    def encode(probs: list[Any]) -> list[list[int]]:
        texts = [format_prompt(p, tokenizer, task.template, system=task.system_prompt) for p in probs]
        return [list(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]

    prompts, answers = encode(problems), [p.answer for p in problems]

    def reward_fn(r: Rollouts) -> Tensor:
        return torch.tensor(score(r.texts, r.answers, verifier, timeout_s=timeout), dtype=torch.float32)

    ro = cfg.rollout

    def make_engine(model: nn.Module) -> Any:
        return _make(
            ro.engine,
            model,
            tokenizer,
            precision=ro.precision,
            temperature=ro.temperature,
            top_p=ro.top_p,
            top_k=ro.top_k,
            max_new_tokens=ro.max_new_tokens,
            logprob_mode=ro.logprob_mode,
            seed=cfg.seed,
            device=device,
        )

    ref = None
    if cfg.train.ref_model and not cfg.model.lora.r:  # with LoRA, `run` uses the base with adapters disabled
        ref = copy.deepcopy(policy).eval().requires_grad_(False)
    pad = tokenizer.pad_token_id if getattr(tokenizer, "pad_token_id", None) is not None else 0
    return Components(
        policy,
        tokenizer,
        prompts,
        answers,
        reward_fn,
        make_engine,
        ref,
        int(pad),
        eval_prompts=encode(eval_problems) if eval_problems else [],
        eval_answers=[p.answer for p in eval_problems],
    )


def _default_verifier(task: str, problems: list[Any]) -> str:
    """The task's own verifier: Problem.meta["verifier"] when set, else by task name (a file: "math").

    A file's rows get "gsm8k" when their answers carry `#### n`, else "math" (numbers exactly, LaTeX by
    math-verify); `task.verifier` overrides it, e.g. with your own `package.module:function`.
    """
    meta = getattr(problems[0], "meta", None) or {}
    if isinstance(meta, dict) and meta.get("verifier"):
        return str(meta["verifier"])
    return {"arithmetic": "exact-int", "gsm8k": "gsm8k"}.get(task, "math")


# ------------------------------------------------------------------------------------------------ data stream


class PromptStream:
    """The prompts of batch b: a pure function of (seed, b, round, rank) — no cursor to save.

    Round 0 walks the data in epochs, each epoch a fresh permutation seeded by (seed, epoch): global positions
    b·P .. b·P + P − 1. Refill rounds of dynamic sampling (round ≥ 1) draw P prompts from a permutation seeded by
    (seed, b, round). Rank r takes the r-th contiguous slice of the P global prompts.
    """

    def __init__(self, num_prompts: int, per_step: int, seed: int, rank: int = 0, world_size: int = 1) -> None:
        if per_step % world_size:
            raise ConfigError(f"rollout.prompts_per_step: {per_step} is not divisible by the world size {world_size}")
        self.d, self.p, self.seed, self.rank, self.world = num_prompts, per_step, seed, rank, world_size
        self._perms: dict[int, Tensor] = {}

    def _perm(self, key: int) -> Tensor:
        if key not in self._perms:
            g = torch.Generator().manual_seed(key)
            self._perms = {key: torch.randperm(self.d, generator=g)}  # keep one: epochs are visited in order
        return self._perms[key]

    def global_indices(self, b: int, round_: int = 0) -> list[int]:
        """The P problem indices of batch b, round `round_` (all ranks)."""
        if round_ == 0:
            out = []
            for k in range(b * self.p, (b + 1) * self.p):
                epoch, pos = divmod(k, self.d)
                out.append(int(self._perm(stream_seed(self.seed, epoch))[pos]))
            return out
        g = torch.Generator().manual_seed(stream_seed(self.seed, b, round_, 7))
        return torch.randint(self.d, (self.p,), generator=g).tolist()

    def indices(self, b: int, round_: int = 0) -> tuple[list[int], int]:
        """(this rank's problem indices, offset of the first one among the P global prompts)."""
        share = self.p // self.world
        lo = self.rank * share
        return self.global_indices(b, round_)[lo : lo + share], lo


def make_producer(cfg: Any, comps: Components, stream: PromptStream) -> Callable[[int, Any], Batch]:
    """`produce(b, engine) -> (Rollouts with rewards and advantages, info)` for batch index b."""
    from p3o.advantages import group_advantages, overlong_penalty

    ro, lp, adv_cfg = cfg.rollout, cfg.loop, cfg.advantage
    g = ro.group_size
    rank = dist.rank()
    tries = lp.dynamic_sampling_max_tries if lp.dynamic_sampling else 1

    def generate(b: int, round_: int, engine: Any) -> tuple[Rollouts, Tensor]:
        idx, offset = stream.indices(b, round_)
        r = engine.generate(
            [comps.prompts[i] for i in idx],
            g,
            seed=stream_seed(cfg.seed, b, round_, rank),
            answers=[comps.answers[i] for i in idx],
        )
        # group ids unique within the batch across ranks and rounds: (round, global prompt position)
        r.group_ids = (round_ * stream.p + offset + torch.arange(len(idx)).repeat_interleave(g)).to(r.group_ids)
        score = comps.reward_fn(r).float().to(r.rewards.device)
        reward = score.clone()
        if lp.overlong_penalty:
            lengths = r.mask.sum(-1)
            reward = reward + overlong_penalty(lengths, ro.max_new_tokens, lp.overlong_buffer, lp.overlong_factor)
        r.rewards = reward
        return r, score

    def produce(b: int, engine: Any) -> Batch:
        t0 = time.perf_counter()
        parts: list[Rollouts] = []
        scores: list[Tensor] = []
        kept_groups = 0
        first: tuple[Rollouts, Tensor] | None = None
        generated = 0
        for round_ in range(tries):
            r, score = generate(b, round_, engine)
            generated += len(r)
            scores.append(score)
            if first is None:
                first = (r, score)
            if not lp.dynamic_sampling:
                parts.append(r)
                break
            rows = _informative_rows(r.rewards, r.group_ids)
            if rows:
                parts.append(r.select(rows))
                kept_groups += len(rows) // g
            if kept_groups >= len(r) // g:
                break
        assert first is not None
        if not parts:  # dynamic sampling found nothing informative: train on the first round (zero advantages)
            parts = [first[0]]
        batch = Rollouts.cat(parts, pad_id=comps.pad_id) if len(parts) > 1 else parts[0]
        per_rank_groups = len(first[0]) // g
        if len(batch) > per_rank_groups * g:  # refills overshoot: keep the first P/world groups
            batch = batch.select(list(range(per_rank_groups * g)))
        adv, adv_stats = group_advantages(
            batch.rewards,
            batch.group_ids,
            std=adv_cfg.std,
            scale=adv_cfg.scale,
            baseline=adv_cfg.baseline,
            alpha=adv_cfg.alpha,
            eps=adv_cfg.eps,
        )
        batch.advantages = adv
        all_scores = torch.cat(scores)
        info_t = {
            "accuracy": (all_scores > 0.5).float().mean(),
            "score_mean": all_scores.mean(),
            "adv_mean": adv_stats["adv_mean"],
            "adv_std": adv_stats["adv_std"],
            "adv_abs_max": adv_stats["adv_abs_max"],
            "zero_adv_groups": adv_stats["zero_adv_groups"],
            "num_groups": adv_stats["num_groups"],
        }
        info = {k: float(v) for k, v in info_t.items()}
        info["generated"] = float(generated)
        info["gen_rounds"] = float(len(scores))
        info["time_gen_s"] = time.perf_counter() - t0
        return batch, info

    return produce


def _informative_rows(rewards: Tensor, group_ids: Tensor) -> list[int]:
    """Rows of groups whose rewards are not all equal (DAPO dynamic sampling keeps these)."""
    keep = []
    for gid in torch.unique(group_ids).tolist():
        rows = (group_ids == gid).nonzero().flatten()
        rg = rewards[rows]
        if bool((rg != rg[0]).any()):
            keep += rows.tolist()
    return sorted(keep)


# ------------------------------------------------------------------------------------------------ the loop


def evaluate(comps: Components, seed: int, batch_size: int = 64) -> dict[str, float]:
    """pass@1 on the held-out prompts: one sample each from a fresh engine copy of the current policy (fixed seed).

    Returns {"eval_accuracy": fraction with score > 0.5, "eval_score": mean score} ({} without eval prompts).
    """
    if not comps.eval_prompts:
        return {}
    engine = comps.make_engine(_engine_model(comps.policy))
    scores = []
    for i in range(0, len(comps.eval_prompts), batch_size):
        r = engine.generate(
            comps.eval_prompts[i : i + batch_size],
            1,
            seed=stream_seed(seed, i, 99991),
            answers=comps.eval_answers[i : i + batch_size],
        )
        scores.append(comps.reward_fn(r).float())
    s = torch.cat(scores)
    acc, mean = torch.stack([(s > 0.5).float().mean(), s.mean()]).tolist()
    return {"eval_accuracy": acc, "eval_score": mean}


def _engine_model(policy: nn.Module) -> nn.Module:
    """What a rollout engine copies: the policy, or with LoRA a plain HF model with the adapters merged."""
    from p3o.models.lora import is_lora, merged_copy

    return merged_copy(policy) if is_lora(policy) else policy


def _sync_weights(policy: nn.Module) -> dict[str, Tensor]:
    """The tensors an engine sync sends: the full state dict, or with LoRA only the merged adapted layers."""
    from p3o.models.lora import is_lora, merged_weights

    return merged_weights(policy) if is_lora(policy) else policy.state_dict()


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _trim_to_common(batch: Rollouts, info: dict[str, float], group_size: int) -> Rollouts:
    """Data parallel + dynamic sampling: every rank trains on the same number of groups (the minimum)."""
    if dist.world_size() == 1:
        return batch
    n_groups = dist.all_reduce_min(torch.tensor([len(batch) // group_size]))
    keep = int(n_groups.item()) * group_size
    if keep < len(batch):
        info["trimmed_rows"] = float(len(batch) - keep)
        batch = batch.select(list(range(keep)))
    return batch


def _lag_stats(batch: Rollouts, version: int) -> dict[str, float]:
    lag = token_lag(batch, version).float()
    if lag.numel() == 0:
        return {"lag_min": 0.0, "lag_mean": 0.0, "lag_max": 0.0}
    lo, mean, hi = torch.stack([lag.min(), lag.mean(), lag.max()]).tolist()
    return {"lag_min": lo, "lag_mean": mean, "lag_max": hi}


def _batch_stats(batch: Rollouts) -> dict[str, float]:
    lengths = batch.mask.sum(-1).float()
    vals = torch.stack(
        [
            batch.rewards.float().mean(),
            batch.rewards.float().std(correction=0) if len(batch) > 1 else torch.zeros(()),
            lengths.mean(),
            batch.truncated.float().mean(),
            batch.mask.sum().float(),
        ]
    ).tolist()
    return dict(zip(["reward_mean", "reward_std", "response_len_mean", "truncated_frac", "tokens"], vals))


def _reduce_info(values: dict[str, float]) -> dict[str, float]:
    """Average the per-rank batch statistics over ranks (sum for counts); identity at world size 1."""
    if dist.world_size() == 1:
        return values
    keys = sorted(values)
    summed = {"tokens", "zero_adv_groups", "num_groups", "generated", "dropped_rows", "trimmed_rows"}
    vec = dist.all_reduce_sum(torch.tensor([values[k] for k in keys], dtype=torch.float64)).tolist()
    w = dist.world_size()
    return {k: (v if k in summed else v / w) for k, v in zip(keys, vec)}


def run(cfg: Any, *, components: Components | None = None) -> Path:
    """Train with `cfg` (a validated `p3o.config.TrainConfig`) and return the run directory.

    `components` replaces `build_components(cfg)` (tests pass tiny fakes). Writes run_dir/config.yaml,
    metrics.jsonl, checkpoints/, final/ and plot.png (rank 0).

    A run never silently replaces another: a fresh run (no `ckpt.resume`) in a run_dir that holds an earlier run's
    outputs (`p3o.train.checkpoint.run_outputs`) raises ConfigError before anything is loaded or written, unless
    `cfg.overwrite` is set, in which case those outputs are removed once the components are built. `ckpt.resume`
    continues from the latest checkpoint; with none it starts from step 0, except over a finished run's final/
    (a run saved without checkpoints), which it refuses.
    """
    import dataclasses

    from p3o.config import objective_hyper, save_config
    from p3o.objectives import get_objective
    from p3o.train.checkpoint import (
        clear_run_outputs,
        latest_checkpoint,
        load_checkpoint,
        run_outputs,
        save_checkpoint,
        save_policy,
    )

    dist.init_from_env()
    _seed_everything(stream_seed(cfg.seed, dist.rank()))
    run_dir = Path(cfg.run_dir)
    problem = None
    if dist.is_main():
        outputs = run_outputs(run_dir)
        if outputs and not cfg.ckpt.resume and not cfg.overwrite:
            problem = (
                f"run_dir {run_dir} holds an earlier run ({', '.join(outputs)}); pass --resume to continue it or "
                f"--overwrite to replace it (or choose another --run_dir)"
            )
        elif cfg.ckpt.resume and "final" in outputs and latest_checkpoint(run_dir) is None:
            problem = (
                f"run_dir {run_dir} holds a finished run with no checkpoint to resume from; pass --overwrite "
                f"(without --resume) to replace it, or choose another --run_dir"
            )
        else:
            run_dir.mkdir(parents=True, exist_ok=True)
    problem = dist.broadcast_object(problem)  # every rank stops together (identity at world size 1)
    if problem:
        raise ConfigError(problem)
    comps = components if components is not None else build_components(cfg)
    hyper = objective_hyper(cfg.objective)
    objective_fn = get_objective(cfg.objective.name)
    needs = objective_needs(cfg.objective.name, hyper)
    if cfg.model.lora.r:
        from p3o.models.lora import AdaptersOff, apply_lora, is_lora

        if not is_lora(comps.policy):  # same seed on every rank: identical adapters
            comps.policy = apply_lora(comps.policy, cfg.model.lora, seed=cfg.seed)
        if comps.ref_model is None and ("ref_logp" in needs or cfg.train.ref_model):
            comps.ref_model = AdaptersOff(comps.policy)  # the base itself, adapters disabled: no second copy
    else:
        comps.policy.requires_grad_(True)
    policy = comps.policy
    if "ref_logp" in needs and comps.ref_model is None:
        comps.ref_model = copy.deepcopy(policy).eval().requires_grad_(False)

    up, opt_cfg, lp = cfg.update, cfg.optim, cfg.loop
    optimizer = make_optimizer(policy, opt_cfg.lr, weight_decay=opt_cfg.weight_decay, betas=tuple(opt_cfg.betas))
    for group in optimizer.param_groups:
        group["eps"] = opt_cfg.eps
    epochs = up.epochs
    total_opt_steps = cfg.steps * up.num_mini_batches * epochs
    scheduler = make_scheduler(
        optimizer,
        warmup_steps=opt_cfg.warmup_steps,
        total_steps=total_opt_steps,
        schedule=opt_cfg.schedule,
        min_factor=opt_cfg.min_lr_ratio,
    )

    start, loop_state = 0, None
    if cfg.ckpt.resume:
        found = load_checkpoint(run_dir, model=policy, optimizer=optimizer, scheduler=scheduler)
        if found is not None:
            start, loop_state = found["step"], found["loop_state"] or {}
            rng = (loop_state.get("rank_rng") or {}).get(dist.rank())
            if rng is not None:
                torch.set_rng_state(rng)
    if dist.is_main():
        if start == 0 and run_outputs(run_dir):
            # --overwrite, or --resume with no checkpoint yet: the earlier outputs would mix with this run's (and
            # its checkpoints would be picked up by a later --resume)
            removed = clear_run_outputs(run_dir)
            print(f"p3o train: starting fresh in {run_dir}: removed {', '.join(removed)}", file=sys.stderr)
        # `overwrite` is an action, not a setting: rerunning the saved config must not delete this run
        save_config(dataclasses.replace(cfg, overwrite=False), run_dir / "config.yaml")

    stream = PromptStream(len(comps.prompts), cfg.rollout.prompts_per_step, cfg.seed, dist.rank(), dist.world_size())
    produce = make_producer(cfg, comps, stream)
    engine = comps.make_engine(_engine_model(policy))
    if start > 0:
        engine.load_weights(_sync_weights(policy), start)
    source_state = ((loop_state or {}).get("rank_source") or {}).get(dist.rank())
    source: BatchSource = make_source(
        lp.mode,
        produce,
        engine,
        staleness=lp.staleness,
        max_lag=lp.max_lag,
        epochs=lp.reuse_epochs,
        start_step=start,
        start_version=start,
        state=source_state,
    )

    from p3o.config import to_dict
    from p3o.metrics import MetricsLogger, ProgressBar

    main = dist.is_main()
    logger = MetricsLogger(
        run_dir,
        to_dict(cfg) if main else None,
        enabled=main,
        tensorboard=cfg.log.tensorboard,
        wandb=cfg.log.wandb,
        wandb_project=cfg.log.wandb_project,
        truncate_after=start,  # a resumed run rewrites the steps after its checkpoint; a fresh one starts empty
    )
    bar = ProgressBar(
        cfg.steps, enabled=cfg.log.progress and main, description=f"p3o {cfg.objective.name}", start=start
    )
    t_run = time.perf_counter()
    try:
        for step in range(start, cfg.steps):
            t0 = time.perf_counter()
            batch, info = source.get(step)
            info = dict(info)
            t_wait = time.perf_counter() - t0
            if lp.dynamic_sampling:
                batch = _trim_to_common(batch, info, cfg.rollout.group_size)
            lag = _lag_stats(batch, step)
            t1 = time.perf_counter()
            stats = update(
                policy,
                optimizer,
                scheduler,
                batch,
                objective_fn,
                hyper,
                needs=needs,
                num_mini_batches=up.num_mini_batches,
                micro_batch_size=up.micro_batch_size,
                epochs=epochs,
                grad_clip=opt_cfg.grad_clip,
                temperature=cfg.train.temperature,
                ref_model=comps.ref_model,
                group=dist.group(),
                chunk_size=cfg.train.chunk_size,
            )
            t_sync = time.perf_counter()
            source.push_weights(_sync_weights(policy), step + 1)
            t_sync = time.perf_counter() - t_sync
            t_train = time.perf_counter() - t1
            local = {**info, **_batch_stats(batch), **lag}
            local["dropped_rows"] = float(getattr(source, "dropped_rows", 0))
            row = {**_reduce_info(local), **stats}
            wall = time.perf_counter() - t0
            row.update(
                time_wait_s=t_wait,
                time_train_s=t_train,
                time_sync_s=t_sync,
                time_step_s=wall,
                time_s=time.perf_counter() - t_run,
                tokens_per_s=row["tokens"] / max(wall, 1e-9),
                version=float(step + 1),
            )
            if lp.mode != "async":  # sync-style sources generate inside get(); async overlaps it
                row["time_gen_s"] = t_wait
            every = cfg.log.eval_every
            # after the first update (≈ the starting policy), every `every` steps, and at the end
            if main and ((step == 0 and every) or (every and (step + 1) % every == 0) or step + 1 == cfg.steps):
                t_eval = time.perf_counter()
                row.update(evaluate(comps, cfg.seed))
                row["time_eval_s"] = time.perf_counter() - t_eval
            bar.update(step + 1, row)
            if (step + 1) % cfg.log.every == 0 or step + 1 == cfg.steps:
                logger.log(step + 1, row)  # `step` in metrics.jsonl = completed steps (1-based), as in checkpoints
            # also at the last step, so `--resume` on a finished run has nothing left to redo
            if cfg.ckpt.every and ((step + 1) % cfg.ckpt.every == 0 or step + 1 == cfg.steps):
                _checkpoint(cfg, run_dir, step + 1, comps, optimizer, scheduler, source, save_checkpoint)
    finally:
        source.close()
        bar.close()
        logger.close()
    if dist.is_main():
        save_policy(run_dir / "final", _engine_model(policy), comps.tokenizer)  # LoRA: merged, plain HF
        if cfg.log.plot:
            from p3o.metrics import plot_run

            with contextlib.suppress(Exception):  # a plot must never fail a finished run
                plot_run(run_dir)
    dist.barrier()
    return run_dir


def _checkpoint(
    cfg: Any,
    run_dir: Path,
    step: int,
    comps: Components,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    source: BatchSource,
    save_checkpoint: Callable[..., Path],
) -> None:
    """Rank 0 writes the checkpoint; the loop state carries every rank's buffer and RNG (gathered)."""
    states = dist.all_gather_object({"source": source.state(), "rng": torch.get_rng_state()})
    if dist.is_main():
        loop_state = {
            "rank_source": {r: s["source"] for r, s in enumerate(states)},
            "rank_rng": {r: s["rng"] for r, s in enumerate(states)},
            "engine_version": step,
            "data_cursor": step,
            "mode": cfg.loop.mode,
        }
        save_checkpoint(
            run_dir,
            step,
            model=comps.policy,
            tokenizer=comps.tokenizer,
            optimizer=optimizer,
            scheduler=scheduler,
            loop_state=loop_state,
            keep_last=cfg.ckpt.keep_last,
        )
    dist.barrier()


__all__ = ["Components", "PromptStream", "build_components", "make_producer", "run", "stream_seed"]
