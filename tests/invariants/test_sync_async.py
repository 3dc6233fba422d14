"""Sync is async with max_lag 0: the loops share one update step and give identical parameters."""

from __future__ import annotations

import torch
from train_fakes import fake_components, fake_config, params_of

from p3o.train.loop import run


def _train(tmp_path, name: str, **overrides) -> dict[str, torch.Tensor]:
    comps = fake_components(seed=0)
    run(fake_config(tmp_path / name, steps=4, **overrides), components=comps)
    return params_of(comps.policy)


def _assert_identical(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_sync_equals_async_lag0_and_stale0(tmp_path):
    torch.manual_seed(0)
    init = params_of(fake_components(seed=0).policy)
    sync = _train(tmp_path, "sync", **{"loop.mode": "sync"})
    assert any(not torch.equal(sync[k], init[k]) for k in sync), "training must move the parameters"
    _assert_identical(sync, _train(tmp_path, "async0", **{"loop.mode": "async", "loop.max_lag": 0}))
    _assert_identical(sync, _train(tmp_path, "stale0", **{"loop.mode": "stale", "loop.staleness": 0}))
    _assert_identical(sync, _train(tmp_path, "reuse1", **{"loop.mode": "reuse", "loop.reuse_epochs": 1}))


def test_async_with_lag_differs_from_sync(tmp_path):
    # the equality above is not vacuous: off-policy data (a stale FIFO) changes the result
    sync = _train(tmp_path, "sync", **{"loop.mode": "sync"})
    stale = _train(tmp_path, "stale2", **{"loop.mode": "stale", "loop.staleness": 2})
    assert any(not torch.equal(sync[k], stale[k]) for k in sync)
