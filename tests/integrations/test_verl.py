"""verl plug-in. Runs in the main .venv (which has no verl): the loss function itself (it needs no verl), its
errors, the ESS all-reduce over two gloo ranks; then the checks against verl 0.9.1's own code
(tests/integrations/verl_checks.py), run with .venv-verl/bin/python when scripts/verl_env.sh has created it."""

from __future__ import annotations

import importlib.util
import math
import os
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from venv_checks import checks_or_skip

import p3o.integrations.verl as plugin
from p3o.errors import ConfigError
from p3o.objectives import ObjectiveInputs, effective_sample_size, get_objective

ROOT = Path(__file__).resolve().parents[2]
VERL_PYTHON = ROOT / ".venv-verl" / "bin" / "python"
CHECKS_FILE = Path(__file__).with_name("verl_checks.py")
#: Started in the background once collection ends (tests/conftest.py), collected by the fixture.
VENV_CHECKS = [
    {
        "python": VERL_PYTHON,
        "script": CHECKS_FILE,
        "missing": "no .venv-verl (verl 0.9.1 needs transformers<5.11): create it with `bash scripts/verl_env.sh`",
    }
]
VERL_CHECKS = [
    "registered",
    "objectives_match_p3o_library",
    "p3o_off_policy_is_capped_by_the_ess",
    "every_verl_agg_mode_matches_verl_agg_loss",
    "exact_rollout_is_settings_parse",
    "untruncated_weights_fold_into_the_ratio",
    "truncated_masked_and_sequence_weights_warn_once",
    "verl_ppo_loss_call_site",
    "verl_use_external_modules_imports_the_plugin",
    "env_kwargs_reach_the_objective",
]


def batch(n: int = 4, t: int = 6, seed: int = 0, spread: float = 0.5) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(n, t, generator=g) * 3
    logp = (old + spread * torch.randn(n, t, generator=g)).requires_grad_()
    mask = torch.arange(t)[None, :] < torch.tensor([6, 2, 4, 5, 1, 3, 6, 2][:n])[:, None]
    adv = torch.randn(n, generator=g)[:, None].expand(n, t).clone()
    return {"old_log_prob": old, "log_prob": logp, "advantages": adv, "response_mask": mask}


@pytest.mark.skipif(importlib.util.find_spec("verl") is not None, reason="verl is installed in this environment")
def test_imports_without_verl_and_register_says_which_extra():
    assert "p3o" in plugin.LOSS_MODES and "minpro" in plugin.LOSS_MODES and "m2po" in plugin.LOSS_MODES
    with pytest.raises(ImportError, match=r"p3o\[verl\]"):
        plugin.register()


@pytest.mark.parametrize("objective", ["p3o", "minpro", "m2po"])
def test_loss_fn_equals_the_objective_token_mean(objective):
    b = batch(seed=1)
    loss, metrics = plugin.make_policy_loss(objective)(**b, loss_agg_mode="token-mean", config=None)
    want, stats = get_objective(objective)(
        ObjectiveInputs(b["log_prob"], b["old_log_prob"], b["response_mask"], b["advantages"])
    )
    torch.testing.assert_close(loss, want)
    (g_got,) = torch.autograd.grad(loss, b["log_prob"])
    (g_want,) = torch.autograd.grad(want, b["log_prob"])
    torch.testing.assert_close(g_got, g_want)
    assert metrics["actor/objective/ess"] == pytest.approx(stats["ess"].item())
    assert set(metrics) >= {"actor/pg_clipfrac", "actor/ppo_kl"}
    assert all(isinstance(v, float) for v in metrics.values())


def test_tool_tokens_with_response_mask_0_stay_out_of_the_loss_and_the_ess():
    """verl's agent loop zeroes response_mask on tool tokens: a multi-turn batch with holes in the mask gives the loss,
    gradient and ESS of the objective over the model tokens, whatever the tool positions hold."""
    b = batch(seed=3)
    mask = b["response_mask"].clone()
    mask[:, 1:3] = False  # a tool's response inside every row
    outs = []
    for junk in (0.0, 30.0):
        old = torch.where(mask, b["old_log_prob"], b["old_log_prob"] - junk)
        logp = torch.where(mask, b["log_prob"].detach(), b["log_prob"].detach() + junk).requires_grad_()
        loss, metrics = plugin.make_policy_loss("p3o")(old, logp, b["advantages"], mask, loss_agg_mode="token-mean")
        (grad,) = torch.autograd.grad(loss, logp)
        outs.append((loss.detach(), grad, metrics["actor/objective/ess"]))
    (l0, g0, e0), (l1, g1, e1) = outs
    torch.testing.assert_close(l0, l1)
    torch.testing.assert_close(g0, g1)
    assert (g0[~mask] == 0).all() and e0 == pytest.approx(e1)
    want, stats = get_objective("p3o")(
        ObjectiveInputs(b["log_prob"].detach(), b["old_log_prob"], mask, b["advantages"])
    )
    torch.testing.assert_close(l0, want)
    assert e0 == pytest.approx(stats["ess"].item())


