"""p3o.train.checkpoint: round trip of weights / optimizer / scheduler / RNG / loop state, pruning, crash safety."""

from __future__ import annotations

import copy
import os
import random

import numpy as np
import pytest
import torch

import p3o.train.checkpoint as ckpt_mod
from p3o.errors import P3OError
from p3o.train.checkpoint import (
    LATEST,
    CheckpointWriteError,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
    save_policy,
)


def _trained(model: torch.nn.Module):
    """``model`` (the shared tiny LM) with AdamW and a LambdaLR scheduler after one step (so Adam has state)."""
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    ids = torch.tensor([[1, 5, 7, 9, 2]])
    model(ids, labels=ids).loss.backward()
    opt.step()
    sched.step()
    return model, opt, sched


def _perturbed_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` with different weights (what a fresh process would build before loading)."""
    other = copy.deepcopy(model)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn_like(p))
    return other


def _draws():
    return random.random(), float(np.random.rand()), torch.rand(3)


def test_round_trip_weights_optimizer_scheduler_rng_and_loop_state(tmp_path, tiny_lm):
    model, opt, sched = _trained(tiny_lm)
    buffer = {"rollout_logp": torch.randn(2, 4), "versions": [3, 4], "engine_version": 4}
    path = save_checkpoint(tmp_path, 10, model=model, optimizer=opt, scheduler=sched, loop_state=buffer)
    assert path == tmp_path / "checkpoints" / "step_000010"
    assert (path / "policy" / "model.safetensors").is_file() and (path / "policy" / "config.json").is_file()
    assert (tmp_path / "checkpoints" / LATEST).read_text().strip() == "step_000010"
    expected = _draws()  # what the RNGs give right after the save

    fresh, fresh_opt, fresh_sched = _trained(_perturbed_copy(model))
    fresh_sched.step()
    assert not torch.equal(fresh.model.embed_tokens.weight, model.model.embed_tokens.weight)
    state = load_checkpoint(tmp_path, model=fresh, optimizer=fresh_opt, scheduler=fresh_sched)
    assert state is not None and state["step"] == 10 and state["path"] == path
    got = _draws()
    assert got[0] == expected[0] and got[1] == expected[1] and torch.equal(got[2], expected[2])

    for (name, a), b in zip(model.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(a, b), name
    # Loading in place keeps weight tying and parameter identity (the optimizer still points at them).
    assert fresh.lm_head.weight.data_ptr() == fresh.model.embed_tokens.weight.data_ptr()
    assert fresh_opt.param_groups[0]["params"][0] is next(fresh.parameters())
    sa, sb = opt.state_dict(), fresh_opt.state_dict()
    assert sa["param_groups"] == sb["param_groups"]
    for k in sa["state"]:
        for field in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(sa["state"][k][field], sb["state"][k][field])
    assert fresh_sched.state_dict()["last_epoch"] == sched.state_dict()["last_epoch"] == 1
    assert torch.equal(state["loop_state"]["rollout_logp"], buffer["rollout_logp"])
    assert state["loop_state"]["versions"] == [3, 4]


def test_restore_rng_false_leaves_generators_alone(tmp_path):
    save_checkpoint(tmp_path, 1, model=torch.nn.Linear(2, 2))
    torch.manual_seed(123)
    expected = torch.rand(2)
    torch.manual_seed(123)
    load_checkpoint(tmp_path, restore_rng=False)
    assert torch.equal(torch.rand(2), expected)


def test_plain_module_and_explicit_checkpoint_path(tmp_path):
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 2)
    path = save_checkpoint(tmp_path, 3, model=lin)
    other = torch.nn.Linear(3, 2)
    assert load_checkpoint(path, model=other)["step"] == 3
    assert torch.equal(other.weight, lin.weight) and torch.equal(other.bias, lin.bias)
    with pytest.raises(P3OError, match="weights do not match"):
        load_checkpoint(path, model=torch.nn.Linear(3, 2, bias=False))


def test_keep_last_prunes_old_checkpoints(tmp_path):
    model = torch.nn.Linear(2, 2)
    for step in range(1, 6):
        save_checkpoint(tmp_path, step, model=model, keep_last=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_000004", "step_000005"]
    assert latest_checkpoint(tmp_path).name == "step_000005"
    save_checkpoint(tmp_path, 5, model=model, keep_last=1)  # re-saving a step replaces it
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_000005"]
    with pytest.raises(P3OError, match="keep_last"):
        save_checkpoint(tmp_path, 6, model=model, keep_last=0)


def test_crash_during_the_final_rename_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    model = torch.nn.Linear(2, 2)
    save_checkpoint(tmp_path, 1, model=model, loop_state={"at": 1})
    saved_weight = model.weight.detach().clone()
    real_replace = os.replace

    def failing_replace(src, dst):
        if os.path.basename(str(dst)).startswith("step_"):
            raise OSError("disk full")
        return real_replace(src, dst)

    monkeypatch.setattr(ckpt_mod.os, "replace", failing_replace)
    with torch.no_grad():
        model.weight.add_(1.0)
    with pytest.raises(
        CheckpointWriteError, match=r"step_000002 could not be written \(disk full\).*step_000001 is intact"
    ):
        save_checkpoint(tmp_path, 2, model=model, loop_state={"at": 2})
    monkeypatch.setattr(ckpt_mod.os, "replace", real_replace)

    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == [LATEST, "step_000001"]  # no debris, no half checkpoint
    fresh = torch.nn.Linear(2, 2)
    state = load_checkpoint(tmp_path, model=fresh)
    assert state["step"] == 1 and state["loop_state"] == {"at": 1}
    assert torch.equal(fresh.weight, saved_weight)


def test_killed_mid_write_debris_is_ignored_then_cleaned(tmp_path):
    model = torch.nn.Linear(2, 2)
    save_checkpoint(tmp_path, 1, model=model)
    root = tmp_path / "checkpoints"
    # A process killed mid-write leaves a hidden temp dir; a foreign incomplete step dir has no meta.json.
    (root / ".tmp-step_000002-999" / "policy").mkdir(parents=True)
    (root / ".tmp-step_000002-999" / "trainer_state.pt").write_bytes(b"\x80trunc")
    (root / "step_000003" / "policy").mkdir(parents=True)
    assert latest_checkpoint(tmp_path).name == "step_000001"
    assert load_checkpoint(tmp_path)["step"] == 1
    with pytest.raises(P3OError, match="not a complete checkpoint"):
        load_checkpoint(root / "step_000003")
    save_checkpoint(tmp_path, 4, model=model, keep_last=5)
    assert not (root / ".tmp-step_000002-999").exists()
    assert latest_checkpoint(tmp_path).name == "step_000004"


def test_lost_pointer_update_and_corrupt_newest_fall_back(tmp_path, monkeypatch):
    model = torch.nn.Linear(2, 2)
    save_checkpoint(tmp_path, 1, model=model, keep_last=3)

    def crash(*_a, **_k):
        raise KeyboardInterrupt  # killed between the directory rename and the pointer update

    monkeypatch.setattr(ckpt_mod, "_atomic_write_text", crash)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, 2, model=model, keep_last=3)
    monkeypatch.undo()
    root = tmp_path / "checkpoints"
    assert (root / LATEST).read_text().strip() == "step_000001"
    assert latest_checkpoint(tmp_path).name == "step_000002"  # the complete newer directory wins over the pointer

    (root / "step_000002" / "trainer_state.pt").write_bytes(b"garbage")
    with pytest.warns(UserWarning, match="skipping damaged checkpoint"):
        state = load_checkpoint(tmp_path)
    assert state["step"] == 1


def test_missing_and_empty(tmp_path):
    assert latest_checkpoint(tmp_path) is None
    assert load_checkpoint(tmp_path) is None
    with pytest.raises(P3OError, match="no such run directory"):
        load_checkpoint(tmp_path / "nope")


def test_save_policy_is_loadable_with_from_pretrained(tmp_path, tiny_lm):
    from transformers import AutoModelForCausalLM

    model, _, _ = _trained(tiny_lm)
    out = save_policy(tmp_path / "final", model)
    save_policy(tmp_path / "final", model)  # overwriting an existing final/ is fine
    again = AutoModelForCausalLM.from_pretrained(out)
    for (name, a), b in zip(model.state_dict().items(), again.state_dict().values()):
        assert torch.equal(a, b), name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final"]


def test_trainer_state_is_plain_and_loads_with_weights_only(tmp_path, tiny_lm):
    model, opt, sched = _trained(tiny_lm)
    fifo = [(3, {"texts": ["a"], "rewards": torch.ones(2), "advantages": None}, {"accuracy": 0.5})]
    path = save_checkpoint(tmp_path, 4, model=model, optimizer=opt, scheduler=sched, loop_state={"fifo": fifo})
    state = torch.load(path / "trainer_state.pt", weights_only=True)  # no allowlist: tensors and plain values
    assert state["format"] == 2 and set(state["rng"]) == {0}
    assert state["loop_state"]["fifo"][0][1]["texts"] == ["a"]

    class Opaque:
        pass

    with pytest.raises(P3OError, match=r"loop_state\['fifo'\]\[0\]\[2\]: a Opaque cannot be saved"):
        save_checkpoint(tmp_path, 5, model=model, loop_state={"fifo": [(4, {}, Opaque())]})
    assert latest_checkpoint(tmp_path).name == "step_000004"


def test_each_rank_restores_its_own_rng(tmp_path, monkeypatch):
    lin = torch.nn.Linear(2, 2)
    states = {}
    for rank, seed in ((0, 10), (1, 11)):  # what gather_rng_states collects: each rank's own generators
        random.seed(seed), np.random.seed(seed), torch.manual_seed(seed)
        states[rank] = ckpt_mod.rng_state()
    expected = {}
    for rank in (0, 1):
        ckpt_mod.set_rng_state(states[rank])
        expected[rank] = _draws()
    save_checkpoint(tmp_path, 1, model=lin, rng=states)
    for rank in (1, 0):
        monkeypatch.setattr(ckpt_mod.dist, "rank", lambda r=rank: r)
        load_checkpoint(tmp_path)
        got = _draws()
        assert got[:2] == expected[rank][:2] and torch.equal(got[2], expected[rank][2]), rank
    # a rank the checkpoint has no state for keeps its own generators
    monkeypatch.setattr(ckpt_mod.dist, "rank", lambda: 2)
    torch.manual_seed(5)
    ahead = torch.rand(2)
    torch.manual_seed(5)
    load_checkpoint(tmp_path)
    assert torch.equal(torch.rand(2), ahead)


def test_format_1_checkpoint_still_loads(tmp_path, monkeypatch):
    """Format 1 (before per-rank RNG): rank 0's states, NumPy's as an ndarray; only rank 0 restores them."""
    lin = torch.nn.Linear(2, 2)
    path = save_checkpoint(tmp_path, 1, model=lin)
    random.seed(3), np.random.seed(3), torch.manual_seed(3)
    old_rng = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    expected = _draws()
    state = torch.load(path / "trainer_state.pt", weights_only=True)
    torch.save({**state, "format": 1, "rng": old_rng}, path / "trainer_state.pt")
    (path / "meta.json").write_text('{"format": 1, "step": 1}\n')  # format 1 recorded no file sizes or hashes
    assert load_checkpoint(tmp_path)["step"] == 1
    got = _draws()
    assert got[:2] == expected[:2] and torch.equal(got[2], expected[2])
    monkeypatch.setattr(ckpt_mod.dist, "rank", lambda: 1)
    torch.manual_seed(5)
    ahead = torch.rand(2)
    torch.manual_seed(5)
    load_checkpoint(tmp_path)
    assert torch.equal(torch.rand(2), ahead)  # rank 1 does not take rank 0's generators
