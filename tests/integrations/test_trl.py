"""TRL plug-in: real GRPOTrainer training on a tiny random Qwen3 (CPU, offline), the on-policy gradient against
TRL's own ``dapo`` loss, the choice of the ratio's denominator, the logged stats and the option checks."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

pytest.importorskip("trl")

from datasets import Dataset
from tiny_lm import build_tokenizer, digit_reward, make_tiny_lm
from trl import GRPOConfig, GRPOTrainer

from p3o.errors import ConfigError
from p3o.integrations.trl import P3OGRPOTrainer
from p3o.objectives import ObjectiveInputs, get_objective

PROMPTS = ["1+1=", "2+3=", "4+4=", "3+5=", "7+1=", "6+2="]


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def make_trainer(tokenizer, tmp_path, *, cls=P3OGRPOTrainer, max_steps=3, saved_model=False, **kwargs):
    """A (P3O)GRPOTrainer on a fresh tiny model; ``saved_model``: the model is saved first and TRL's reference model
    (``beta`` != 0) is loaded from that folder."""
    trainer_kwargs = {k: kwargs.pop(k) for k in ("objective", "objective_kwargs", "offpolicy_monitor") if k in kwargs}
    config = {
        "output_dir": str(tmp_path),
        "use_cpu": True,
        "per_device_train_batch_size": 4,
        "num_generations": 4,
        "max_completion_length": 6,
        "max_steps": max_steps,
        "learning_rate": 5e-2,
        "report_to": [],
        "logging_steps": 1,
        "save_strategy": "no",
        "bf16": False,
        "seed": 0,
        "loss_type": "dapo",
        "beta": 0.0,
    }
    config.update(kwargs)
    model = make_tiny_lm(vocab_size=len(tokenizer))
    if saved_model:
        model.save_pretrained(tmp_path / "model")
        model.config._name_or_path = str(tmp_path / "model")
    model.train()
    return cls(
        model=model,
        reward_funcs=digit_reward,
        args=GRPOConfig(**config),
        train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
        processing_class=tokenizer,
        **trainer_kwargs,
    )


@pytest.mark.parametrize("objective", ["p3o", "minpro"])
def test_trains_a_few_steps_and_logs_objective_stats(tokenizer, tmp_path, objective):
    torch.set_num_threads(1)
    # num_iterations=2: each generation batch is reused for a second optimizer step, so the second step is
    # off-policy (TRL computes old_per_token_logps) and the ratios leave 1.
    trainer = make_trainer(tokenizer, tmp_path, objective=objective, num_iterations=2, max_steps=4)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    after = list(trainer.model.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, after)), "no parameter changed"
    logs = [h for h in trainer.state.log_history if "objective/ess" in h]
    assert len(logs) == 4
    for h in logs:
        assert math.isfinite(h["loss"])
        assert 0.0 < h["objective/ess"] <= 1.0 + 1e-6
        assert "entropy" in h and "objective/ratio_max" in h
    # fresh batches (steps 1, 3) are on-policy: ρ ≡ 1; the reused batches (steps 2, 4) are not.
    assert logs[0]["objective/ratio_max"] == pytest.approx(1.0, abs=1e-5)
    assert max(abs(h["objective/ratio_max"] - 1) + abs(h["objective/ratio_min"] - 1) for h in logs[1::2]) > 1e-4
    if objective == "p3o":
        assert logs[0]["objective/kl_weight"] == pytest.approx(0.0, abs=1e-6)
        assert min(h["objective/ess"] for h in logs[1::2]) < 1.0
        assert "objective/capped_frac" in logs[0]
    else:
        assert "objective/m_mean" in logs[0] and "objective/weight_decile_9" in logs[0]


def fake_batch(tokenizer, n=6, p=3, t=7, seed=0):
    """A hand-made micro-batch in TRL's input format (left-padded prompts, right-padded completions)."""
    g = torch.Generator().manual_seed(seed)
    vocab = len(tokenizer)
    prompt_ids = torch.randint(4, vocab, (n, p), generator=g)
    prompt_mask = torch.ones(n, p, dtype=torch.long)
    prompt_mask[0, 0] = 0
    completion_ids = torch.randint(4, vocab, (n, t), generator=g)
    lengths = torch.tensor([7, 3, 5, 1, 6, 7])[:n]
    completion_mask = (torch.arange(t)[None, :] < lengths[:, None]).long()
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": torch.randn(n, generator=g),
        # a generation batch twice this micro-batch (steps_per_generation = 2 = gradient accumulation)
        "num_items_in_batch": completion_mask.sum() * 2,
    }


def grads_of(trainer, loss_fn, inputs):
    trainer.model.zero_grad()
    loss = loss_fn(trainer.model, inputs)
    loss.backward()
    return loss.detach(), [p.grad.detach().clone() for p in trainer.model.parameters()]


