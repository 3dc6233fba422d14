"""The in-loop evaluation keeps ONE engine for the run and gives the numbers a fresh engine per evaluation gives."""

from __future__ import annotations

import torch
from train_fakes import fake_components

from p3o.eval.runner import heldout_metrics
from p3o.train.evaluation import Evaluator
from p3o.train.sources import stream_seed
from p3o.train.wiring import engine_model, sync_weights


def _fresh(comps, seed: int) -> dict[str, float]:
    return heldout_metrics(
        engine_model(comps.policy),
        None,
        comps.eval_prompts,
        comps.eval_answers,
        comps.reward_fn,
        n_samples=1,
        batch_seed=lambda lo: stream_seed(seed, lo, 99991),
        engine=comps.make_engine,
    )


def test_one_engine_gives_the_fresh_engines_numbers():
    comps = fake_components(seed=0)
    comps.eval_prompts, comps.eval_answers = comps.prompts[:8], comps.answers[:8]
    built = []
    make_engine = comps.make_engine
    comps.make_engine = lambda model: built.append(1) or make_engine(model)
    evaluate = Evaluator(comps.rollout_side(), seed=3)
    policy = comps.policy
    results = []
    for version in range(3):
        ours = evaluate(version, lambda: sync_weights(policy), lambda: engine_model(policy))
        assert ours == {**_fresh(comps, 3), "eval_problems": 8.0}  # the count of held-out problems scored
        results.append(ours)
        with torch.no_grad():  # a new policy version: the reused engine must follow it
            for p in policy.parameters():
                p.add_(0.5 * torch.randn_like(p))
    assert results[0] != results[1] or results[1] != results[2]  # the versions really differ
    assert len(built) == 1 + 3  # one engine for the evaluator (+ one per fresh comparison)
