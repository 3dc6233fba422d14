"""Agent episodes end to end on the HF engine (a tiny random model, a scripted environment): token in / token out,
the loss mask apart from the attention mask, observation tokens out of the loss, the ESS and the monitor, and an
episode that spans a weight push."""

from __future__ import annotations

import torch
from episode_fakes import STOPS, IdsRenderer, Recording, ScriptedEnv, check_token_in_token_out, scripted_episodes
from tiny_lm import make_tiny_lm

from p3o.envs.base import EnvLimits
from p3o.envs.runner import EPISODE_STATS, EpisodeEngine
from p3o.logprobs import token_logprobs
from p3o.metrics.monitor import OffPolicyMonitor
from p3o.objectives import ObjectiveInputs, get_objective
from p3o.rollout import HFEngine
from p3o.tasks.base import Problem


def test_token_in_token_out_and_masks() -> None:
    """The row is exactly turn 1 | OBS | turn 2 | OBS | turn 3 of the engine's own ids; mask = model tokens only; the
    recorded log-probs equal the trainer's (fp32) at every model token, with observations read as context."""
    model = make_tiny_lm()
    rec = Recording(HFEngine(model, None, max_new_tokens=6, seed=0))
    ro = scripted_episodes(rec)
    assert len(ro) == 4 and ro.multi_turn
    check_token_in_token_out(ro, rec.calls)
    done = ro.extras["stop_done"] == 1  # the scripted environment pays 1.0 on its third step, which ends the episode
    assert ro.rewards.tolist() == done.float().tolist() and (ro.extras["turns"][done] == 3).all()
    assert (ro.extras["stop_done"] + ro.extras["stop_turn_length"] + ro.extras["stop_length"] == 1).all()
    assert set(EPISODE_STATS) <= set(ro.extras)
    lp, _ = token_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.response_ids, ro.attn, loss_mask=ro.mask)
    torch.testing.assert_close(lp[ro.mask], ro.rollout_logp[ro.mask], atol=1e-5, rtol=0)
    assert (lp[~ro.mask] == 0).all()


def test_observation_tokens_get_no_gradient_and_stay_out_of_ess_and_monitor() -> None:
    """Perturbing what sits at observation positions (their log-probs, their recorded log-probs) changes neither the
    loss, its gradient, P3O's ESS nor the monitor; the loss's gradient at observation positions is exactly 0."""
    model = make_tiny_lm()
    ro = scripted_episodes(HFEngine(model, None, max_new_tokens=6, seed=0))
    obs = ro.attn & ~ro.mask
    assert obs.any()
    torch.manual_seed(0)
    base = ro.rollout_logp + 0.3 * torch.randn_like(ro.rollout_logp) * ro.mask  # an off-policy trainer
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])

    def run(junk: float):
        logp = torch.where(obs, torch.full_like(base, junk), base).requires_grad_()
        rollout = torch.where(obs, torch.full_like(base, -junk), ro.rollout_logp)
        loss, stats = get_objective("p3o")(
            ObjectiveInputs(logp=logp, rollout_logp=rollout, mask=ro.mask, advantages=adv, num_tokens=ro.mask.sum())
        )
        loss.backward()
        mon = OffPolicyMonitor()
        row = mon.update(logp.detach(), rollout, ro.mask, ro.policy_version, step=1)
        return float(loss.detach()), logp.grad, float(stats["ess"]), row

    l1, g1, e1, m1 = run(0.0)
    l2, g2, e2, m2 = run(5.0)
    assert l1 == l2 and e1 == e2 and e1 < 1.0
    assert torch.equal(g1, g2) and (g1[obs] == 0).all()
    assert {k: v for k, v in m1.items() if k != "time"} == {k: v for k, v in m2.items() if k != "time"}


def test_weight_push_mid_episode_two_versions_in_one_row() -> None:
    """A push between turns stamps the later turns with the new version: one row holds versions 0 and 1, and every
    token's recorded log-prob is the one of the weights that sampled it (ratio 1 under its own weights)."""
    model = make_tiny_lm(seed=0)
    newer = make_tiny_lm(seed=1)
    engine = HFEngine(model, None, max_new_tokens=6, seed=0)

    def push(tick: int) -> None:
        if tick == 1:
            engine.load_weights(newer.state_dict(), version=1)

    ro = scripted_episodes(engine, on_tick=push)
    versions = [set(ro.policy_version[i][ro.mask[i]].tolist()) for i in range(len(ro))]
    assert any(v == {0, 1} for v in versions), versions
    assert ro.extras["versions"].max() == 2
    old = ro.mask & (ro.policy_version == 0)
    new = ro.mask & (ro.policy_version == 1)
    args = (ro.prompt_ids, ro.prompt_mask, ro.response_ids, ro.attn)
    lp_old, _ = token_logprobs(model, *args, loss_mask=ro.mask)
    lp_new, _ = token_logprobs(newer, *args, loss_mask=ro.mask)
    torch.testing.assert_close(ro.rollout_logp[old], lp_old[old], atol=1e-5, rtol=0)
    torch.testing.assert_close(ro.rollout_logp[new], lp_new[new], atol=1e-5, rtol=0)
    # the trainer at version 1: ratios exactly 1 on version-1 tokens, π_new/π_old on version-0 tokens
    ratio = torch.exp(lp_new - ro.rollout_logp)
    torch.testing.assert_close(ratio[new], torch.ones_like(ratio[new]), atol=1e-4, rtol=0)
    torch.testing.assert_close(ratio[old], torch.exp(lp_new[old] - lp_old[old]), atol=1e-4, rtol=1e-4)
    assert not torch.allclose(ratio[old], torch.ones_like(ratio[old]), atol=1e-3)


def test_episode_engine_is_a_rollout_engine() -> None:
    """EpisodeEngine passes weights, versions and the in-flight hook to its engine and finds problems by prompt."""
    model = make_tiny_lm()
    inner = HFEngine(model, None, max_new_tokens=6, seed=0)
    renderer = IdsRenderer()
    problems = {tuple(renderer.prompt_ids([{"content": p}])): Problem(prompt=p, answer=a) for p, a in [("abc", "1")]}
    eng = EpisodeEngine(
        inner,
        ScriptedEnv,
        problems,
        renderer=renderer,
        limits=EnvLimits(max_turns=2, max_turn_tokens=4, max_total_tokens=32),
        eos_ids=[2],
        stop_ids=STOPS,
    )
    eng.load_weights(make_tiny_lm(seed=2).state_dict(), version=5)
    assert eng.version == inner.version == 5
    hook = lambda t: None  # noqa: E731
    eng.on_decode_step = hook
    assert inner.on_decode_step is hook
    ro = eng.generate([list(next(iter(problems)))], 3, seed=0, answers=["1"])
    assert len(ro) == 3 and (ro.policy_version[ro.mask] == 5).all()
    assert ro.extras["turns"].max() <= 2