def test_on_policy_gradient_equals_trl_dapo(tokenizer, tmp_path):
    torch.set_num_threads(1)
    trainer = make_trainer(tokenizer, tmp_path, objective="p3o", gradient_accumulation_steps=2)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 2
    inputs = fake_batch(tokenizer)
    loss_p3o, g_p3o = grads_of(trainer, trainer._compute_loss, inputs)
    loss_dapo, g_dapo = grads_of(trainer, lambda m, x: GRPOTrainer._compute_loss(trainer, m, x), inputs)
    # values differ (P3O's surrogate is −A·logp, DAPO's −ρ·A); on-policy the gradients are identical
    assert not torch.allclose(loss_p3o, loss_dapo)
    assert sum(g.abs().sum() for g in g_dapo) > 0
    for a, b in zip(g_p3o, g_dapo):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    assert trainer._metrics["train"]["objective/ess"][-1] == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("loss_type", "trl_eps", "objective", "hyper", "spread"),
    [
        ("dapo", {"epsilon": 0.2, "epsilon_high": 0.28}, "dapo", {}, 0.4),
        ("cispo", {"epsilon_high": 5.0}, "cispo", {"trunc_eps_high": 4.0}, 2.0),
        ("grpo", {"epsilon": 0.2}, "grpo", {"clip_eps": 0.2}, 0.4),
        ("dr_grpo", {"epsilon": 0.2}, "grpo", {"clip_eps": 0.2, "agg": "seq-mean-token-sum-norm"}, 0.4),
    ],
)
def test_off_policy_loss_and_gradient_equal_trls_own_loss_types(
    tokenizer, tmp_path, loss_type, trl_eps, objective, hyper, spread
):
    """Off-policy (TRL's old_per_token_logps ≠ current), with gradient accumulation: p3o's baselines through the
    plug-in give TRL's own loss value and gradient for the matching loss_type (same normaliser, same ratios)."""
    torch.set_num_threads(1)
    trainer = make_trainer(
        tokenizer,
        tmp_path,
        objective=objective,
        objective_kwargs=hyper,
        loss_type=loss_type,
        gradient_accumulation_steps=2,
        max_completion_length=8,  # >= the fake batch's width (TRL's dr_grpo divides by it)
        **trl_eps,
    )
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 2
    inputs = fake_batch(tokenizer, seed=3)
    with torch.no_grad():
        logp, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model,
            torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1),
            torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1),
            inputs["completion_ids"].shape[1],
        )
    noise = torch.randn(logp.shape, generator=torch.Generator().manual_seed(4))
    inputs["old_per_token_logps"] = logp + spread * noise
    loss_p3o, g_p3o = grads_of(trainer, trainer._compute_loss, inputs)
    loss_trl, g_trl = grads_of(trainer, lambda m, x: GRPOTrainer._compute_loss(trainer, m, x), inputs)
    torch.testing.assert_close(loss_p3o, loss_trl, rtol=1e-5, atol=1e-7)
    assert sum(g.abs().sum() for g in g_trl) > 0
    for a, b in zip(g_p3o, g_trl):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)
    logged = trainer._metrics["train"]
    acted = logged["objective/trunc_frac" if objective == "cispo" else "objective/clipfrac"][-1]
    assert acted > 0  # the clip (grpo, dapo) / the truncation (cispo) is active somewhere


def test_ratio_uses_engine_logprobs_then_old_logprobs(tokenizer, tmp_path):
    """rollout_logp = sampling_per_token_logps (NaN → old_per_token_logps), and the loss is the objective's."""
    torch.set_num_threads(1)
    trainer = make_trainer(tokenizer, tmp_path, objective="p3o")
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    inputs = fake_batch(tokenizer)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        logp, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model,
            torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1),
            torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1),
            inputs["completion_ids"].shape[1],
        )
    old = logp + 0.3 * torch.randn(logp.shape, generator=g)
    sampling = logp + 0.5 * torch.randn(logp.shape, generator=g)
    sampling[1, 0] = float("nan")
    inputs.update(old_per_token_logps=old, sampling_per_token_logps=sampling)
    loss = trainer._compute_loss(trainer.model, inputs)

    mask = inputs["completion_mask"].bool()
    expected_rollout = sampling.clone()
    expected_rollout[1, 0] = old[1, 0]
    num_tokens = inputs["num_items_in_batch"] / 1 * 1 / trainer.args.steps_per_generation
    want, stats = get_objective("p3o")(
        ObjectiveInputs(logp, expected_rollout, mask, inputs["advantages"], old_logp=old, num_tokens=num_tokens)
    )
    torch.testing.assert_close(loss.detach(), want, rtol=1e-5, atol=1e-6)
    assert stats["ess"] < 1
    assert trainer._metrics["train"]["objective/ess"][-1] == pytest.approx(stats["ess"].item(), rel=1e-5)


