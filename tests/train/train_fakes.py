"""Tiny fakes for the training-loop tests: a random tiny Qwen3, token-id prompts, a reward on token ids.

Also a command-line runner (used by the resume tests, which SIGKILL it):

    python tests/train/train_fakes.py RUN_DIR --steps 6 [--resume] [--kill-in-checkpoint 2] [--set key=value ...]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import torch

TESTS = Path(__file__).resolve().parents[1]
if str(TESTS) not in sys.path:  # run as a script (the resume tests' subprocess): tiny_lm.py is one folder up
    sys.path.insert(0, str(TESTS))

from tiny_lm import make_tiny_lm  # noqa: E402  (the one tiny random Qwen3; re-exported for the training tests)

from p3o.config import TrainConfig, apply_overrides  # noqa: E402
from p3o.train.wiring import Components  # noqa: E402
from p3o.types import Rollouts  # noqa: E402

VOCAB = 64


def even_token_reward(r: Rollouts) -> torch.Tensor:
    """(N,) fraction of valid response tokens with an even id: varies within groups, so advantages are non-zero."""
    even = (r.response_ids % 2 == 0) & r.mask
    return even.sum(-1).float() / r.mask.sum(-1).clamp(min=1).float()


def fake_components(seed: int = 0, n_prompts: int = 12, max_new_tokens: int = 6, reward_fn: Any = None) -> Components:
    """Components for `p3o.train.loop.run`: tiny random LM, random prompts of 3-6 tokens, `even_token_reward`."""
    from p3o.rollout import HFEngine

    g = torch.Generator().manual_seed(1234)
    prompts = [
        torch.randint(3, VOCAB, (int(torch.randint(3, 7, (1,), generator=g)),), generator=g).tolist()
        for _ in range(n_prompts)
    ]

    def make_engine(model: torch.nn.Module) -> HFEngine:
        return HFEngine(model, None, max_new_tokens=max_new_tokens, temperature=1.0, seed=seed, pad_token_id=0)

    return Components(
        policy=make_tiny_lm(seed=seed),
        tokenizer=None,
        prompts=prompts,
        answers=[str(i) for i in range(n_prompts)],
        reward_fn=reward_fn or even_token_reward,
        make_engine=make_engine,
    )


def fake_config(run_dir: str | Path, **overrides: Any) -> TrainConfig:
    """A small validated TrainConfig for the fakes (no plot, no progress bar, no TB/W&B)."""
    base = {
        "run_dir": str(run_dir),
        "seed": 0,
        "steps": 4,
        "rollout.prompts_per_step": 2,
        "rollout.group_size": 4,
        "rollout.max_new_tokens": 6,
        "update.micro_batch_size": 4,
        "loop.mode": "sync",
        "optim.lr": 1e-2,
        "ckpt.every": 0,
        "log.progress": False,
        "log.tensorboard": False,
        "log.wandb": False,
        "log.plot": False,
    }
    base.update(overrides)
    return apply_overrides(TrainConfig(), base)


def params_of(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def random_batch(
    model: torch.nn.Module, n: int = 8, p: int = 5, t: int = 6, seed: int = 0, noise: float = 0.3, group: int = 4
) -> Rollouts:
    """A Rollouts of random tokens with ragged prompts / responses; rollout_logp = the model's own log-probs plus
    noise (an off-policy batch); advantages standard normal; policy_version 0."""
    from p3o.logprobs import token_logprobs

    g = torch.Generator().manual_seed(seed)
    prompt_ids = torch.randint(3, VOCAB, (n, p), generator=g)
    prompt_len = torch.randint(2, p + 1, (n,), generator=g)
    prompt_mask = torch.arange(p)[None, :] >= (p - prompt_len)[:, None]  # left-padded
    prompt_ids = prompt_ids.masked_fill(~prompt_mask, 0)
    response_ids = torch.randint(3, VOCAB, (n, t), generator=g)
    resp_len = torch.randint(1, t + 1, (n,), generator=g)
    mask = torch.arange(t)[None, :] < resp_len[:, None]
    response_ids = response_ids.masked_fill(~mask, 0)
    with torch.no_grad():
        logp, _ = token_logprobs(model, prompt_ids, prompt_mask, response_ids, mask)
    rollout_logp = torch.where(mask, logp + noise * torch.randn(n, t, generator=g), torch.zeros(()))
    return Rollouts(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        response_ids=response_ids,
        mask=mask,
        rollout_logp=rollout_logp,
        policy_version=torch.where(mask, 0, -1).long(),
        group_ids=torch.arange(n) // group,
        rewards=torch.zeros(n),
        truncated=torch.zeros(n, dtype=torch.bool),
        advantages=torch.randn(n, generator=g),
    )


def _parse_value(text: str) -> Any:
    import yaml

    return yaml.safe_load(text)


def main(argv: list[str] | None = None) -> int:
    """Run the fake job in this process (the resume tests kill it with SIGKILL)."""
    from p3o.train import loop

    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--kill-in-checkpoint", type=int, default=0, help="SIGKILL inside the N-th checkpoint write")
    ap.add_argument("--set", action="append", default=[], help="key=value config override")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    overrides = {"steps": args.steps, "ckpt.every": 1, "ckpt.keep_last": 2, "ckpt.resume": args.resume}
    for kv in args.set:
        k, _, v = kv.partition("=")
        overrides[k] = _parse_value(v)
    cfg = fake_config(args.run_dir, **overrides)
    if args.kill_in_checkpoint:
        import signal

        from p3o.train import checkpoint

        real_save = checkpoint.torch.save
        calls = {"n": 0}

        def dying_save(obj: Any, path: Any, *a: Any, **kw: Any) -> None:
            calls["n"] += 1
            if calls["n"] == args.kill_in_checkpoint:
                real_save(obj, path, *a, **kw)  # the state file is written, meta.json is not: half a checkpoint
                os.kill(os.getpid(), signal.SIGKILL)
            real_save(obj, path, *a, **kw)

        checkpoint.torch.save = dying_save  # type: ignore[attr-defined]
    comps = fake_components(cfg.seed)
    run_dir = loop.run(cfg, components=comps)
    torch.save(params_of(comps.policy), Path(run_dir) / "final_params.pt")
    return 0


if __name__ == "__main__":
    sys.exit(main())


# ---------------------------------------------------------------------------------------------- data parallel

WS_ROWS = {1: [list(range(8))], 2: [[0, 1, 4, 5], [2, 3, 6, 7]]}
"""Rows of the global batch each rank holds: rank r's micro-batch j is half of world-size-1 micro-batch j."""