def test_token_mean_uses_verls_global_token_count_times_dp_size():
    b = batch(seed=2)
    info = {"dp_size": 4, "batch_num_tokens": 50, "global_batch_size": 16, "loss_scale_factor": None}
    loss, _ = plugin.make_policy_loss("p3o")(**b, loss_agg_mode="token-mean", config={"global_batch_info": info})
    local, _ = plugin.make_policy_loss("p3o")(**b, loss_agg_mode="token-mean", config=None)
    n_local = b["response_mask"].sum().item()  # 18 tokens here
    # verl: Σ ℓ / batch_num_tokens · dp_size = local mean · n_local / 50 · 4
    torch.testing.assert_close(loss, local * n_local / 50 * 4)
    with pytest.raises(ValueError, match="batch_num_tokens is required"):
        plugin.make_policy_loss("p3o")(**b, config={"global_batch_info": {**info, "batch_num_tokens": None}})


@pytest.fixture
def fresh_warnings(monkeypatch):
    """The plug-in warns once per kind per process: give each test its own memory of what it warned."""
    monkeypatch.setattr(plugin, "_WARNED", set())


@pytest.mark.parametrize("objective", ["p3o", "minpro", "m2po", "cispo", "dapo"])
def test_untruncated_weights_fold_into_the_ratio(objective, fresh_warnings, recwarn):
    """w = π_old/π_rollout from a known π_rollout: the loss, gradient and ESS are the objective's with π_rollout."""
    b = batch(seed=11, spread=0.3)
    g = torch.Generator().manual_seed(12)
    rollout = b["old_log_prob"] + 0.4 * torch.randn(b["old_log_prob"].shape, generator=g)
    w = torch.exp(b["old_log_prob"] - rollout) * b["response_mask"]  # verl zeroes the padding
    got, metrics = plugin.make_policy_loss(objective)(**b, rollout_is_weights=w)
    inputs = ObjectiveInputs(b["log_prob"], rollout, b["response_mask"], b["advantages"])
    want, stats = get_objective(objective)(inputs, agg="token-mean")
    torch.testing.assert_close(got, want)
    (g_got,) = torch.autograd.grad(got, b["log_prob"])
    (g_want,) = torch.autograd.grad(want, b["log_prob"])
    torch.testing.assert_close(g_got, g_want)
    assert metrics["actor/objective/ess"] == pytest.approx(stats["ess"].item(), rel=1e-6)
    assert metrics["actor/objective/rollout_is_folded_frac"] == 1.0
    assert not [w for w in recwarn if issubclass(w.category, plugin.RolloutWeightsWarning)]


def test_split_rollout_weights_tells_truncated_masked_and_sequence_weights():
    mask = torch.tensor([[True, True, True], [True, True, False]])
    exact = torch.tensor([[1.3, 0.7, 2.9], [0.2, 1.1, 0.0]])
    split = plugin.split_rollout_weights(exact, mask)
    assert split.issues == {} and split.mult_log is None and split.folded_frac.item() == 1.0
    torch.testing.assert_close(split.fold_log, torch.where(mask, exact.log(), 0.0))
    assert plugin.split_rollout_weights(exact.clamp(max=2.0), mask).issues == {"truncated": {"cap": 2.0}}
    assert "truncated" in plugin.split_rollout_weights(exact.clamp(max=1.2), mask).issues  # a tie at the max
    masked = plugin.split_rollout_weights(torch.tensor([[1.3, 0.0, 2.9], [0.2, 1.1, 0.0]]), mask)
    assert masked.issues == {"masked": {"count": 1}} and masked.folded_frac.item() == pytest.approx(0.8)
    assert masked.mult_log is not None and masked.mult_log[0, 1] == -math.inf and masked.fold_log[0, 1] == 0
    seq = plugin.split_rollout_weights(torch.tensor([[1.7, 1.7, 1.7], [0.4, 0.4, 0.0]]), mask)
    assert seq.issues == {"sequence": {}} and seq.folded_frac.item() == 0.0 and not seq.fold_log.any()
    # no mismatch at all (w ≡ 1) is token-level and exact
    assert plugin.split_rollout_weights(mask.float(), mask).issues == {}


