"""Batch sources: the prompt stream is a function of the index, the FIFO delay is exactly n steps, async never exceeds
max_lag, crashes surface fast."""

from __future__ import annotations

import dataclasses
import random
import threading
import time

import pytest
import torch

from p3o.config import LoopConfig
from p3o.train.sources import (
    AsyncSource,
    GeneratorCrashed,
    PromptStream,
    ReuseSource,
    StaleSource,
    SyncSource,
    make_source,
    rollouts_to_state,
    token_lag,
)
from p3o.types import Rollouts


class VersionEngine:
    """A model-free engine: every token carries the engine's weight version; optional random delay."""

    def __init__(self, delay: float = 0.0, seed: int = 0) -> None:
        self.version = 0
        self.delay = delay
        self.rng = random.Random(seed)
        self.loaded: list[int] = []

    def generate(self, index: int) -> Rollouts:
        if self.delay:
            time.sleep(self.rng.uniform(0, self.delay))
        n, t = 4, 3
        mask = torch.ones(n, t, dtype=torch.bool)
        mask[0, 2] = False  # one padded position: its version must be ignored (-1)
        return Rollouts(
            prompt_ids=torch.full((n, 2), index),
            prompt_mask=torch.ones(n, 2, dtype=torch.bool),
            response_ids=torch.zeros(n, t, dtype=torch.long),
            mask=mask,
            rollout_logp=torch.zeros(n, t),
            policy_version=torch.where(mask, self.version, -1).long(),
            group_ids=torch.tensor([0, 0, 1, 1]),
            rewards=torch.zeros(n),
            truncated=torch.zeros(n, dtype=torch.bool),
        )

    def load_weights(self, state_dict, version: int) -> None:
        self.version = version
        self.loaded.append(version)


def produce(index, engine):
    return engine.generate(index), {"index": float(index), "version_at_production": float(engine.version)}


def _drive(source, steps: int, train_delay: float = 0.0, seed: int = 0):
    """The training loop's use of a source: get(s) → (train) → push version s + 1. Returns the infos."""
    rng = random.Random(seed)
    out = []
    for s in range(steps):
        batch, info = source.get(s)
        out.append((s, batch, info))
        if train_delay:
            time.sleep(rng.uniform(0, train_delay))
        source.push_weights({}, s + 1)
    source.close()
    return out


def test_sync_produces_on_policy():
    for s, batch, info in _drive(SyncSource(produce, VersionEngine()), 5):
        assert info["index"] == s and info["version_at_production"] == s
        assert token_lag(batch, s).max() == 0


@pytest.mark.parametrize("n", [0, 1, 3])
def test_stale_delay_is_exactly_n(n):
    calls = []

    def recording(index, engine):
        calls.append((index, engine.version))
        return produce(index, engine)

    src = StaleSource(recording, VersionEngine(), n)
    consumed = _drive(src, 8)
    for s, batch, info in consumed:
        assert info["index"] == s
        # batch s was generated while the trainer was at version max(0, s − n): exactly n steps late once warm
        assert info["version_at_production"] == max(0, s - n)
        lag = token_lag(batch, s)
        assert lag.min() == lag.max() == min(s, n)
    # the engine produced batch k + n at loop step k (version k), for every k
    produced_at = {index: version for index, version in calls}
    for k in range(8):
        assert produced_at[k + n] == k


def test_stale_state_round_trip_continues_identically():
    a = StaleSource(produce, VersionEngine(), 2)
    for s in range(3):
        a.get(s)
        a.push_weights({}, s + 1)
    eng = VersionEngine()
    eng.version = 3
    b = StaleSource(produce, eng, 2, state=a.state())
    for s in range(3, 6):
        ba, ia = a.get(s)
        bb, ib = b.get(s)
        assert ia == ib and torch.equal(ba.policy_version, bb.policy_version)
        a.push_weights({}, s + 1)
        b.push_weights({}, s + 1)


