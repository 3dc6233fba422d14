"""Checks of the verl plug-in that run INSIDE .venv-verl (verl 0.9.1), against verl's own code.

tests/integrations/test_verl.py runs this file with ``.venv-verl/bin/python`` (created by scripts/verl_env.sh) and
reports each check as a test. By hand::

    .venv-verl/bin/python tests/integrations/verl_checks.py [check ...]

Prints ``PASS <check>`` or ``FAIL <check>: <error>`` per check; exit code 1 when any failed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))  # tests/
from venv_checks import run_named_checks

import p3o.integrations.verl as plugin
from p3o.objectives import ObjectiveInputs, get_objective, p3o_token_loss
from p3o.objectives.core import _ess

CHECKS: dict[str, Callable[[], None]] = {}


def check(fn: Callable[[], None]) -> Callable[[], None]:
    CHECKS[fn.__name__] = fn
    return fn


def batch(n: int = 5, t: int = 7, seed: int = 0, spread: float = 0.4) -> dict[str, torch.Tensor]:
    """Random (N, T) log-probs with ragged response masks (one row empty) and token-level advantages."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(n, t, generator=g) * 3
    logp = (old + spread * torch.randn(n, t, generator=g)).requires_grad_()
    lengths = torch.tensor([t, 3, 0, 5, 1, 6, 2, 4][:n])
    mask = torch.arange(t)[None, :] < lengths[:, None]
    adv = torch.randn(n, generator=g)[:, None].expand(n, t).clone()  # verl broadcasts A over the response
    return {"old_log_prob": old, "log_prob": logp, "advantages": adv, "response_mask": mask}


def grad_of(loss: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    (g,) = torch.autograd.grad(loss, x, retain_graph=True)
    return g


def close(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=lambda m: f"{what}: {m}")


class Config(dict):
    """The bits of verl's ActorConfig a policy loss reads (``global_batch_info``), as a Mapping."""


@check
def registered() -> None:
    from verl.trainer.ppo import core_algos

    for name in plugin.LOSS_MODES:
        assert core_algos.get_policy_loss_fn(name).__name__.startswith("p3o_policy_loss_"), name
    for verl_own in ("vanilla", "gspo", "cispo"):  # verl's built-ins are left alone
        assert core_algos.get_policy_loss_fn(verl_own).__module__ == "verl.trainer.ppo.core_algos", verl_own


@check
def objectives_match_p3o_library() -> None:
    """verl's get_policy_loss_fn(name) on tensors == p3o.objectives on the same tensors (loss and gradient)."""
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    for mode, objective in [("p3o", "p3o"), ("minpro", "minpro"), ("m2po", "m2po"), ("p3o_cispo", "cispo")]:
        b = batch(seed=1, spread=0.6)
        loss, metrics = get_policy_loss_fn(mode)(**b, loss_agg_mode="token-mean", config=None)
        inputs = ObjectiveInputs(b["log_prob"], b["old_log_prob"], b["response_mask"], b["advantages"])
        want, stats = get_objective(objective)(inputs)
        close(loss, want, f"{mode} loss")
        close(grad_of(loss, b["log_prob"]), grad_of(want, b["log_prob"]), f"{mode} grad")
        assert metrics["actor/objective/ess"] == stats["ess"].item(), mode
        assert isinstance(metrics["actor/ppo_kl"], float) and "actor/pg_clipfrac" in metrics
    assert metrics is not None


@check
def p3o_off_policy_is_capped_by_the_ess() -> None:
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    b = batch(seed=2, spread=1.0)
    _, metrics = get_policy_loss_fn("p3o")(**b, loss_agg_mode="token-mean", config=None)
    assert 0 < metrics["actor/objective/ess"] < 0.9, metrics
    assert abs(metrics["actor/objective/kl_weight"] - (1 - metrics["actor/objective/ess"])) < 1e-6
    assert metrics["actor/objective/capped_frac"] > 0


@check
def every_verl_agg_mode_matches_verl_agg_loss() -> None:
    """With dp_size=2 and the global batch info verl sets, the loss equals verl's own agg_loss of P3O's (N, T)."""
    from verl.trainer.ppo.core_algos import agg_loss, get_policy_loss_fn

    b = batch(seed=3)
    mask = b["response_mask"]
    lr = (b["log_prob"] - b["old_log_prob"]).masked_fill(~mask, 0.0)
    ess = _ess(lr, mask)[0]
    loss_mat = p3o_token_loss(b["log_prob"], lr, b["advantages"], ess)
    for info in (
        {"dp_size": 2, "batch_num_tokens": 40, "global_batch_size": 11, "loss_scale_factor": 9},
        {"dp_size": 1, "batch_num_tokens": None, "global_batch_size": None, "loss_scale_factor": None},
    ):
        for mode in plugin.VERL_AGG_MODES:
            got, _ = get_policy_loss_fn("p3o")(**b, loss_agg_mode=mode, config=Config(global_batch_info=info))
            want = agg_loss(loss_mat=loss_mat, loss_mask=mask, loss_agg_mode=mode, **info)
            close(got, want, f"{mode} {info}")
            close(grad_of(got, b["log_prob"]), grad_of(want, b["log_prob"]), f"{mode} grad")


def ppo_batch(
    seed: int, mismatch: float = 0.0
) -> tuple[dict[str, torch.Tensor], torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
    """A batch as verl's trainer hands it to the actor: prompts, responses, masks, π_old (``old_log_probs``), the
    rollout engine's log-probs π_rollout = π_old + mismatch noise (``rollout_log_probs``), advantages. Returns the
    tensors, the model's (N, T) log-probs (a leaf with grad) and ``to_flat``, which lays (N, T) log-probs out the way
    verl's model output holds them (no padding, response token k of a row at the position that predicts it: verl
    left-shifts by one), differentiably, so gradients can be compared on the (N, T) leaf."""
    g = torch.Generator().manual_seed(seed)
    n, p, t = 4, 4, 6
    response_mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0]])
    prompt_mask = torch.ones(n, p, dtype=torch.long)
    prompt_mask[1, :2] = 0
    old = -torch.rand(n, t, generator=g) * 2
    rollout = old + mismatch * torch.randn(n, t, generator=g)
    adv = torch.randn(n, 1, generator=g).expand(n, t).clone()
    tensors = {
        "prompts": torch.randint(3, 50, (n, p), generator=g),
        "responses": torch.randint(3, 50, (n, t), generator=g),
        "attention_mask": torch.cat([prompt_mask, response_mask], 1),
        "response_mask": response_mask,
        "old_log_probs": old,
        "rollout_log_probs": rollout,
        "advantages": adv,
    }
    logp = (old + 0.3 * torch.randn(n, t, generator=g)).masked_fill(response_mask == 0, 0.0).requires_grad_()

    def to_flat(x: torch.Tensor) -> torch.Tensor:
        rows = []
        for i in range(n):
            plen, rlen = int(prompt_mask[i].sum()), int(response_mask[i].sum())
            rows += [x.new_zeros(plen - 1), x[i, :rlen], x.new_zeros(1)]
        return torch.cat(rows)

    return tensors, logp, to_flat