def test_weights_that_cannot_be_folded_warn_once(fresh_warnings):
    b = batch(seed=13)
    w = torch.exp(b["old_log_prob"] - b["old_log_prob"].roll(1, 1)).clamp(max=2.0) * b["response_mask"]
    assert (w[b["response_mask"]] == 2.0).any()
    loss_fn = plugin.make_policy_loss("p3o")
    with pytest.warns(plugin.RolloutWeightsWarning, match="rollout_is_threshold=inf"):
        loss_fn(**b, rollout_is_weights=w)
    with warnings.catch_warnings():
        warnings.simplefilter("error", plugin.RolloutWeightsWarning)
        loss_fn(**b, rollout_is_weights=w)  # once per kind and process


def test_bad_names_kwargs_and_env_fail_with_one_line(monkeypatch):
    with pytest.raises(ConfigError, match="unknown objective 'p4o'"):
        plugin.make_policy_loss("p4o")
    with pytest.raises(ConfigError, match="objective_kwargs: unknown keyword 'eps'"):
        plugin.make_policy_loss("minpro", eps=0.1)
    with pytest.raises(ConfigError, match="loss_agg_mode"):
        plugin.make_policy_loss("p3o", agg="token-mean")
    with pytest.raises(ConfigError, match=r"rollout_correction.*algorithm\.rollout_correction"):
        plugin.make_policy_loss("p3o", rollout_correction="token-tis")
    with pytest.raises(ConfigError, match=r"ref_logp: verl's KL to the reference is .*use_kl_loss"):
        plugin.make_policy_loss("p3o", ref_kl_coef=0.1)
    with pytest.raises(ConfigError, match="entropy_coeff"):
        plugin.make_policy_loss("minpro", entropy_coef=0.01)
    with pytest.raises(ConfigError, match="step_ess: verl calls the loss once per micro-batch"):
        plugin.make_policy_loss("p3o", scope="step")
    with pytest.raises(ConfigError, match="loss_mode: unknown p3o loss 'gspo'"):
        plugin.register(["gspo"])
    b = batch(seed=5)
    monkeypatch.setenv(plugin.ENV_KWARGS, "{not json")
    with pytest.raises(ConfigError, match="P3O_OBJECTIVE_KWARGS: invalid JSON"):
        plugin.make_policy_loss("p3o")(**b)
    # checked when a loss is called, not when all are registered: minpro's keyword must not break loss_mode=p3o
    monkeypatch.setenv(plugin.ENV_KWARGS, '{"trunc_eps_high": 2}')
    p3o_loss = plugin.make_policy_loss("p3o")
    with pytest.raises(
        ConfigError, match="P3O_OBJECTIVE_KWARGS: unknown keyword 'trunc_eps_high' for objective 'p3o'"
    ):
        p3o_loss(**b)
    plugin.make_policy_loss("minpro")(**b)  # valid there
    monkeypatch.setenv(plugin.ENV_KWARGS, '{"agg": "token-mean"}')
    with pytest.raises(ConfigError, match="loss_agg_mode"):
        plugin.make_policy_loss("minpro")(**b)


