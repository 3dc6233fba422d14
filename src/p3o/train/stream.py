"""The data stream: which prompts batch b holds and how a batch is produced (generate → verify → advantages).
The in-loop held-out evaluation is `p3o.train.evaluation.Evaluator`.

Every batch is a pure function of (seed, b, round, rank) — no cursor to save, so a resumed run sees exactly the
batches an uninterrupted one would have seen:

    stream = PromptStream(num_prompts=len(prompts), per_step=16, seed=0)
    produce = Producer(cfg.rollout, cfg.loop, cfg.advantage, cfg.seed, comps, stream)
    rollouts, info = produce(b, engine)      # the b-th batch, with rewards and group-relative advantages
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from p3o import dist
from p3o.advantages import group_advantages, overlong_penalty
from p3o.errors import ConfigError
from p3o.train.sources import Batch
from p3o.types import Rollouts

if TYPE_CHECKING:
    from p3o.config import AdvantageConfig, LoopConfig, RolloutConfig
    from p3o.train.wiring import Components, RolloutSide

_SEED_MOD = 2**62


def stream_seed(*parts: int) -> int:
    """A deterministic 62-bit seed from integers (seed, index, round, rank, ...) — a simple polynomial hash."""
    h = 1469598103934665603
    for p in parts:
        h = (h * 1099511628211 + int(p) + 0x9E3779B97F4A7C15) % _SEED_MOD
    return h


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


class Producer:
    """`produce(b, engine) -> (Rollouts with rewards and advantages, info)`: the b-th batch of the data stream.

    Generate (one round, or refill rounds under dynamic sampling) → verify → overlong penalty → group-relative
    advantages. G = `ro.group_size` completions per prompt of `stream.indices(b)`; DAPO's overlong penalty and
    dynamic sampling (`lp`); advantages by `p3o.advantages.group_advantages` with `adv_cfg`; sampling seeds from
    (seed, b, round, rank). `rank`: the trainer rank the batches are for (None: this process's; a rollout worker
    produces every rank's share).
    """

    def __init__(
        self,
        ro: RolloutConfig,
        lp: LoopConfig,
        adv_cfg: AdvantageConfig,
        seed: int,
        comps: Components | RolloutSide,
        stream: PromptStream,
        rank: int | None = None,
    ) -> None:
        self.ro, self.lp, self.adv_cfg, self.seed = ro, lp, adv_cfg, seed
        self.comps, self.stream, self.rank = comps, stream, dist.rank() if rank is None else rank
        self.g = ro.group_size
        self.tries = lp.dynamic_sampling_max_tries if lp.dynamic_sampling else 1

    def __call__(self, b: int, engine: Any) -> Batch:
        """(Rollouts of batch b with rewards and advantages, info: accuracy, score and advantage statistics, rows
        generated, generation rounds, time_gen_s)."""
        t0 = time.perf_counter()
        batch, scores = self.sample(b, engine)
        adv_cfg = self.adv_cfg
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
        info["generated"] = float(all_scores.numel())
        info["gen_rounds"] = float(len(scores))
        info["time_gen_s"] = time.perf_counter() - t0
        return batch, info

    def sample(self, b: int, engine: Any) -> tuple[Rollouts, list[Tensor]]:
        """(the rows of batch b, the verifier scores of every round). Without dynamic sampling one round; with it,
        refill rounds keep only groups whose rewards differ until P/world groups are kept or the tries run out (none
        kept: the first round, zero advantages)."""
        g, lp = self.g, self.lp
        parts: list[Rollouts] = []
        scores: list[Tensor] = []
        kept_groups = 0
        first: Rollouts | None = None
        for round_ in range(self.tries):
            r, score = self.generate(b, round_, engine)
            scores.append(score)
            if first is None:
                first = r
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
            parts = [first]
        batch = Rollouts.cat(parts, pad_id=self.comps.pad_id) if len(parts) > 1 else parts[0]
        per_rank_groups = len(first) // g
        if len(batch) > per_rank_groups * g:  # refills overshoot: keep the first P/world groups
            batch = batch.select(list(range(per_rank_groups * g)))
        return batch, scores

    def generate(self, b: int, round_: int, engine: Any) -> tuple[Rollouts, Tensor]:
        """One round: G completions per prompt of `stream.indices(b, round_)`, (rollouts with rewards = score +
        overlong penalty, (n,) verifier scores)."""
        comps, lp, g = self.comps, self.lp, self.g
        idx, offset = self.stream.indices(b, round_)
        r = engine.generate(
            [comps.prompts[i] for i in idx],
            g,
            seed=stream_seed(self.seed, b, round_, self.rank),
            answers=[comps.answers[i] for i in idx],
        )
        # group ids unique within the batch across ranks and rounds: (round, global prompt position)
        r.group_ids = (round_ * self.stream.p + offset + torch.arange(len(idx)).repeat_interleave(g)).to(r.group_ids)
        score = comps.reward_fn(r).float().to(r.rewards.device)
        reward = score.clone()
        if lp.overlong_penalty:
            lengths = r.mask.sum(-1)
            reward = reward + overlong_penalty(lengths, self.ro.max_new_tokens, lp.overlong_buffer, lp.overlong_factor)
        r.rewards = reward
        return r, score


def _informative_rows(rewards: Tensor, group_ids: Tensor) -> list[int]:
    """Rows of groups whose rewards are not all equal (DAPO dynamic sampling keeps these)."""
    keep = []
    for gid in torch.unique(group_ids).tolist():
        rows = (group_ids == gid).nonzero().flatten()
        rg = rewards[rows]
        if bool((rg != rg[0]).any()):
            keep += rows.tolist()
    return sorted(keep)


make_producer = Producer  # the name the rollout workers (p3o.cluster) and docs/probe.md use

__all__ = ["Producer", "PromptStream", "make_producer", "stream_seed"]
