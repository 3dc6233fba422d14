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
import traceback
from collections.abc import Callable

import torch

import p3o.integrations.verl as plugin
from p3o.objectives import ObjectiveInputs, get_objective
from p3o.objectives.core import _ess
from p3o.objectives.losses import p3o_token_loss

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


@check
def rollout_is_weights_multiply_the_token_loss() -> None:
    from verl.trainer.ppo.core_algos import agg_loss, get_policy_loss_fn

    b = batch(seed=4)
    mask = b["response_mask"]
    w = torch.rand(mask.shape, generator=torch.Generator().manual_seed(5)) * 2 * mask
    w[0, 1] = 0.0  # a rejected token (IcePop-style zero weight)
    lr = (b["log_prob"] - b["old_log_prob"]).masked_fill(~mask, 0.0)
    loss_mat = p3o_token_loss(b["log_prob"], lr, b["advantages"], _ess(lr, mask)[0]) * w
    got, _ = get_policy_loss_fn("p3o")(**b, loss_agg_mode="token-mean", config=None, rollout_is_weights=w)
    want = agg_loss(loss_mat=loss_mat, loss_mask=mask, loss_agg_mode="token-mean")
    close(got, want, "loss")
    close(grad_of(got, b["log_prob"]), grad_of(want, b["log_prob"]), "grad")


@check
def verl_ppo_loss_call_site() -> None:
    """verl's own per-micro-batch call (verl.workers.utils.losses.ppo_loss) with policy_loss.loss_mode=p3o."""
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu
    from verl.workers.config import FSDPActorConfig, PolicyLossConfig
    from verl.workers.utils.losses import ppo_loss

    cfg = FSDPActorConfig(
        strategy="fsdp", ppo_micro_batch_size_per_gpu=2, rollout_n=1, policy_loss=PolicyLossConfig(loss_mode="p3o")
    )
    g = torch.Generator().manual_seed(6)
    n, p, t = 3, 4, 5
    response_mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 1, 0]])
    prompt_mask = torch.ones(n, p, dtype=torch.long)
    prompt_mask[1, :2] = 0
    attention_mask = torch.cat([prompt_mask, response_mask], 1)
    old = -torch.rand(n, t, generator=g) * 2
    adv = torch.randn(n, 1, generator=g).expand(n, t).clone()
    data = TensorDict(
        {
            "prompts": torch.randint(3, 50, (n, p), generator=g),
            "responses": torch.randint(3, 50, (n, t), generator=g),
            "attention_mask": attention_mask,
            "response_mask": response_mask,
            "old_log_probs": old,
            "advantages": adv,
        },
        batch_size=[n],
    )
    n_tok = int(response_mask.sum())
    tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=2 * n_tok, global_batch_size=2 * n)  # 2 micro-batches
    # the model's log-probs without padding: one value per real token, response token k of a row at the position
    # that predicts it (verl left-shifts by one), built by placing the wanted (N, T) values there
    logp_want = (old + 0.3 * torch.randn(n, t, generator=g)).masked_fill(response_mask == 0, 0.0)
    flat = []
    for i in range(n):
        plen, rlen = int(prompt_mask[i].sum()), int(response_mask[i].sum())
        row = torch.zeros(plen + rlen)
        row[plen - 1 : plen - 1 + rlen] = logp_want[i, :rlen]
        flat.append(row)
    logp_flat = torch.cat(flat).requires_grad_()
    loss, metrics = ppo_loss(cfg, {"log_probs": logp_flat}, data)
    value = {k: (m.values[0] if hasattr(m, "values") else m) for k, m in metrics.items()}
    inputs = ObjectiveInputs(logp_want, old, response_mask.bool(), adv, num_tokens=2 * n_tok)
    want, stats = get_objective("p3o")(inputs)
    close(loss.detach(), want.detach(), "pg_loss")
    assert abs(float(value["actor/objective/ess"]) - stats["ess"].item()) < 1e-6, value["actor/objective/ess"]
    assert stats["ess"] < 1
    loss.backward()
    assert logp_flat.grad is not None and logp_flat.grad.abs().sum() > 0


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
    os.environ[plugin.ENV_KWARGS] = '{"clip_eps_high": 0.5}'
    try:
        got, _ = get_policy_loss_fn("minpro")(**b, loss_agg_mode="token-mean", config=None)
    finally:
        del os.environ[plugin.ENV_KWARGS]
    inputs = ObjectiveInputs(b["log_prob"], b["old_log_prob"], b["response_mask"], b["advantages"])
    close(got, get_objective("minpro")(inputs, clip_eps_high=0.5)[0], "minpro clip_eps_high=0.5")
    default, _ = get_policy_loss_fn("minpro")(**b, loss_agg_mode="token-mean", config=None)
    assert not torch.allclose(got, default)


def main(names: list[str]) -> int:
    failed = 0
    for name in names or list(CHECKS):
        try:
            CHECKS[name]()
            print(f"PASS {name}", flush=True)
        except Exception as e:  # report every check, then fail
            failed += 1
            detail = traceback.format_exc().strip().splitlines()[-3:]
            print(f"FAIL {name}: {type(e).__name__}: {e} | {' | '.join(detail)}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