def dp_train(rank: int, world: int, init_file: str, out_dir: str, names: list[str]) -> None:
    """One rank of the world-size test: per objective, 2 updates × 2 mini-batches on its rows of an 8-row
    off-policy batch; rank 0 saves the parameters and stats to out_dir/ws{world}_{name}.pt."""
    import torch.distributed as tdist

    from p3o import dist
    from p3o.objectives import get_objective
    from p3o.train.step import update

    torch.set_num_threads(1)
    if world > 1:
        tdist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        batch = random_batch(make_tiny_lm(seed=0), n=8, seed=3, noise=0.3).select(WS_ROWS[world][rank])
        for name in names:
            model = make_tiny_lm(seed=0)
            opt = torch.optim.SGD(model.parameters(), lr=0.5)
            stats = {}
            for _ in range(2):
                stats = update(
                    model,
                    opt,
                    None,
                    batch,
                    get_objective(name),
                    {},
                    needs=get_objective(name).inputs_needed({}),
                    num_mini_batches=2,
                    micro_batch_size=4 // world,
                    grad_clip=1.0,
                    group=dist.group(),
                )
            if rank == 0:
                torch.save({"params": params_of(model), "stats": stats}, Path(out_dir) / f"ws{world}_{name}.pt")
    finally:
        if world > 1:
            tdist.destroy_process_group()
