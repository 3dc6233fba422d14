"""The synthetic instrument (a tabular autoregressive toy): exact reward, pairing, objectives, regimes, CLI."""

from __future__ import annotations

import dataclasses
import itertools
import json

import pytest
import torch

from p3o.advantages import group_advantages
from p3o.errors import ConfigError
from p3o.experiments import synthetic as syn
from p3o.experiments.synthetic import SyntheticConfig, run_synthetic
from p3o.experiments.synthetic import cli as synthetic_cli
from p3o.objectives import OBJECTIVES

SMALL = dict(seeds=4, steps=30, per_seed_curves=True)


def _brute_force(theta: torch.Tensor, task: syn.Task) -> torch.Tensor:
    """J_s by enumerating all V^T sequences (tiny V, T only)."""
    s_n, p_n, t_len, _, v = theta.shape
    logp = torch.log_softmax(theta.double(), -1)
    out = torch.zeros(s_n, dtype=torch.float64)
    for s in range(s_n):
        tot = 0.0
        for p in range(p_n):
            for ys in itertools.product(range(v), repeat=t_len):
                lp, prev, hits = 0.0, v, 0
                for t, y in enumerate(ys):
                    lp += float(logp[s, p, t, prev, y])
                    hits += int(y == int(task.targets[s, p, t, prev]))
                    prev = y
                tot += torch.exp(torch.tensor(lp)).item() * float(task.reward_of_count(torch.tensor(hits)))
        out[s] = tot / p_n
    return out


@pytest.mark.parametrize("reward", ["threshold", "count"])
def test_expected_reward_equals_enumeration(reward: str) -> None:
    cfg = SyntheticConfig(seeds=2, vocab=3, length=4, prompts=2, threshold=2, reward=reward, init_scale=1.5)
    task, theta = syn.make_task(cfg), syn.init_params(cfg)
    assert torch.allclose(syn.expected_reward(theta, task).double(), _brute_force(theta, task), atol=1e-5)


@pytest.mark.parametrize("reward", ["threshold", "count"])
def test_expected_reward_equals_monte_carlo(reward: str) -> None:
    cfg = SyntheticConfig(seeds=3, reward=reward, init_scale=1.0)
    task, theta = syn.make_task(cfg), syn.init_params(cfg)
    exact = syn.expected_reward(theta, task)
    g = 20000
    u = torch.rand((cfg.seeds, cfg.prompts, g, cfg.length), generator=torch.Generator().manual_seed(0))
    batch = syn.sample_batch(theta, theta, task, g, u)
    mc = batch.rewards.mean(1)
    se = batch.rewards.std(1) / (cfg.prompts * g) ** 0.5
    assert ((mc - exact).abs() < 4 * se + 1e-6).all(), (mc, exact)


def test_expected_reward_gradient_is_exact() -> None:
    cfg = SyntheticConfig(seeds=1, vocab=3, length=3, prompts=1, threshold=2)
    task = syn.make_task(cfg)
    theta = syn.init_params(cfg).double().requires_grad_(True)
    (grad,) = torch.autograd.grad(syn.expected_reward(theta, task).sum(), theta)
    d = torch.zeros_like(theta)
    d[0, 0, 1, 2, 0] = 1e-6
    fd = (syn.expected_reward(theta + d, task) - syn.expected_reward(theta - d, task)) / 2e-6
    assert torch.allclose(grad[0, 0, 1, 2, 0], fd[0], atol=1e-8)


def test_sampling_records_logprobs_and_rewards() -> None:
    cfg = SyntheticConfig(seeds=2)
    task, theta = syn.make_task(cfg), syn.init_params(cfg)
    u = torch.rand((2, cfg.prompts, cfg.group, cfg.length))
    b = syn.sample_batch(theta, theta, task, cfg.group, u)
    n = cfg.prompts * cfg.group
    assert b.y.shape == (2, n, cfg.length) and b.rewards.shape == (2, n)
    assert torch.equal(syn.token_logp(torch.log_softmax(theta, -1), b), b.rollout_logp)
    assert (b.prev[..., 0] == cfg.vocab).all() and torch.equal(b.prev[..., 1:], b.y[..., :-1])


