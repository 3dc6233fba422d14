"""p3o.metrics.monitor.OffPolicyMonitor: statistics invariant to the micro-batch and rank split, position deciles on a
hand-built batch, and every finding firing on a constructed bad case while staying silent on an on-policy run."""

from __future__ import annotations

import math
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from p3o.metrics.monitor import OffPolicyMonitor, find, lag_bucket_names, prefixed, strip_prefixes
from p3o.objectives import effective_sample_size

N, T = 8, 12


def _batch(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    rollout = -torch.rand(N, T, generator=g) * 3
    logp = rollout + 0.6 * torch.randn(N, T, generator=g)
    logp[6:] += 3.0  # the last rows hold the global max log-ratio: the MAX reduction matters
    mask = torch.rand(N, T, generator=g) > 0.25
    mask[:, 0] = True
    versions = torch.randint(0, 11, (N, T), generator=g)
    return {"logp": logp, "rollout": rollout, "mask": mask, "versions": versions}


def _close(a: dict[str, float], b: dict[str, float]) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        if math.isnan(a[k]):
            assert math.isnan(b[k]), k
        else:
            assert b[k] == pytest.approx(a[k], rel=1e-6, abs=1e-9), k


def _one_batch() -> dict[str, float]:
    d = _batch()
    return OffPolicyMonitor(max_len=T, group=False).update(
        d["logp"], d["rollout"], d["mask"], versions=d["versions"], step=10
    )


def test_ess_is_kongs_over_all_valid_tokens() -> None:
    d = _batch()
    row = _one_batch()
    assert row["ess"] == pytest.approx(float(effective_sample_size(d["logp"] - d["rollout"], d["mask"])), rel=1e-6)
    assert row["tokens"] == d["mask"].sum().item()
    hist = [row[f"lag_hist_{k}"] for k in range(int(row["lag_max"]) + 1)]
    assert sum(hist) == pytest.approx(1.0) and f"lag_hist_{int(row['lag_max']) + 1}" not in row
    lag = (10 - d["versions"])[d["mask"]]
    assert hist == pytest.approx([(lag == k).double().mean().item() for k in range(len(hist))])
    assert sum(1 for b in lag_bucket_names() if not math.isnan(row[f"ess_lag_{b}"])) >= 4


@pytest.mark.parametrize("splits", [[2, 2, 2, 2], [1, 7], [5, 1, 2]])
def test_micro_batch_split_gives_the_same_statistics(splits: list[int]) -> None:
    d = _batch()
    mon = OffPolicyMonitor(max_len=T, group=False)
    start = 0
    for size in splits:
        sl = slice(start, start + size)
        mon.observe(d["logp"][sl], d["rollout"][sl], d["mask"][sl], d["versions"][sl], version=10)
        start += size
    _close(_one_batch(), mon.update(step=10))


def _worker(rank: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        d = _batch()
        rows = [0, 3, 6] if rank == 0 else [1, 2, 4, 5, 7]  # unequal shares; rank 0 holds one max row, rank 1 one
        mon = OffPolicyMonitor(max_len=T)  # the default group: WORLD
        for part in (rows[:1], rows[1:]):  # two micro-batches per rank
            mon.observe(d["logp"][part], d["rollout"][part], d["mask"][part], d["versions"][part], version=10)
        torch.save(mon.update(step=10), Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_ranks_give_the_one_process_statistics(tmp_path: Path) -> None:
    mp.spawn(_worker, args=(_free_port(), str(tmp_path)), nprocs=2, join=True)
    one = _one_batch()
    for rank in range(2):
        _close(one, torch.load(tmp_path / f"rank{rank}.pt"))


def test_position_deciles_on_a_hand_built_batch() -> None:
    # |lr| = 0.1·(t + 1) at decode position t; max_len 20 puts positions 2d and 2d+1 in decile d.
    t = 8
    rollout = torch.zeros(3, t)
    lr = 0.1 * (torch.arange(t) + 1.0)
    logp = rollout + lr * torch.tensor([[1.0], [-1.0], [1.0]])
    mask = torch.ones(3, t, dtype=torch.bool)
    mask[2, 3:] = False  # row 2 stops after 3 tokens
    row = OffPolicyMonitor(max_len=20, group=False, warn=False).update(logp, rollout, mask)
    assert row["dlogp_pos_0"] == pytest.approx(0.15)  # positions 0, 1 in all rows
    assert row["dlogp_pos_1"] == pytest.approx((0.3 * 3 + 0.4 * 2) / 5)  # position 2 in 3 rows, 3 in 2
    assert row["dlogp_pos_3"] == pytest.approx(0.75)
    assert all(math.isnan(row[f"dlogp_pos_{d}"]) for d in range(4, 10))  # no response reached them
    assert row["dlogp_max"] == pytest.approx(0.8)
    # max_len 4: position 3 is decile ⌊30/4⌋ = 7; positions 4..7 (at or beyond max_len) fall into the last decile
    row = OffPolicyMonitor(max_len=4, group=False, warn=False).update(logp[:2], rollout[:2], mask[:2])
    assert row["dlogp_pos_7"] == pytest.approx(0.4)
    assert row["dlogp_pos_9"] == pytest.approx(0.65)


def _run(make, steps: int = 20, **kw) -> tuple[OffPolicyMonitor, dict[str, float]]:
    mon = OffPolicyMonitor(max_len=32, group=False, warn=False, **kw)
    g = torch.Generator().manual_seed(1)
    row = {}
    for step in range(steps):
        logp, rollout, mask, versions = make(g)
        row = mon.update(logp, rollout, mask, versions=versions, step=step, version=step)
    return mon, row


def _lag0(n: int, t: int, step: int = 0) -> torch.Tensor:
    return torch.zeros(n, t, dtype=torch.long)


def _fired(mon: OffPolicyMonitor) -> dict[str, str]:
    return {f.name: f.cause for f in mon.findings}


def test_on_policy_run_is_silent() -> None:
    def make(g):
        rollout = -torch.rand(16, 32, generator=g) * 4
        return rollout.clone(), rollout, torch.ones(16, 32, dtype=torch.bool), None

    mon, row = _run(make)
    assert mon.findings == []
    assert row["ess"] == 1.0 and row["kl_k3"] == 0.0 and row["dlogp_max"] == 0.0
    assert all(row[f"finding_{n}"] == 0.0 for n in OffPolicyMonitor.FINDINGS)


def test_engine_mismatch_fires_low_ess_with_engine_cause() -> None:
    def make(g):
        rollout = -torch.rand(16, 32, generator=g) * 4
        return rollout + 0.8 * torch.randn(16, 32, generator=g), rollout, torch.ones(16, 32, dtype=torch.bool), None

    mon = OffPolicyMonitor(max_len=32, group=False, warn=False)
    g = torch.Generator().manual_seed(1)
    for step in range(20):  # every token fresh (lag 0): the engine carries it
        logp, rollout, mask, _ = make(g)
        row = mon.update(logp, rollout, mask, versions=torch.full((16, 32), step), step=step)
    assert _fired(mon)["low_ess"] == "engine"
    assert row["finding_low_ess"] == 1.0 and row["cause_low_ess"] == 2.0
    assert row["tokens_lag_0"] == 512 and row["tokens_stale"] == 0 and math.isnan(row["ess_stale"])
    assert row["ess_lag_0"] == row["ess"] and row["dlogp_mean_lag_0"] == pytest.approx(row["dlogp_mean"])
    assert "rollout.precision" not in mon.findings[0].suggestion  # no source: generic words

    mon, row = _run(make)  # the same data without versions: fresh and stale cannot be told apart
    assert _fired(mon)["low_ess"] == "undetermined" and row["cause_low_ess"] == 5.0
    assert "tokens_lag_0" not in row and "ess_stale" not in row and "dlogp_pos_stale_0" not in row


def test_stale_tokens_fire_low_ess_with_staleness_cause() -> None:
    def make(g):
        rollout = -torch.rand(16, 32, generator=g) * 4
        noise = torch.randn(16, 32, generator=g)
        stale = torch.arange(16)[:, None].expand(16, 32) >= 8  # half the rows are 4 versions old
        logp = rollout + torch.where(stale, 1.5 * noise, 0.01 * noise)
        versions = torch.where(stale, -4, 0)  # relative: update(version=step) adds the step below
        return logp, rollout, torch.ones(16, 32, dtype=torch.bool), versions

    mon = OffPolicyMonitor(max_len=32, group=False, warn=False)
    g = torch.Generator().manual_seed(1)
    for step in range(20):
        logp, rollout, mask, versions = make(g)
        row = mon.update(logp, rollout, mask, versions=versions + step, step=step)
    assert _fired(mon)["low_ess"] == "staleness" and row["cause_low_ess"] == 1.0
    assert row["ess_lag_0"] > 0.99 > row["ess_lag_4_7"] and row["ess_stale"] == pytest.approx(row["ess_lag_4_7"])
    assert row["tokens_lag_0"] == row["tokens_stale"] == 256
    assert row["lag_min"] == 0 and row["lag_max"] == 4 and row["lag_mean"] == pytest.approx(2.0)


def test_growing_mismatch_along_the_response_fires_position_drift() -> None:
    def make(g):
        rollout = -torch.rand(16, 32, generator=g) * 4
        scale = 0.002 * 1.15 ** torch.arange(32.0)  # 0.002 at t = 0 to 0.15 at t = 31
        return rollout + scale * torch.randn(16, 32, generator=g), rollout, torch.ones(16, 32, dtype=torch.bool), None

    mon, _ = _run(make)
    assert set(_fired(mon)) == {"position_drift"}
    assert "grows with position" in mon.findings[0].message


def test_position_drift_of_stale_tokens_names_staleness() -> None:
    """The same growth in a batch whose tokens are 2 versions old is attributed to staleness, not the engine."""
    from p3o.metrics.monitor import find

    rows = [{"lag_mean": 2.0, "dlogp_pos_0": 0.01, "dlogp_pos_1": 0.02, "dlogp_pos_4": 0.1, "dlogp_pos_5": 0.12}] * 20
    (finding,) = find(rows)
    assert finding.name == "position_drift" and finding.cause == "staleness"  # rows without the stale split
    assert "mean lag 2.00" in finding.evidence and "maximum lag" in finding.suggestion
    assert "loop.max_lag" in find(rows, source="p3o")[0].suggestion
    # the default job's size: a sparse last decile alone does not decide
    quiet = [{"lag_mean": 2.0, "dlogp_pos_0": 0.001, "dlogp_pos_1": 0.015, "dlogp_pos_2": 0.005, "dlogp_pos_3": 0.009}]
    quiet = [{**quiet[0], "dlogp_pos_4": 0.005, "dlogp_pos_5": 0.054}] * 20
    assert find(quiet) == []


def test_heavy_tails_fire_ratio_tails() -> None:
    def make(g):
        rollout = -torch.rand(16, 32, generator=g) * 4
        logp = rollout.clone()
        logp[0, :8] += 1.0  # 8 of 512 tokens with ρ = e: 1.6 %
        return logp, rollout, torch.ones(16, 32, dtype=torch.bool), None

    mon, row = _run(make)
    assert set(_fired(mon)) == {"ratio_tails"}
    assert row["ratio_frac_above_2"] == pytest.approx(8 / 512)


def test_early_small_ratios_fire_prefix_decay() -> None:
    def make(g):
        rollout = -torch.rand(16, 32, generator=g) * 4
        logp = rollout.clone()
        logp[:, 0] -= 2.0  # the first token of every response has ρ = e^-2: m_t = 0.135 afterwards
        return logp, rollout, torch.ones(16, 32, dtype=torch.bool), None

    mon, row = _run(make)
    assert "prefix_decay" in _fired(mon)
    assert row["m_mean"] == pytest.approx((1 + 31 * math.exp(-2)) / 32, rel=1e-5)


def test_nan_logprobs_fire_nonfinite_and_are_left_out() -> None:
    def make(g):
        rollout = -torch.rand(16, 32, generator=g) * 4
        bad = rollout.clone()
        bad[3, 5] = math.nan
        return rollout.clone(), bad, torch.ones(16, 32, dtype=torch.bool), None

    mon, row = _run(make, steps=1)
    assert set(_fired(mon)) == {"nonfinite"}
    assert row["nonfinite_frac"] == pytest.approx(1 / 512) and row["tokens"] == 511 and row["ess"] == 1.0


def test_low_ess_needs_more_than_half_the_window() -> None:
    rows = [{"ess": 0.5}] * 10 + [{"ess": 1.0}] * 10
    assert find(rows) == []
    assert [f.name for f in find(rows[:11])] == ["low_ess"]


def test_trainer_row_keys_and_prefixes() -> None:
    assert find([{"kl_clamped": 0.0}, {"kl_clamped": 2.0}])[0].name == "kl_clamped"
    row = strip_prefixes({"offpolicy/ess": 0.5, "ess": 0.9, "objective/ess": 0.8, "loss": 1.0}, ["offpolicy/"])
    assert row == {"ess": 0.5, "objective/ess": 0.8, "loss": 1.0}
    assert prefixed({"ess": 1.0}) == {"offpolicy/ess": 1.0}


def test_errors() -> None:
    mon = OffPolicyMonitor(group=False)
    with pytest.raises(ValueError, match="no tokens"):
        mon.update()
    with pytest.raises(ValueError, match="version"):
        mon.observe(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2, dtype=torch.bool), torch.zeros(1, 2))


def test_state_round_trip_continues_the_window_exactly() -> None:
    """A monitor restored from `state()` (what a checkpoint keeps) reports what the uninterrupted one does."""
    from p3o.metrics.monitor import OffPolicyMonitor

    g = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(6):
        rollout = -torch.rand(4, 8, generator=g) * 3
        batches.append((rollout + 0.8 * torch.randn(4, 8, generator=g), rollout, torch.ones(4, 8, dtype=torch.bool)))
    full = OffPolicyMonitor(max_len=8, warn=False, window=4)
    rows_full = [full.update(*b, step=i) for i, b in enumerate(batches)]
    first = OffPolicyMonitor(max_len=8, warn=False, window=4)
    for i, b in enumerate(batches[:3]):
        first.update(*b, step=i)
    resumed = OffPolicyMonitor(max_len=8, warn=False, window=4)
    resumed.load_state(first.state())
    rows_resumed = [resumed.update(*b, step=i + 3) for i, b in enumerate(batches[3:])]
    assert rows_resumed == rows_full[3:]
    assert any(v > 0 for k, v in rows_full[-1].items() if k.startswith("finding_"))  # the window matters here


def _row(step: int, **kw: float) -> dict[str, float]:
    return {"step": float(step), **kw}


def test_collapse_fires_on_one_step_and_names_it() -> None:
    rows = [_row(s, ess=0.99, ratio_max=1.5) for s in range(1, 13)]
    assert find(rows) == []
    rows[3] = _row(4, ess=0.05, ratio_max=1.5, ess_lag_0=1.0, tokens_lag_0=0.0, ess_stale=0.05, tokens_stale=64.0,
                   lag_mean=3.0)  # fmt: skip
    (f,) = find(rows, source="trl")
    assert f.name == "ess_collapse" and "step 4 " in f.message and "ESS 0.050" in f.evidence
    assert f.cause == "staleness" and "steps_per_generation" in f.suggestion  # only stale tokens at that step
    rows[3] = _row(4, ess=0.9, ratio_max=5e3, ratio_max_lag_0=5e3, tokens_lag_0=64.0, ess_lag_0=0.9, lag_mean=0.0)
    (f,) = find(rows, source="p3o")
    assert f.cause == "engine" and "max ratio 5e+03" in f.evidence and "rollout.precision" in f.suggestion


def test_engine_mismatch_needs_fresh_tokens_above_the_floor() -> None:
    fresh = [_row(s, ess=1.0, dlogp_mean_lag_0=1.3e-3, tokens_lag_0=64.0, lag_mean=0.0) for s in range(1, 5)]
    (f,) = find(fresh, source="verl")
    assert f.name == "engine_mismatch" and f.cause == "engine" and "actor_rollout_ref.rollout.dtype" in f.suggestion
    fp32 = [{**r, "dlogp_mean_lag_0": 2e-7} for r in fresh]
    assert find(fp32) == []


def test_weights_not_synced_needs_a_rising_fresh_mismatch() -> None:
    rising = [0.0, 0.06, 0.09, 0.1, 0.12, 0.12, 0.14, 0.14]
    rows = [_row(s + 1, dlogp_mean_lag_0=v, tokens_lag_0=64.0, lag_mean=0.0) for s, v in enumerate(rising)]
    got = {f.name: f.cause for f in find(rows)}
    assert got == {"weights_not_synced": "sync", "engine_mismatch": "sync"}  # the fresh mismatch is the sync's
    flat = [{**r, "dlogp_mean_lag_0": 0.05 + 0.01 * (s % 2)} for s, r in enumerate(rows)]  # a bf16-like engine
    assert {f.name for f in find(flat)} == {"engine_mismatch"}


def test_both_when_fresh_and_stale_tokens_carry_it() -> None:
    base = {"lag_mean": 1.0, "tokens_lag_0": 100.0, "tokens_stale": 100.0}
    rows = [_row(s, ratio_frac_above_2=0.05, ratio_tails_lag_0=0.02, ratio_tails_stale=0.08, **base) for s in range(5)]
    assert {f.name: f.cause for f in find(rows)} == {"ratio_tails": "both"}
    rows = [{**r, "ratio_tails_stale": 0.03} for r in rows]  # stale no worse than the engine explains
    assert {f.name: f.cause for f in find(rows)} == {"ratio_tails": "engine"}
    rows = [{**r, "ratio_tails_lag_0": 0.0, "ratio_tails_stale": 0.1} for r in rows]
    assert {f.name: f.cause for f in find(rows)} == {"ratio_tails": "staleness"}


def test_monitor_source_and_cause_keys() -> None:
    with pytest.raises(ValueError, match="source"):
        OffPolicyMonitor(source="deepspeed")
    mon = OffPolicyMonitor(max_len=4, group=False, warn=False, source="trl", window=1)
    logp = torch.zeros(2, 4)
    mask = torch.ones(2, 4, dtype=torch.bool)
    row = mon.update(logp, logp - 3.0, mask, versions=torch.zeros(2, 4), step=1, version=0)  # lag 0, ρ = e³
    assert row["finding_ratio_tails"] == 1.0 and row["cause_ratio_tails"] == 2.0  # the engine's tails
    assert row["finding_engine_mismatch"] == 1.0 and row["cause_low_ess"] == 0.0  # equal ratios: ESS 1
    assert "vllm_importance_sampling_correction" in next(f for f in mon.findings if f.name == "ratio_tails").suggestion


def test_unlagged_rows_take_the_callers_cause() -> None:
    rows = [{"ess": 0.5}] * 3  # no lags: fresh and stale cannot be told apart
    (f,) = find(rows, source="verl")
    assert f.cause == "undetermined" and "staleness_threshold" in f.suggestion and "rollout.dtype" in f.suggestion
    (f,) = find(rows, unlagged="engine")  # p3o mismatch: one engine against the trainer's own weights
    assert f.cause == "engine" and f.message.endswith(": engine mismatch")


def test_lag_counts_optimizer_updates_mini_batches_included() -> None:
    """lag = (version − versions)·updates_per_version + updates: a sync update of 4 mini-batches scores mini-batch k
    after k updates (lags 0-3, all in-batch); a batch one version old at 4 updates per version adds 4. The fresh
    split follows the lag in updates, so only mini-batch 0 is fresh."""
    d = _batch()
    rows = torch.arange(N)[:, None] // 2  # (N, 1): rows 2k, 2k+1 form mini-batch k
    mon = OffPolicyMonitor(max_len=T, group=False, warn=False)
    row = mon.update(d["logp"], d["rollout"], d["mask"], versions=torch.full((N, T), 5), version=5,
                     updates=rows, updates_per_version=4)  # fmt: skip
    valid = d["mask"].sum(1).double()
    lag = rows[:, 0].double()
    assert row["lag_min"] == 0 and row["lag_max"] == 3
    assert row["lag_mean"] == pytest.approx(float((lag * valid).sum() / valid.sum()))
    assert row["lag_in_batch_mean"] == pytest.approx(row["lag_mean"])
    assert row["tokens_lag_0"] == float(valid[:2].sum()) and row["tokens_stale"] == float(valid[2:].sum())
    row = mon.update(d["logp"], d["rollout"], d["mask"], versions=torch.full((N, T), 4), version=5,
                     updates=rows, updates_per_version=4)  # fmt: skip
    assert row["lag_min"] == 4 and row["lag_max"] == 7 and row["tokens_lag_0"] == 0
    assert row["lag_mean"] - row["lag_in_batch_mean"] == pytest.approx(4.0)
    with pytest.raises(ValueError, match="updates_per_version"):
        mon.observe(d["logp"], d["rollout"], d["mask"], d["versions"], 10, updates_per_version=0)
    with pytest.raises(ValueError, match="updates must be >= 0"):
        mon.observe(d["logp"], d["rollout"], d["mask"], d["versions"], 10, updates=-1)


def test_stale_later_mini_batches_name_staleness_from_mini_batches() -> None:
    """Sync mode, 4 mini-batches, an fp32 engine: mini-batch 0 matches the engine, the later ones drift with k. The
    version lag is 0 everywhere, so counting versions only called it an engine mismatch; counting updates it is
    staleness from mini-batches, with p3o's mini-batch fix."""
    g = torch.Generator().manual_seed(3)
    k = torch.arange(16)[:, None] // 4  # (16, 1) mini-batch of each row
    mon = OffPolicyMonitor(max_len=32, group=False, warn=False, source="p3o", window=6)
    for step in range(6):
        rollout = -torch.rand(16, 32, generator=g) * 4
        logp = rollout + 0.5 * k * torch.randn(16, 32, generator=g)  # k = 0: exact
        row = mon.update(logp, rollout, torch.ones(16, 32, dtype=torch.bool), versions=torch.full((16, 32), step),
                         version=step, updates=k, updates_per_version=4, step=step)  # fmt: skip
    fired = {f.name: f for f in mon.findings}
    assert "engine_mismatch" not in fired and fired["low_ess"].cause == "staleness"
    assert fired["low_ess"].message.endswith(": staleness from mini-batches")
    assert "lower update.num_mini_batches" in fired["low_ess"].suggestion
    assert "loop.max_lag" not in fired["low_ess"].suggestion and row["dlogp_mean_lag_0"] == 0.0


def test_staleness_origin() -> None:
    from p3o.metrics.rules import cause_text, staleness_origin

    assert staleness_origin([{"lag_mean": 1.5, "lag_in_batch_mean": 1.5}]) == "mini-batches"
    assert staleness_origin([{"lag_mean": 2.0, "lag_in_batch_mean": 0.0}]) == "policy lag"
    assert staleness_origin([{"lag_mean": 4.0, "lag_in_batch_mean": 1.5}]) == "policy lag and mini-batches"
    assert staleness_origin([{"lag_mean": 2.0}]) == ""  # versions only (TRL, older p3o rows): not said
    assert staleness_origin([{"lag_mean": 0.0, "lag_in_batch_mean": 0.0}]) == ""
    assert cause_text("staleness", "mini-batches") == "staleness from mini-batches"
    assert cause_text("both", "policy lag") == "staleness from policy lag and engine mismatch"
    assert cause_text("engine", "mini-batches") == "engine mismatch"