def test_bad_objective_and_options_fail_with_one_line(tokenizer, tmp_path):
    with pytest.raises(ConfigError, match="unknown objective 'ppo3'"):
        make_trainer(tokenizer, tmp_path, objective="ppo3")
    with pytest.raises(ConfigError, match="objective_kwargs: unknown keyword 'clip_high'"):
        make_trainer(tokenizer, tmp_path, objective="minpro", objective_kwargs={"clip_high": 2.0})
    with pytest.raises(ConfigError, match="entropy_coef"):
        make_trainer(tokenizer, tmp_path, entropy_coef=0.01)
    with pytest.raises(ConfigError, match="ref_kl_coef"):
        make_trainer(tokenizer, tmp_path, objective_kwargs={"ref_kl_coef": 0.1})
    with pytest.raises(ConfigError, match="step_ess: TRL calls the loss once per micro-batch"):
        make_trainer(tokenizer, tmp_path, objective_kwargs={"scope": "step"})


def test_keywords_come_from_the_objective_record(tokenizer, tmp_path):
    """The record resolves the keywords: defaults filled in, a deprecated spelling renamed (with a warning), and
    GRPOConfig.beta becomes ref_kl_coef unless objective_kwargs sets it."""
    with pytest.warns(DeprecationWarning, match="'clip_eps_high' is deprecated; use 'trunc_eps_high'"):
        trainer = make_trainer(tokenizer, tmp_path, objective="minpro", objective_kwargs={"clip_eps_high": 2.0})
    spec = trainer.objective_spec
    assert spec.hyper == get_objective("minpro").resolve({"trunc_eps_high": 2.0})
    assert spec.given == {"trunc_eps_high": 2.0}
    trainer = make_trainer(tokenizer, tmp_path, objective="p3o", beta=0.05, saved_model=True)
    assert trainer.objective_spec.hyper["ref_kl_coef"] == 0.05
    kwargs = {"objective_kwargs": {"ref_kl_coef": 0.2}, "saved_model": True}
    trainer = make_trainer(tokenizer, tmp_path, objective="p3o", beta=0.05, **kwargs)
    assert trainer.objective_spec.hyper["ref_kl_coef"] == 0.2


def test_ess_is_reduced_over_accelerate_processes(tmp_path):
    """Two CPU processes (torchrun, gloo), each with half of an off-policy micro-batch: both log the ESS of the
    whole batch, not of their half."""
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    worker = Path(__file__).with_name("trl_ddp_worker.py")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port)]
    proc = subprocess.run([*cmd, str(worker), str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for r in ranks:
        assert r["ess"] == pytest.approx(r["ref_full"], rel=1e-5)
        assert abs(r["ref_half"] - r["ref_full"]) > 1e-3  # the halves' own ESS differ: the test can tell


def test_tool_tokens_stay_out_of_the_loss_and_the_ess(tokenizer, tmp_path):
    """A multi-turn batch (TRL's tool loop): tokens with tool_mask 0 are observations. Whatever their recorded
    log-probs, the loss, its gradient and the ESS are those of the objective over completion_mask × tool_mask."""
    torch.set_num_threads(1)
    trainer = make_trainer(tokenizer, tmp_path, objective="p3o")
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    inputs = fake_batch(tokenizer)
    n, t = inputs["completion_ids"].shape
    tool = torch.ones(n, t, dtype=torch.long)
    tool[:, 1:3] = 0  # a tool's result in the middle of every completion
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        logp, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model,
            torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1),
            torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1),
            t,
        )
    sampling = logp + 0.3 * torch.randn(logp.shape, generator=g)
    results = []
    for junk in (0.0, 25.0):  # observations' recorded log-probs: whatever the engine put there
        rec = torch.where(tool.bool(), sampling, sampling - junk)
        batch = {**inputs, "tool_mask": tool, "old_per_token_logps": rec, "sampling_per_token_logps": rec}
        trainer.model.zero_grad()
        loss = trainer._compute_loss(trainer.model, batch)
        loss.backward()
        grad = torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None])
        results.append((loss.detach(), grad, trainer._metrics["train"]["objective/ess"][-1]))
    (l0, g0, e0), (l1, g1, e1) = results
    torch.testing.assert_close(l0, l1)
    torch.testing.assert_close(g0, g1)
    assert e0 == pytest.approx(e1) and e0 < 1
    mask = inputs["completion_mask"].bool() & tool.bool()
    num_tokens = inputs["num_items_in_batch"] / trainer.args.steps_per_generation
    want, stats = get_objective("p3o")(
        ObjectiveInputs(logp, sampling, mask, inputs["advantages"], old_logp=sampling, num_tokens=num_tokens)
    )
    torch.testing.assert_close(l0, want, rtol=1e-5, atol=1e-6)
    assert e0 == pytest.approx(stats["ess"].item(), rel=1e-5)