def test_keywords_come_from_the_objective_record(monkeypatch):
    """Hyper-parameters are the record's: the deprecated truncation spelling still works (with a warning), the
    environment overrides registration keywords; pg_clipfrac is clipfrac where a PPO clip exists, else band_frac."""
    b = batch(seed=14, spread=1.0)
    inputs = ObjectiveInputs(b["log_prob"], b["old_log_prob"], b["response_mask"], b["advantages"])
    want, _ = get_objective("minpro")(inputs, trunc_eps_high=0.5)
    with pytest.warns(DeprecationWarning, match="'clip_eps_high' is deprecated; use 'trunc_eps_high'"):
        old_spelling = plugin.make_policy_loss("minpro", clip_eps_high=0.5)
    torch.testing.assert_close(old_spelling(**b)[0], want)
    monkeypatch.setenv(plugin.ENV_KWARGS, '{"trunc_eps_high": 0.5}')
    torch.testing.assert_close(plugin.make_policy_loss("minpro", trunc_eps_high=3.0)(**b)[0], want)
    monkeypatch.delenv(plugin.ENV_KWARGS)
    for objective, stat in [
        ("p3o_grpo", "clipfrac"),
        ("p3o_dapo", "clipfrac"),
        ("p3o", "band_frac"),
        ("minpro", "band_frac"),
    ]:
        _, metrics = plugin.make_policy_loss(plugin.LOSS_MODES[objective])(**b)
        assert metrics["actor/pg_clipfrac"] == metrics[f"actor/objective/{stat}"], objective
    assert metrics["actor/pg_clipfrac"] > 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_ess(rank: int, port: int, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        b = batch(n=8, seed=3, spread=0.8)
        half = {k: v.detach()[rank * 4 : rank * 4 + 4] for k, v in b.items()}
        half["log_prob"].requires_grad_()
        _, metrics = plugin.make_policy_loss("p3o")(
            **half,
            loss_agg_mode="token-mean",
            config={"global_batch_info": {"dp_size": 2, "batch_num_tokens": int(b["response_mask"].sum())}},
        )
        out[rank] = metrics["actor/objective/ess"]
    finally:
        dist.destroy_process_group()


def test_ess_is_all_reduced_over_the_data_parallel_ranks():
    """Two gloo ranks each hold half the micro-batch; both report the ESS of the whole (not of their half)."""
    b = batch(n=8, seed=3, spread=0.8)
    lr = (b["log_prob"] - b["old_log_prob"]).detach()
    full = effective_sample_size(lr, b["response_mask"]).item()
    halves = [effective_sample_size(lr[i : i + 4], b["response_mask"][i : i + 4]).item() for i in (0, 4)]
    assert min(abs(full - h) for h in halves) > 1e-3  # the test can tell them apart
    out = mp.Manager().dict()
    mp.spawn(_rank_ess, args=(_free_port(), out), nprocs=2, join=True)
    assert out[0] == pytest.approx(full, rel=1e-5) and out[1] == pytest.approx(full, rel=1e-5)


@pytest.fixture(scope="module")
def verl_check_results() -> dict[str, str]:
    return checks_or_skip(**VENV_CHECKS[0])


@pytest.mark.parametrize("name", VERL_CHECKS)
def test_in_verl_env(verl_check_results, name):
    assert verl_check_results.get(name) == "PASS", verl_check_results.get(name, "not run")


def test_every_verl_check_is_listed(verl_check_results):
    assert sorted(verl_check_results) == sorted(VERL_CHECKS)


def test_data_parallel_group_prefers_megatrons(monkeypatch):
    import types

    if dist.is_initialized():
        pytest.skip("another test left a torch.distributed group initialised")
    assert plugin.data_parallel_group() is None  # no torch.distributed: single process
    sentinel = object()
    fake = types.SimpleNamespace(
        model_parallel_is_initialized=lambda: True,
        get_data_parallel_group=lambda with_context_parallel=False: (sentinel, with_context_parallel),
    )
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        assert plugin.data_parallel_group() is dist.group.WORLD
        monkeypatch.setitem(sys.modules, "megatron.core.parallel_state", fake)
        assert plugin.data_parallel_group() == (sentinel, True)
    finally:
        dist.destroy_process_group()


def test_verl_loads_the_plugin_through_its_entry_point():
    """`import verl` discovers p3o via the "verl.plugins" entry point: no VERL_USE_EXTERNAL_MODULES needed."""
    if not VERL_PYTHON.exists():
        pytest.skip("no .venv-verl (verl 0.9.1 needs transformers<5.11): create it with `bash scripts/verl_env.sh`")
    env = {k: v for k, v in os.environ.items() if k != "VERL_USE_EXTERNAL_MODULES"}
    code = "import verl\nfrom verl.trainer.ppo.core_algos import get_policy_loss_fn\nprint(get_policy_loss_fn('p3o'))"
    proc = subprocess.run(
        [str(VERL_PYTHON), "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0 and "policy_loss" in proc.stdout, proc.stderr[-2000:]
