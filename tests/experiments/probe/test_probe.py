"""The gradient probe on the synthetic toy: unbiased on-policy, references, tables, plot, CLI."""

from __future__ import annotations

import json
import math

import pytest
import torch

from p3o.advantages import group_advantages
from p3o.experiments import probe
from p3o.experiments import synthetic as syn
from p3o.experiments.probe.compute import ProbeConfig, probe_synthetic
from p3o.experiments.synthetic.config import SyntheticConfig

TINY_TRAJ = SyntheticConfig(objective="p3o", seeds=1, steps=12, lr=0.03, threshold=4, per_seed_curves=False)


@pytest.fixture(scope="module")
def on_policy() -> dict:
    cfg = ProbeConfig(lags=(0,), points=1, batches=768, ref_groups=4096, trajectory=TINY_TRAJ)
    return probe_synthetic(cfg)


def test_on_policy_gradient_points_at_the_high_sample_gradient(on_policy: dict) -> None:
    """L = 0: the mean of many seeded batch gradients points where g_ref points; each batch's cosine is positive
    on average; every objective gives the same on-policy gradient — except Clip-Cov, which drops a random
    high-covariance token's gradient even on-policy (by design), so its gradient is shorter."""
    ref = on_policy["points"]
    assert ref["ref_half_cos"][0] > 0.97  # the reference itself is precise
    cells = {c["objective"]: c for c in on_policy["cells"]}
    assert set(cells) == set(probe.DEFAULT_OBJECTIVES)
    for name, cell in cells.items():
        assert cell["cos_of_mean"] > (0.9 if name == "clip_cov" else 0.95), (name, cell)
        assert cell["cos"] > 0.1, (name, cell)
        assert cell["zero_frac"] == 0.0
    assert cells["clip_cov"]["norm_ratio"] < cells["grpo"]["norm_ratio"]
    rows = on_policy["rows"]
    by = {}
    for b, o, c in zip(rows["batch"], rows["objective"], rows["cos"]):
        if o != "clip_cov":
            by.setdefault(b, set()).add(round(c, 4) if c == c else None)
    assert all(len(v) == 1 for v in by.values())  # identical across objectives, batch by batch


def test_reference_is_the_on_policy_objective_gradient() -> None:
    """g_ref's per-batch formula (1/(N·T)) Σ A ∇log π equals every objective's on-policy gradient (ascent)."""
    cfg = SyntheticConfig(seeds=3)
    task, theta = syn.make_task(cfg), syn.init_params(cfg)
    u = torch.rand((3, cfg.prompts, cfg.group, cfg.length), generator=torch.Generator().manual_seed(0))
    batch = syn.sample_batch(theta, theta, task, cfg.group, u)
    adv, _ = group_advantages(batch.rewards.reshape(-1), batch.group_ids.reshape(-1))
    adv = adv.reshape(3, -1)
    th = theta.clone().requires_grad_(True)
    logp = syn.token_logp(torch.log_softmax(th, -1), batch)
    (g_ref,) = torch.autograd.grad(-(adv[..., None] * logp).mean((1, 2)).sum(), th)
    for name in ("p3o", "grpo", "minpro", "m2po", "gspo"):
        th = theta.clone().requires_grad_(True)
        logp = syn.token_logp(torch.log_softmax(th, -1), batch)
        loss, _ = syn.objective_loss(name, {}, logp, batch.rollout_logp, adv, prox_logp=logp.detach())
        (g,) = torch.autograd.grad(loss, th)
        assert torch.allclose(g, g_ref, atol=1e-6), name


def test_stale_batches_lower_ess_and_clip_fixed_clip_objectives() -> None:
    traj = SyntheticConfig(objective="p3o", seeds=1, steps=70, lr=0.05, threshold=4, per_seed_curves=False)
    cfg = ProbeConfig(
        lags=(0, 64), points=1, batches=32, ref_groups=512, trajectory=traj, objectives=("cispo", "gspo")
    )
    res = probe_synthetic(cfg)
    cells = {(c["objective"], c["lag"]): c for c in res["cells"]}
    assert cells[("cispo", 64)]["ess"] < cells[("cispo", 0)]["ess"] == pytest.approx(1.0)
    assert cells[("gspo", 64)]["zero_frac"] > 0.0  # GSPO's tiny ε clips whole sequences of a stale batch


def test_tables_plot_and_doc_block(on_policy: dict, tmp_path) -> None:
    table = probe.markdown_table(on_policy, "cos")
    assert table.count("\n") == 1 + len(probe.DEFAULT_OBJECTIVES) and "L=0" in table
    png = tmp_path / "p.png"
    probe.plot_probe(on_policy, png)
    assert png.stat().st_size > 10_000
    doc = tmp_path / "d.md"
    doc.write_text("intro\n<!-- probe:begin -->\nold\n<!-- probe:end -->\noutro\n")
    probe.update_doc(doc, on_policy, "p3o probe --x")
    text = doc.read_text()
    assert text.startswith("intro\n") and text.endswith("outro\n") and "old" not in text and "p3o probe --x" in text


