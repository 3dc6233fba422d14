"""The plan of one update: which rows of a rollout batch each optimizer step (a mini-batch) and each forward /
backward (a micro-batch) takes, fixed for the whole update (`p3o.train.step.UpdateStep.plan` builds it).

Mini-batches are contiguous, near-equal row chunks (:func:`split_rows`); a mini-batch is cut into micro-batches of
``update.micro_batch_size`` rows, or by a token budget (:func:`token_budget_micros`,
``update.max_tokens_per_micro_batch``), and each micro-batch is trimmed to its own padding (:func:`micro_batch`).
Every rank ends with the same number of micro-batches per mini-batch: a forward / backward is a collective under
DDP and FSDP.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from p3o import dist
from p3o.errors import ConfigError
from p3o.logprobs import Truncation
from p3o.types import Rollouts, SamplingMask

__all__ = ["MicroBatch", "UpdatePlan", "micro_batch", "split_rows", "token_budget_micros"]


@dataclass
class MicroBatch:
    """The tensors of one micro-batch, trimmed to its own padding. Shapes (n, p) prompt and (n, t) response."""

    rows: Tensor  # (n,) indices into the update's batch
    prompt_ids: Tensor
    prompt_mask: Tensor
    response_ids: Tensor
    mask: Tensor  # the loss mask: model tokens
    rollout_logp: Tensor
    advantages: Tensor
    t_full: int  # response width before trimming (side log-probs are stored at that width)
    attn: Tensor | None = None  # the response's attention mask (⊇ mask: an episode's observations too); None = mask
    kept: SamplingMask | Truncation | None = None  # the kept sets to replay (n, t); None: the whole vocabulary

    @property
    def reads(self) -> Tensor:
        """(n, t) bool, the response tokens the model reads (attention): `attn`, or `mask` for single-turn rows."""
        return self.mask if self.attn is None else self.attn


@dataclass
class UpdatePlan:
    """Which rows each optimizer step (`minis[k]`) and each forward/backward (`micros[k][j]`) takes, fixed for the
    whole update; `batch` is on the policy's device."""

    batch: Rollouts
    minis: list[Tensor]
    micros: list[list[MicroBatch]]

    @property
    def all_micros(self) -> list[MicroBatch]:
        """Every micro-batch, in order (the snapshot passes go over these)."""
        return [mb for mbs in self.micros for mb in mbs]

    @property
    def device(self) -> torch.device:
        """The batch's (= the policy's) device, where every accumulator lives."""
        return self.batch.mask.device


def token_budget_micros(batch: Rollouts, minis: list[Tensor], budget: int) -> list[list[Tensor]]:
    """Each mini-batch's rows cut into micro-batches of at most `budget` padded tokens, prompt groups kept together.

    A micro-batch of rows R whose prompts fall into U runs of identical prompts costs U · max_{r∈R} p_r + |R| ·
    max_{r∈R} t_r tokens (p_r, t_r: row r's valid prompt and response lengths; the micro-batch is trimmed to its own
    padding and `token_logprobs` computes each run's prompt once, so this is what its forward computes). The rows
    sharing a prompt (a GRPO group) stay consecutive: groups are taken by decreasing longest p_r + t_r, their rows in
    batch order, and added to the open micro-batch while its cost stays ≤ `budget` (a group larger than the budget
    allows continues in the next micro-batch). Every rank
    ends with the same number of micro-batches per mini-batch (a forward / backward is a collective under DDP and
    FSDP): a rank with fewer splits its largest ones in halves. One row longer than `budget` is a ConfigError.
    """
    p_len = batch.prompt_mask.sum(-1).cpu()
    t_len = batch.attn.sum(-1).clamp(min=1).cpu()  # type: ignore[union-attr]  # tokens read, observations too
    longest = dist.all_reduce_max(torch.stack([(p_len + t_len).max()]).float())
    if int(longest.item()) > budget:
        raise ConfigError(
            f"update.max_tokens_per_micro_batch {budget} is smaller than the longest sequence of the batch "
            f"({int(longest.item())} tokens, prompt + response); raise it to at least that"
        )
    prompt_of = _prompt_keys(batch)
    out: list[list[Tensor]] = []
    for mini in minis:
        groups: dict[int, list[int]] = {}
        for r in mini.tolist():
            groups.setdefault(prompt_of[r], []).append(r)
        order = sorted(groups.values(), key=lambda g: (-max(int(p_len[r] + t_len[r]) for r in g), g[0]))
        bins: list[list[int]] = []
        mp = mt = runs = 0
        for group in order:
            for i, r in enumerate(group):
                p, t, new_run = int(p_len[r]), int(t_len[r]), int(i == 0 or not bins or bins[-1][-1] != group[i - 1])
                if bins and (runs + new_run) * max(mp, p) + (len(bins[-1]) + 1) * max(mt, t) <= budget:
                    bins[-1].append(r)
                    mp, mt, runs = max(mp, p), max(mt, t), runs + new_run
                else:
                    bins.append([r])
                    mp, mt, runs = p, t, 1
        out.append(bins)
    counts = dist.all_reduce_max(torch.tensor([len(b) for b in out], dtype=torch.float32))
    for bins, want in zip(out, counts.tolist()):
        while len(bins) < int(want):
            i = max(range(len(bins)), key=lambda j: (len(bins[j]), -j))
            if len(bins[i]) < 2:
                raise ValueError(f"update: ranks disagree on the mini/micro-batch plan ({len(bins)} vs {int(want)})")
            half = (len(bins[i]) + 1) // 2
            bins[i : i + 1] = [bins[i][:half], bins[i][half:]]
    return [[torch.tensor(b, dtype=torch.long) for b in bins] for bins in out]


def _prompt_keys(batch: Rollouts) -> list[int]:
    """Each row's prompt as a small integer: rows with identical (prompt_ids, prompt_mask) share one."""
    ids = batch.prompt_ids.masked_fill(~batch.prompt_mask.bool(), -1).cpu()
    return torch.unique(ids, dim=0, return_inverse=True)[1].tolist()


def split_rows(n: int, parts: int) -> list[Tensor]:
    """`parts` contiguous, near-equal index chunks of range(n) (empty chunks dropped)."""
    return [c for c in torch.arange(n).chunk(parts) if c.numel()]


def micro_batch(batch: Rollouts, adv: Tensor, rows: Tensor) -> MicroBatch:
    """Rows `rows` of `batch`, with all-pad prompt columns (left) and all-pad response columns (right) dropped."""
    pm = batch.prompt_mask[rows]
    m = batch.mask[rows]
    a = None if batch.attn is batch.mask else batch.attn[rows]  # type: ignore[index]
    reads = m if a is None else a
    p_keep = int(pm.any(0).nonzero().min()) if pm.any() else pm.shape[1] - 1
    t_keep = int(reads.any(0).nonzero().max()) + 1 if reads.any() else 1
    return MicroBatch(
        rows=rows,
        prompt_ids=batch.prompt_ids[rows][:, p_keep:],
        prompt_mask=pm[:, p_keep:],
        response_ids=batch.response_ids[rows][:, :t_keep],
        mask=m[:, :t_keep],
        rollout_logp=batch.rollout_logp[rows][:, :t_keep],
        advantages=adv[rows],
        t_full=batch.mask.shape[1],
        attn=None if a is None else a[:, :t_keep],
        kept=None if batch.sampling_mask is None else batch.sampling_mask.select(rows).columns(t_keep),
    )