def call_ppo_loss(
    loss_mode: str, tensors: dict[str, torch.Tensor], logp: torch.Tensor, to_flat: Callable, weights: Any = None
) -> tuple[torch.Tensor, dict[str, float]]:
    """verl's own per-micro-batch call (verl.workers.utils.losses.ppo_loss) with policy_loss.loss_mode=loss_mode,
    as one of two equal micro-batches of a dp_size=1 step (batch_num_tokens, global_batch_size of the step)."""
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu
    from verl.workers.config import FSDPActorConfig, PolicyLossConfig
    from verl.workers.utils.losses import ppo_loss

    cfg = FSDPActorConfig(
        strategy="fsdp", ppo_micro_batch_size_per_gpu=2, rollout_n=1, policy_loss=PolicyLossConfig(loss_mode=loss_mode)
    )
    fields = {k: v for k, v in tensors.items() if k != "rollout_log_probs"}  # the actor never sees them
    if weights is not None:
        fields["rollout_is_weights"] = weights
    data = TensorDict(fields, batch_size=[logp.shape[0]])
    n_tok = int(tensors["response_mask"].sum())
    tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=2 * n_tok, global_batch_size=2 * logp.shape[0])
    loss, metrics = ppo_loss(cfg, {"log_probs": to_flat(logp)}, data)
    return loss, {k: float(m.values[0] if hasattr(m, "values") else m) for k, m in metrics.items()}


def verl_weights(tensors: dict[str, torch.Tensor], **rollout_correction: Any) -> torch.Tensor:
    """rollout_is_weights as verl's trainer computes them (compute_rollout_correction_and_add_to_batch, the
    decoupled-mode path of ray_trainer) from ``algorithm.rollout_correction`` settings."""
    from verl.protocol import DataProto
    from verl.trainer.config.algorithm import RolloutCorrectionConfig
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch

    keys = ("old_log_probs", "rollout_log_probs", "response_mask")
    batch = DataProto.from_dict(tensors={k: tensors[k].clone() for k in keys})
    batch, _ = compute_rollout_correction_and_add_to_batch(batch, RolloutCorrectionConfig(**rollout_correction))
    return batch.batch["rollout_is_weights"]