def test_cli_writes_json(tmp_path) -> None:
    out = tmp_path / "probe.json"
    rc = probe.main(
        [
            "--objectives",
            "p3o,grpo",
            "--lags",
            "0,2",
            "--points",
            "1",
            "--trajectories",
            "1",
            "--batches",
            "4",
            "--ref-groups",
            "64",
            "--steps",
            "4",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    data = json.loads(out.read_text())
    assert len(data["rows"]["cos"]) == 2 * 2 * 4
    assert all(isinstance(x, float) and not math.isinf(x) for x in data["rows"]["ess"])


def test_language_model_probe_on_checkpoints(tmp_path) -> None:
    """The LM probe reads a run's per-step checkpoints; on-policy (L = 0) the token-mean objectives agree."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "train"))
    from train_fakes import fake_components, fake_config

    from p3o.train.loop import run

    cfg = fake_config(tmp_path / "r", steps=3, **{"ckpt.every": 1, "ckpt.keep_last": 10})
    run_dir = run(cfg, components=fake_components())
    res = probe.probe_lm(
        run_dir,
        objectives=("p3o", "cispo", "grpo:agg=token-mean", "grpo"),
        lags=(0, 2),
        points=1,
        batches=2,
        ref_batches=2,
        components=fake_components(),
    )
    rows = res["rows"]
    assert len(rows["cos"]) == 4 * 2 * 2 and set(rows["point"]) == {2}  # the first k with k − 2 available
    at0 = {}
    for o, lag, b, c in zip(rows["objective"], rows["lag"], rows["batch"], rows["cos"]):
        if lag == 0 and o != "grpo":
            at0.setdefault(b, []).append(c)
    for vals in at0.values():
        assert max(vals) - min(vals) < 1e-3, vals
    assert all(0.0 < e <= 1.0 for e in rows["ess"])


def test_p3o_pg_is_p3o_without_its_kl_term() -> None:
    """The probe's `p3o-pg` is the p3o record with kl_estimator=none: P3O's loss minus its (1 − e_B)·k3 term."""
    from p3o.experiments.synthetic.config import parse_objective
    from p3o.objectives import ObjectiveInputs, effective_sample_size, get_objective, k3

    g = torch.Generator().manual_seed(3)
    logp = -torch.rand((6, 5), generator=g) * 2
    roll = logp + 0.5 * torch.randn((6, 5), generator=g)
    mask = torch.rand((6, 5), generator=g) > 0.2
    adv = torch.randn(6, generator=g)
    full, _ = get_objective("p3o")(ObjectiveInputs(logp, roll, mask, adv), scope="sequence")
    name, hyper = parse_objective("p3o-pg")
    assert (name, hyper) == ("p3o", {"kl_estimator": "none"})
    pg, _ = get_objective(name)(ObjectiveInputs(logp, roll, mask, adv), scope="sequence", **hyper)
    lr = torch.where(mask, logp - roll, torch.zeros(()))
    ess = effective_sample_size(lr, mask, scope="sequence")
    kl = ((1 - ess) * torch.where(mask, k3(lr), torch.zeros(()))).sum() / mask.sum()
    assert torch.allclose(full, pg + kl, atol=1e-6)


def test_exact_context_divergences_match_sampled_estimators() -> None:
    """E over π_b's tokens of k3 is χ²(π_b‖π_θ) − KL(π_b‖π_θ), of k3_is KL(π_θ‖π_b), of k2 ½·lr²: exact vs sampled."""
    from p3o.objectives import kl_estimate

    cfg = SyntheticConfig(seeds=1, prompts=2, length=3, vocab=3)
    task = syn.make_task(cfg)
    theta = syn.init_params(cfg)[0]
    theta_b = theta + 1.5 * torch.randn(theta.shape, generator=torch.Generator().manual_seed(5))
    exact = syn.context_divergences(theta, theta_b)
    assert float(exact["e_k3"]) == pytest.approx(float(exact["chi2"] - exact["kl_rev"]), abs=1e-12)
    assert float(exact["e_k3_is"]) == pytest.approx(float(exact["kl"]), abs=1e-12)
    assert abs(float(exact["e_k3"] - exact["kl"])) > 0.1 * float(exact["kl"])  # k3 on π_b: not KL(π_θ‖π_b)
    g = 40000
    u = torch.rand((1, cfg.prompts, g, cfg.length), generator=torch.Generator().manual_seed(1))
    batch = syn.sample_batch(theta_b[None], theta_b[None], task, g, u)
    lr = syn.token_logp(torch.log_softmax(theta[None], -1), batch) - batch.rollout_logp
    for name in ("k3", "k3_is", "k2"):
        sampled = kl_estimate(lr.double(), name, clamp=50.0)
        se = float(sampled.std() / sampled.numel() ** 0.5)
        assert abs(float(sampled.mean()) - float(exact[f"e_{name}"])) < 5 * se, name


def test_probe_reports_each_estimators_reversal_and_the_exact_kl(tmp_path) -> None:
    traj = SyntheticConfig(objective="p3o", seeds=1, steps=40, lr=0.05, threshold=5, per_seed_curves=False)
    cfg = ProbeConfig(
        objectives=("p3o", "p3o-k3_is", "p3o-k2", "p3o-pg"),
        lags=(0, 8, 32),
        points=1,
        batches=4,
        ref_groups=64,
        trajectory=traj,
    )
    res = probe_synthetic(cfg)
    assert set(res["kl"]["lag"]) == {0, 8, 32} and res["kl"]["kl"][res["kl"]["lag"].index(0)] == 0.0
    table = probe.reversal_table(res)
    assert table.count("\n") == 1 + 4 and "`p3o-k3_is`" in table and ("none up to L=32" in table or "L=" in table)
    doc = tmp_path / "d.md"
    probe.update_doc(doc, res, "p3o probe --x")
    text = doc.read_text()
    assert "**Where the gradient reverses**" in text and "χ²(π_b‖π_θ) − KL(π_b‖π_θ)" in text
    assert "| 32 |" in probe.kl_table(res)