def test_reuse_trains_each_batch_epochs_times():
    consumed = _drive(ReuseSource(produce, VersionEngine(), 3), 7)
    assert [info["index"] for _, _, info in consumed] == [0, 0, 0, 1, 1, 1, 2]
    assert [info["version_at_production"] for _, _, info in consumed] == [0, 0, 0, 3, 3, 3, 6]


def test_async_lag0_is_sync():
    consumed = _drive(AsyncSource(produce, VersionEngine(delay=0.01), 0), 6, train_delay=0.01)
    for s, batch, info in consumed:
        assert info["index"] == s and info["version_at_production"] == s
        assert token_lag(batch, s).max() == 0


@pytest.mark.parametrize("max_lag", [1, 3])
def test_async_never_exceeds_max_lag(max_lag):
    # generation is fast and jittery, training slow and jittery: the producer runs ahead as far as allowed
    src = AsyncSource(produce, VersionEngine(delay=0.004, seed=max_lag), max_lag)
    consumed = _drive(src, 25, train_delay=0.01, seed=max_lag)
    lags = []
    for s, batch, _info in consumed:
        lag = token_lag(batch, s)  # every valid token the trainer consumed at version s
        assert lag.numel() == batch.mask.sum()
        assert int(lag.max()) <= max_lag, (s, lag.max())
        assert int(lag.min()) >= 0
        lags.append(int(lag.max()))
    assert max(lags) == max_lag  # the bound is reached (the test is not vacuous)
    assert src.dropped_rows == 0


def test_async_consumer_drops_rows_older_than_max_lag():
    # a queue restored with a batch from version 0, consumed at version 5 with max_lag 1: dropped, next one used
    old = VersionEngine()
    state = {"queue": [(i, rollouts_to_state(old.generate(i)), {"index": float(i)}) for i in (5, 6)]}
    engine = VersionEngine()
    engine.version = 5
    src = AsyncSource(produce, engine, 1, start_step=5, start_version=5, state=state)
    batch, info = src.get(5)  # both restored batches are too old: dropped whole, then a fresh one is produced
    assert src.dropped_rows == 8
    assert info["index"] == 7 and token_lag(batch, 5).max() <= 1
    src.close()


def test_async_crash_surfaces_at_the_next_get():
    crashed: list[int] = []

    def crashing(index, engine):
        if index == 2:
            crashed.append(index)
            raise RuntimeError("engine exploded")
        return produce(index, engine)

    src = AsyncSource(crashing, VersionEngine(), 1)
    with pytest.raises(GeneratorCrashed, match="engine exploded") as info:
        for s in range(10):  # fail fast: raised at the first get() after the crash, at step 1 or 2
            src.get(s)
            time.sleep(0.05)
            src.push_weights({}, s + 1)
    assert s <= 2 and crashed == [2]  # surfaced at the first get() after the crash, not at some later step
    assert isinstance(info.value.__cause__, RuntimeError)
    src.close()


def test_async_crash_while_trainer_waits():
    started = threading.Event()

    def slow_crash(index, engine):
        started.set()
        time.sleep(0.2)
        raise ValueError("late failure")

    src = AsyncSource(slow_crash, VersionEngine(), 2)
    assert started.wait(30)
    with pytest.raises(GeneratorCrashed, match="late failure"):  # the waiting trainer is woken, not left hanging
        src.get(0)
    src.close()


def test_make_source_rejects_unknown_mode():
    with pytest.raises(ValueError, match="unknown loop mode 'turbo'"):
        make_source(LoopConfig(mode="turbo"), produce, VersionEngine())


def test_make_source_reads_its_mode_setting_from_the_loop_section():
    loop = LoopConfig(staleness=3, max_lag=1, schedule="free", reuse_epochs=4)
    assert type(make_source(dataclasses.replace(loop, mode="sync"), produce, VersionEngine())) is SyncSource
    assert make_source(dataclasses.replace(loop, mode="stale"), produce, VersionEngine()).n == 3
    assert make_source(dataclasses.replace(loop, mode="reuse"), produce, VersionEngine()).epochs == 4
    src = make_source(dataclasses.replace(loop, mode="async"), produce, VersionEngine(), start=5)
    try:
        assert (src.max_lag, src.schedule, src.want, src.latest_version) == (1, "free", 5, 5)
    finally:
        src.close()