def caught(fn: Callable[[], Any]) -> tuple[Any, list[str]]:
    """fn()'s result and the RolloutWeightsWarning messages it issued (the once-per-kind memory cleared first)."""
    import warnings

    plugin._WARNED.clear()
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        out = fn()
    return out, [str(w.message) for w in got if issubclass(w.category, plugin.RolloutWeightsWarning)]


@check
def exact_rollout_is_settings_parse() -> None:
    """The documented settings, as a command line gives them, reach verl's threshold parser as +inf (no cap)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from verl.trainer.config.algorithm import RolloutCorrectionConfig
    from verl.trainer.ppo.rollout_corr_helper import _parse_rollout_is_threshold

    value = OverridesParser.create().parse_override("algorithm.rollout_correction.rollout_is_threshold=inf").value()
    cfg = RolloutCorrectionConfig(rollout_is="token", rollout_is_threshold=value)
    assert _parse_rollout_is_threshold(cfg.rollout_is_threshold) == (float("inf"), None), value


@check
def untruncated_weights_fold_into_the_ratio() -> None:
    """verl's ppo_loss with rollout_is_weights from rollout_is=token, rollout_is_threshold=inf == the p3o
    objective called with π_rollout as rollout_logp directly: loss, gradient and ESS, for every loss mode."""
    import math

    tensors, logp, to_flat = ppo_batch(seed=8, mismatch=0.5)
    w = verl_weights(tensors, rollout_is="token", rollout_is_threshold=math.inf)
    mask = tensors["response_mask"].bool()
    assert ((w - 1).abs() > 0.2)[mask].any()  # a real mismatch
    n_tok = int(mask.sum())
    for mode, objective in plugin.LOSS_MODES.items():
        (got, metrics), warned = caught(lambda m=mode: call_ppo_loss(m, tensors, logp, to_flat, w))
        assert not warned, warned
        rollout, old = tensors["rollout_log_probs"], tensors["old_log_probs"]
        inputs = ObjectiveInputs(logp, rollout, mask, tensors["advantages"], prox_logp=old, num_tokens=2 * n_tok)
        want, stats = get_objective(objective)(inputs, agg="token-mean")
        close(got, want, f"{mode} loss")
        close(grad_of(got, logp), grad_of(want, logp), f"{mode} grad")
        assert abs(metrics["actor/objective/ess"] - stats["ess"].item()) < 1e-6, (mode, metrics, stats["ess"])
        assert metrics["actor/objective/rollout_is_folded_frac"] == 1.0, mode
    _, plain = call_ppo_loss("p3o", tensors, logp, to_flat)  # no weights: the ratio against π_old
    folded = call_ppo_loss("p3o", tensors, logp, to_flat, w)[1]
    assert abs(plain["actor/objective/ess"] - folded["actor/objective/ess"]) > 1e-2  # the test can tell them apart


@check
def truncated_masked_and_sequence_weights_warn_once() -> None:
    """Weights that cannot give the exact ratio: each kind warns once and acts as documented."""
    from verl.trainer.ppo.core_algos import agg_loss

    tensors, logp, to_flat = ppo_batch(seed=9, mismatch=0.8)
    mask = tensors["response_mask"].bool()
    old, adv = tensors["old_log_probs"], tensors["advantages"]
    n_tok = int(mask.sum())

    def p3o_oracle(rollout_logp: torch.Tensor, multiplier: torch.Tensor) -> torch.Tensor:
        lr = (logp - rollout_logp).masked_fill(~mask, 0.0)
        loss_mat = p3o_token_loss(logp, lr, adv, _ess(lr, mask)[0]) * multiplier
        return agg_loss(
            loss_mat=loss_mat, loss_mask=mask, loss_agg_mode="token-mean", dp_size=1, batch_num_tokens=2 * n_tok
        )

    # TIS (verl's default threshold 2.0): folded as min(w, 2)
    w = verl_weights(tensors, rollout_is="token", rollout_is_threshold=2.0)
    assert (w[mask] == 2.0).any()
    (got, _), warned = caught(lambda: [call_ppo_loss("p3o", tensors, logp, to_flat, w) for _ in range(2)][-1])
    assert len(warned) == 1 and "truncated" in warned[0] and "rollout_is_threshold=inf" in warned[0], warned
    close(got, p3o_oracle(old - torch.log(w.clamp(min=1e-30)), torch.ones_like(w)), "TIS loss")
    # IcePop: zero weights multiply their token's loss by 0, the others are folded
    w = verl_weights(tensors, rollout_is="token", rollout_is_threshold="0.5_5.0")
    zero = mask & (w == 0)
    assert zero.any() and (mask & (w > 0)).any()
    (got, metrics), warned = caught(lambda: call_ppo_loss("p3o", tensors, logp, to_flat, w))
    assert len(warned) == 1 and "0 at" in warned[0], warned
    rollout = torch.where(zero, old, old - torch.log(w.clamp(min=1e-30)))
    want = p3o_oracle(rollout, (~zero).float())
    close(got, want, "IcePop loss")
    close(grad_of(got, logp), grad_of(want, logp), "IcePop grad")
    frac = metrics["actor/objective/rollout_is_folded_frac"]
    assert abs(frac - (mask & (w > 0)).sum().item() / n_tok) < 1e-6, frac
    # sequence-level weights: verl's semantics (a multiplier), the ratio stays against π_old
    w = verl_weights(tensors, rollout_is="sequence", rollout_is_threshold=float("inf"))
    (got, _), warned = caught(lambda: call_ppo_loss("p3o", tensors, logp, to_flat, w))
    assert len(warned) == 1 and "sequence" in warned[0], warned
    close(got, p3o_oracle(old, w), "sequence loss")


@check
def verl_ppo_loss_call_site() -> None:
    """verl's own per-micro-batch call (verl.workers.utils.losses.ppo_loss) with policy_loss.loss_mode=p3o and no
    rollout weights: the p3o objective against π_old (old_log_probs), loss, gradient and ESS."""
    tensors, logp, to_flat = ppo_batch(seed=6)
    mask = tensors["response_mask"].bool()
    loss, metrics = call_ppo_loss("p3o", tensors, logp, to_flat)
    n_tok = int(mask.sum())
    inputs = ObjectiveInputs(logp, tensors["old_log_probs"], mask, tensors["advantages"], num_tokens=2 * n_tok)
    want, stats = get_objective("p3o")(inputs)
    close(loss, want, "pg_loss")
    close(grad_of(loss, logp), grad_of(want, logp), "grad")
    assert abs(metrics["actor/objective/ess"] - stats["ess"].item()) < 1e-6, metrics["actor/objective/ess"]
    assert stats["ess"] < 1 and "actor/objective/rollout_is_folded_frac" not in metrics
    # the off-policy monitor's keys ride along (same tokens, same ratio: the same ESS), without lags (verl has none)
    assert abs(metrics["actor/offpolicy/ess"] - stats["ess"].item()) < 1e-6, metrics["actor/offpolicy/ess"]
    assert metrics["actor/offpolicy/tokens"] == n_tok and "actor/offpolicy/dlogp_pos_0" in metrics
    assert "actor/offpolicy/finding_low_ess" in metrics and not any("lag" in k for k in metrics if "offpolicy" in k)
    assert not any("stale" in k for k in metrics if "offpolicy" in k)  # no versions: no fresh / stale split
    # each finding's cause rides along too: 0 while it does not fire, 5 (undetermined: no lags) while it does
    causes = {k: v for k, v in metrics.items() if k.startswith("actor/offpolicy/cause_")}
    assert "actor/offpolicy/cause_low_ess" in causes and set(causes.values()) <= {0.0, 5.0}, causes
    fired = {k.rsplit("finding_", 1)[1] for k, v in metrics.items() if "offpolicy/finding_" in k and v == 1.0}
    assert all(causes[f"actor/offpolicy/cause_{n}"] == 5.0 for n in fired), (fired, causes)


@check
def verl_use_external_modules_imports_the_plugin() -> None:
    """A fresh process that only imports verl (as a worker does) gets the losses from VERL_USE_EXTERNAL_MODULES."""
    code = (
        "import sys, verl.trainer.ppo.core_algos as c; "
        "print('p3o' in c.POLICY_LOSS_REGISTRY, 'p3o.integrations.verl' in sys.modules)"
    )
    env = {**os.environ, "VERL_USE_EXTERNAL_MODULES": "p3o.integrations.verl", "VERL_USE_EXTERNAL_PLUGINS": "none"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split()[-2:] == ["True", "True"], out
    env.pop("VERL_USE_EXTERNAL_MODULES")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split()[-2:] == ["False", "False"], out  # without it nothing of p3o is loaded


@check
def env_kwargs_reach_the_objective() -> None:
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    b = batch(seed=7, spread=1.5)
    os.environ[plugin.ENV_KWARGS] = '{"trunc_eps_high": 0.5}'
    try:
        got, _ = get_policy_loss_fn("minpro")(**b, loss_agg_mode="token-mean", config=None)
    finally:
        del os.environ[plugin.ENV_KWARGS]
    inputs = ObjectiveInputs(b["log_prob"], b["old_log_prob"], b["response_mask"], b["advantages"])
    close(got, get_objective("minpro")(inputs, trunc_eps_high=0.5)[0], "minpro trunc_eps_high=0.5")
    default, _ = get_policy_loss_fn("minpro")(**b, loss_agg_mode="token-mean", config=None)
    assert not torch.allclose(got, default)


if __name__ == "__main__":
    sys.exit(run_named_checks(CHECKS, sys.argv[1:]))