def _offpolicy_inputs(s: int = 3, n: int = 8, t: int = 5) -> tuple:
    g = torch.Generator().manual_seed(1)
    logp = -torch.rand((s, n, t), generator=g) * 2
    roll = logp + torch.randn((s, n, t), generator=g) * torch.tensor([0.05, 0.4, 1.0])[:, None, None]
    prox = logp + 0.1 * torch.randn((s, n, t), generator=g)
    rewards = (torch.rand((s, n), generator=g) > 0.5).float()
    gid = torch.arange(s)[:, None] * 2 + (torch.arange(n) >= n // 2)[None]
    adv, _ = group_advantages(rewards.reshape(-1), gid.reshape(-1))
    return logp, roll, prox, adv.reshape(s, n)


def _required(name: str) -> dict:
    """Values for the hyper-parameters an objective has no default for (dro's beta): 0.1 each."""
    from p3o.objectives import get_objective

    return {k: 0.1 for k in get_objective(name).required}


@pytest.mark.parametrize(
    ("name", "hyper"),
    [(name, _required(name)) for name in OBJECTIVES]
    + [("p3o", {"scope": "sequence"}), ("p3o", {"agg": "seq-mean-token-mean"}), ("grpo", {"clip_eps": 0.4})],
)
def test_one_call_layouts_equal_per_seed_calls(name: str, hyper: dict) -> None:
    """Packing S seeds into one objective call gives exactly each seed's own objective (loss and gradient)."""
    logp, roll, prox, adv = _offpolicy_inputs()
    grads = []
    losses = []
    for layout in ("auto", "loop"):
        lp = logp.clone().requires_grad_(True)
        loss, stats = syn.objective_loss(name, hyper, lp, roll, adv, prox_logp=prox, layout=layout)
        (g,) = torch.autograd.grad(loss, lp)
        grads.append(g)
        losses.append(loss.detach())
        assert all(torch.isfinite(v) for v in stats.values())
    assert torch.allclose(losses[0], losses[1], rtol=1e-5, atol=1e-7)
    assert torch.allclose(grads[0], grads[1], rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("correction", ["seq-max-k2", "seq-max-k3", "geo-rs"])
def test_row_rejecting_corrections_pack_exactly(correction: str) -> None:
    """A row-rejecting rollout correction pools the kept rows' denominators, so the one-call layout is chosen by
    ``coupling_for(hyper)`` ("batch"): auto equals the per-seed loop, and the row packing (which would pool the
    seeds' denominators) does not."""
    logp, roll, prox, adv = _offpolicy_inputs()
    low, cap = (0.9, 1.1) if correction == "geo-rs" else (0.5, 0.5)
    hyper = {"rollout_correction": correction, "rollout_correction_low": low, "rollout_correction_cap": cap}
    out = {}
    for layout in ("auto", "loop", "rows"):
        lp = logp.clone().requires_grad_(True)
        loss, stats = syn.objective_loss("grpo", hyper, lp, roll, adv, old_logp=prox, layout=layout)
        (g,) = torch.autograd.grad(loss, lp)
        out[layout] = (loss.detach(), g, float(stats["rc_rejected_frac"]))
    assert 0.0 < out["loop"][2] < 1.0  # some rows, not all, are rejected
    assert torch.allclose(out["auto"][0], out["loop"][0], rtol=1e-6, atol=1e-8)
    assert torch.allclose(out["auto"][1], out["loop"][1], rtol=1e-6, atol=1e-8)
    assert not torch.allclose(out["rows"][0], out["loop"][0], rtol=1e-3)


def test_on_policy_p3o_and_grpo_are_identical() -> None:
    """On-policy, one update per batch: P3O's e_B = 1, weights 1, KL weight 0 — GRPO's gradient exactly."""
    base = SyntheticConfig(**SMALL)
    p3o = run_synthetic(dataclasses.replace(base, objective="p3o"))
    grpo = run_synthetic(dataclasses.replace(base, objective="grpo", hyper={"agg": "token-mean"}))
    assert p3o["per_seed_curves"]["reward"] == grpo["per_seed_curves"]["reward"]
    assert p3o["per_seed"] == {k: v for k, v in grpo["per_seed"].items()}
    assert max(p3o["curves"]["obj_kl_weight"]) == 0.0
    # with equal response lengths, GRPO's default seq-mean-token-mean is the same mean up to rounding
    grpo_default = run_synthetic(dataclasses.replace(base, objective="grpo"))
    a = torch.tensor(p3o["per_seed_curves"]["reward"])
    b = torch.tensor(grpo_default["per_seed_curves"]["reward"])
    assert torch.allclose(a, b, atol=1e-4)


def test_learning_raises_expected_reward_on_policy() -> None:
    out = run_synthetic(SyntheticConfig(seeds=8, steps=60, lr=0.03))
    gain = torch.tensor(out["per_seed"]["final_reward"]) - torch.tensor(out["per_seed"]["base_reward"])
    assert gain.mean() > 0.25 and (gain > 0).all()
    assert out["summary"]["mean_ess"] == 1.0


def test_stale_regime_drops_ess() -> None:
    cfg = SyntheticConfig(seeds=4, steps=60, lr=0.05, **syn.parse_regime("lag-32"))
    out = run_synthetic(cfg)
    assert out["summary"]["ess_p10_all"] < 0.9
    assert min(out["curves"]["ess"]) < 0.9
    assert out["curves"]["ess"][0] == pytest.approx(1.0)  # before any update θ_{u−L} = θ_0 = θ


def test_noise_and_processed_temperature_drop_ess_raw_temperature_hides_it() -> None:
    base = SyntheticConfig(seeds=4, steps=5)
    noisy = run_synthetic(dataclasses.replace(base, **syn.parse_regime("noise-0.8")))
    assert noisy["summary"]["mean_ess"] < 0.8
    proc = run_synthetic(dataclasses.replace(base, **syn.parse_regime("temp-0.6-processed")))
    assert proc["summary"]["mean_ess"] < 0.95
    raw = run_synthetic(dataclasses.replace(base, **syn.parse_regime("temp-0.6")))
    assert raw["summary"]["mean_ess"] == 1.0  # raw T = 1 log-probs of the same weights: ratio 1, biased samples


def test_multi_step_updates_leave_policy() -> None:
    out = run_synthetic(SyntheticConfig(seeds=2, steps=10, lr=0.2, **syn.parse_regime("mb4+ep2")))
    assert len(out["curves"]["ess"]) == 10 and out["summary"]["min_ess"] < 1.0


def test_seeds_are_paired_across_cells_and_objectives() -> None:
    """Seed s has the same task, init and noise whatever the cell size and the objective."""
    a = run_synthetic(SyntheticConfig(seeds=3, steps=5, objective="cispo"))
    b = run_synthetic(SyntheticConfig(seeds=1, seed_offset=2, steps=5, objective="cispo"))
    assert a["per_seed"]["final_reward"][2] == b["per_seed"]["final_reward"][0]
    c = run_synthetic(SyntheticConfig(seeds=3, steps=5, objective="minpro"))
    assert a["per_seed"]["base_reward"] == c["per_seed"]["base_reward"]


def test_all_objectives_run_in_an_off_policy_regime() -> None:
    for name in OBJECTIVES:
        cfg = SyntheticConfig(objective=name, hyper=_required(name), seeds=2, steps=3, **syn.parse_regime("mb2+lag-2"))
        out = run_synthetic(cfg)
        assert all(0.0 <= x <= 1.0 for x in out["per_seed"]["final_reward"]), name


def test_parse_regime_and_objective() -> None:
    assert syn.parse_regime("mb4+lag-8+noise-0.2") == {"mini_batches": 4, "lag": 8, "noise": 0.2}
    assert syn.parse_regime("temperature") == {"temperature": 1.2, "logprob_mode": "raw"}
    assert syn.parse_regime("temp-0.6-processed") == {"temperature": 0.6, "logprob_mode": "processed"}
    assert syn.parse_regime("on-policy") == {}
    with pytest.raises(ConfigError):
        syn.parse_regime("stael-4")
    assert syn.parse_objective("grpo:clip_eps=0.4:agg=token-mean") == ("grpo", {"clip_eps": 0.4, "agg": "token-mean"})
    assert syn.parse_objective("minpro:prefix_stat=mean") == ("minpro", {"prefix_stat": "mean"})
    with pytest.raises(ValueError):
        syn.parse_objective("nope")


def test_cli_writes_paired_json_and_csv(tmp_path) -> None:
    out, csv_path = tmp_path / "g.json", tmp_path / "g.csv"
    rc = synthetic_cli.main(
        [
            "--objectives",
            "p3o,grpo:clip_eps=0.4",
            "--regimes",
            "on-policy,stale-4",
            "--seeds",
            "3",
            "--steps",
            "4",
            "--out",
            str(out),
            "--csv",
            str(csv_path),
        ]
    )
    assert rc == 0
    data = json.loads(out.read_text())
    assert len(data["cells"]) == 4
    cells = synthetic_cli.load_grid(out)
    assert set(cells) == {(r, o) for r in ("on-policy", "stale-4") for o in ("p3o", "grpo:clip_eps=0.4")}
    assert cells[("stale-4", "p3o")]["seed"] == [0, 1, 2]
    assert len(csv_path.read_text().splitlines()) == 1 + 4 * 3


def test_regime_names_mean_what_they_mean_to_p3o_train() -> None:
    """One regime table: a name of p3o.experiments.grid.regimes.REGIMES delays by batches (loop.staleness), knobs say
    lag-<L> for optimizer updates; a regime without a toy counterpart is refused by name."""
    assert syn.parse_regime("stale-4") == {"lag": 4}
    assert syn.parse_regime("mb4-stale-2") == {"mini_batches": 4, "lag": 8} == syn.parse_regime("mb4+stale-2")
    assert syn.parse_regime("multi-step") == {"mini_batches": 4}
    assert syn.parse_regime("async") == {"lag": 4}
    assert syn.parse_regime("temp-0.6") == {"temperature": 0.6, "logprob_mode": "raw"}
    with pytest.raises(ConfigError, match=r"rollout\.precision"):
        syn.parse_regime("fp8-rollout")
    with pytest.raises(ConfigError, match="once"):
        syn.parse_regime("lag-2+stale-2")