@pytest.mark.parametrize("max_lag", [1, 2])
def test_async_fixed_schedule_version_is_a_function_of_the_step(max_lag):
    # jittery generation and training: under the fixed schedule batch b is still generated by version b − max_lag
    versions = []
    for seed in range(2):
        src = AsyncSource(produce, VersionEngine(delay=0.004, seed=seed), max_lag, schedule="fixed")
        consumed = _drive(src, 12, train_delay=0.008, seed=seed)
        versions.append([info["version_at_production"] for _, _, info in consumed])
        for s, batch, info in consumed:
            assert info["index"] == s and info["version_at_production"] == max(0, s - max_lag)
            assert token_lag(batch, s).max() == min(s, max_lag)
    assert versions[0] == versions[1]


def test_async_fixed_equals_stale_fifo():
    # the same produce calls from the same versions: fixed-schedule async with max_lag n IS the stale FIFO with n
    def recording(log):
        def rec(index, engine):
            log.append((index, engine.version))
            return produce(index, engine)

        return rec

    a_log: list[tuple[int, int]] = []
    s_log: list[tuple[int, int]] = []
    a = _drive(AsyncSource(recording(a_log), VersionEngine(delay=0.003), 2, schedule="fixed"), 8, train_delay=0.005)
    s = _drive(StaleSource(recording(s_log), VersionEngine(), 2), 8)
    assert [i["version_at_production"] for _, _, i in a] == [i["version_at_production"] for _, _, i in s]
    # batches past the last trained one (8, 9: the stale prefill; 8-10: async look-ahead) may or may not have been
    # produced when the sources close; every batch both produced came from the same version
    a_prod, s_prod = dict(a_log), dict(s_log)
    both = a_prod.keys() & s_prod.keys()
    assert set(range(8)) <= both and all(a_prod[i] == s_prod[i] for i in both)


def test_async_free_schedule_stays_within_max_lag():
    # free: a jittery generator takes whatever version is newest when it starts; the bound still holds
    src = AsyncSource(produce, VersionEngine(delay=0.02), 2, schedule="free")
    consumed = _drive(src, 10)
    assert all(token_lag(b, s).max() <= 2 for s, b, _ in consumed)


def test_async_fixed_state_holds_every_batch_of_an_older_version():
    # a checkpoint after step s must hold the batches generated from versions < s + 1 (the resumed run cannot)
    src = AsyncSource(produce, VersionEngine(delay=0.01), 2, schedule="fixed")
    for s in range(3):
        src.get(s)
        src.push_weights({}, s + 1)
    queued = [idx for idx, _, _ in src.state()["queue"]]
    assert queued[:2] == [3, 4] and all(src.version_for(i) < 3 for i in (3, 4))
    src.close()


def test_async_rejects_unknown_schedule():
    with pytest.raises(ValueError, match="unknown async schedule 'eager'"):
        AsyncSource(produce, VersionEngine(), 1, schedule="eager")


def test_prompt_stream_is_a_function_of_the_index():
    a, b = PromptStream(10, 4, seed=3), PromptStream(10, 4, seed=3)
    seq = [a.global_indices(i) for i in range(5)]
    assert seq == [b.global_indices(i) for i in reversed(range(5))][::-1]  # order of queries does not matter
    first_epoch = sorted(x for batch in seq[:2] for x in batch) + sorted(seq[2][:2])
    assert sorted(first_epoch) == list(range(10))  # an epoch visits every prompt once
    r0, r1 = PromptStream(10, 4, seed=3, rank=0, world_size=2), PromptStream(10, 4, seed=3, rank=1, world_size=2)
    assert r0.indices(1)[0] + r1.indices(1)[0] == seq[1]
