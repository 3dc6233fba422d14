"""The synthetic instrument's settings: :class:`SyntheticConfig` and the parsers of regime and objective specs
(a regime name of :data:`p3o.experiments.grid.regimes.REGIMES` means here what it means to ``p3o train``)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

from p3o.errors import ConfigError
from p3o.experiments.grid.regimes import OBJECTIVE_PRESETS, REGIMES, regime_overrides
from p3o.objectives import get_objective
from p3o.options import config_field


@dataclass
class SyntheticKnobs:
    """The settings of a synthetic cell that ``p3o synthetic`` takes as options: each declared once, here, with its
    help text and bounds (:func:`p3o.options.config_field`); ``SyntheticOptions`` inherits them."""

    seeds: int = config_field(16, "seeds per cell (paired across cells)", ge=1)
    seed_offset: int = config_field(0, "first seed (seeds seed_offset .. seed_offset + seeds - 1)", ge=0)
    steps: int = config_field(200, "rollout batches per run", ge=1)
    lr: float = config_field(0.02, "learning rate", gt=0)
    optimizer: Literal["adam", "sgd"] = config_field("adam", "optimizer on the logits table")
    grad_clip: float = config_field(0.0, "per-seed gradient-norm clip (0: off)", ge=0)
    vocab: int = config_field(4, "tokens V", ge=2)
    length: int = config_field(8, "positions T", ge=1)
    prompts: int = config_field(2, "prompts P", ge=1)
    group: int = config_field(8, "samples per prompt per step G", ge=1)
    reward: Literal["threshold", "count"] = config_field("threshold", "1[hits >= threshold] or hits / T")
    threshold: int = config_field(3, "hits needed for reward 1 (reward threshold)", ge=0)
    init_scale: float = config_field(1.0, "σ_0 of the initial logits", ge=0)
    task_seed: int = config_field(0, "seed of the hidden targets", ge=0)


@dataclass
class SyntheticConfig(SyntheticKnobs):
    """One cell of the synthetic instrument: one objective, one regime, S seeds (vectorised).

    Problem (:class:`SyntheticKnobs`): ``vocab`` V, ``length`` T, ``prompts`` P, ``group`` G samples per prompt per
    step (a batch has N = P·G sequences), reward ``threshold`` (R = 1[hits ≥ k]) or ``count`` (R = hits/T),
    ``init_scale`` σ_0 of the initial logits θ_0 ∼ σ_0·N(0, 1); training ``lr``, ``optimizer`` (``adam``
    element-wise / ``sgd``), ``grad_clip`` (per-seed norm; 0 = off). Regime: ``mini_batches`` M, ``epochs`` E,
    ``lag`` L (updates), ``noise`` σ (engine logit noise), ``temperature`` T_s and ``logprob_mode``
    (``raw``/``processed``). Each field's help text says the rest.
    """

    objective: str = config_field("p3o", "objective name (p3o.objectives)")
    hyper: dict[str, Any] = field(default_factory=dict, metadata={"help": "the objective's keyword hyper-parameters"})
    seed_ids: list[int] | None = config_field(  # noqa: RUF009 - the default, None, is immutable
        None, "explicit distinct seeds (null: seed_offset .. seed_offset + seeds - 1)"
    )
    betas: tuple[float, float] = config_field((0.9, 0.999), "Adam's betas")
    advantage: dict[str, Any] = field(
        default_factory=dict, metadata={"help": "keywords of p3o.advantages.group_advantages"}
    )
    mini_batches: int = config_field(1, "mini-batches M per batch", ge=1)
    epochs: int = config_field(1, "epochs E over each batch", ge=1)
    lag: int = config_field(0, "lag L: the batch is sampled L optimizer updates ago", ge=0)
    noise: float = config_field(0.0, "σ of the engine's logit noise", ge=0)
    temperature: float = config_field(1.0, "sampling temperature T_s of the engine", gt=0)
    logprob_mode: Literal["raw", "processed"] = config_field("raw", "log-probs the engine records")
    save_params: bool = config_field(False, "keep θ after every update (for the probe)")
    per_seed_curves: bool = config_field(True, "keep each seed's curves in the result")
    threads: int = config_field(
        1, "torch intra-op threads during the run (1 is fastest for these tiny tensors; 0 leaves the setting)", ge=0
    )

    def seed_list(self) -> list[int]:
        """The seeds of this cell: ``seed_ids`` when given, else seed_offset, ..., seed_offset + seeds − 1."""
        if self.seed_ids is not None:
            return [int(s) for s in self.seed_ids]
        return list(range(self.seed_offset, self.seed_offset + self.seeds))

    def validate(self) -> None:
        """Raise ConfigError on an impossible setting."""
        if self.seed_ids is not None and (not self.seed_ids or len(set(self.seed_ids)) != len(self.seed_ids)):
            raise ConfigError(f"synthetic.seed_ids: expected distinct seeds, got {self.seed_ids!r}")
        if self.vocab < 2 or self.length < 1 or self.prompts < 1 or self.group < 1 or self.seeds < 1:
            raise ConfigError("synthetic: vocab >= 2, length, prompts, group and seeds >= 1 required")
        if self.reward not in ("threshold", "count"):
            raise ConfigError(f"synthetic.reward: unknown {self.reward!r}; valid: threshold, count")
        if self.logprob_mode not in ("raw", "processed"):
            raise ConfigError(f"synthetic.logprob_mode: unknown {self.logprob_mode!r}; valid: raw, processed")
        if self.optimizer not in ("adam", "sgd"):
            raise ConfigError(f"synthetic.optimizer: unknown {self.optimizer!r}; valid: adam, sgd")
        n = self.prompts * self.group
        if not 1 <= self.mini_batches <= n or self.epochs < 1 or self.lag < 0:
            raise ConfigError(f"synthetic: need 1 <= mini_batches <= P·G = {n}, epochs >= 1, lag >= 0")
        if self.temperature <= 0 or self.noise < 0:
            raise ConfigError("synthetic: temperature > 0 and noise >= 0 required")
        get_objective(self.objective)  # unknown name -> ObjectiveError


def parse_regime(spec: str) -> dict[str, Any]:
    """Knob overrides of a regime: a name of :data:`p3o.experiments.grid.regimes.REGIMES` or ``+``-joined knobs.

    Knobs: ``on-policy`` (nothing), ``mb<M>`` (M mini-batches), ``ep<E>`` (E epochs), ``lag-<L>`` (the batch is
    sampled L optimizer updates ago), ``stale-<n>`` (n batches ago, as ``loop.staleness``: L = n·M·E), ``noise-<σ>``,
    ``temp-<T>`` (raw T = 1 log-probs recorded) or ``temp-<T>-processed``. Example: ``mb4+lag-8+noise-0.2`` →
    {"mini_batches": 4, "lag": 8, "noise": 0.2}; ``mb4+stale-2`` → {"mini_batches": 4, "lag": 8}. A regime name
    means here what it means to ``p3o train`` (:func:`regime_knobs`).
    """
    if spec in REGIMES:
        return regime_knobs(spec)
    out: dict[str, Any] = {}
    batches = 0
    for knob in filter(None, spec.split("+")):
        if knob == "on-policy":
            continue
        if m := re.fullmatch(r"mb(\d+)", knob):
            out["mini_batches"] = int(m[1])
        elif m := re.fullmatch(r"ep(\d+)", knob):
            out["epochs"] = int(m[1])
        elif m := re.fullmatch(r"lag-(\d+)", knob):
            out["lag"] = int(m[1])
        elif m := re.fullmatch(r"stale-(\d+)", knob):
            batches = int(m[1])
        elif m := re.fullmatch(r"noise-([0-9.eE+-]+)", knob):
            out["noise"] = float(m[1])
        elif m := re.fullmatch(r"temp-([0-9.eE+-]+?)(-processed)?", knob):
            out["temperature"] = float(m[1])
            out["logprob_mode"] = "processed" if m[2] else "raw"
        else:
            raise ConfigError(
                f"synthetic regime: unknown knob {knob!r} in {spec!r}; knobs: mb<M>, ep<E>, lag-<L>, stale-<n>, "
                f"noise-<s>, temp-<T>[-processed]; named: {', '.join(REGIMES)}"
            )
    if batches:
        if "lag" in out:
            raise ConfigError(f"synthetic regime {spec!r}: give the delay once, as lag-<L> (updates) or stale-<n>")
        out["lag"] = batches * out.get("mini_batches", 1) * out.get("epochs", 1)
    return out


#: The train-config keys a named regime may set, and the synthetic knob each one becomes.
_TRANSLATABLE = {
    "loop.mode",
    "loop.staleness",
    "loop.max_lag",
    "update.num_mini_batches",
    "update.epochs",
    "rollout.temperature",
    "train.temperature",
    "rollout.logprob_mode",
}


def regime_knobs(name: str) -> dict[str, Any]:
    """The synthetic knobs of regime ``name`` of :data:`p3o.experiments.grid.regimes.REGIMES` (one table, one meaning).

    ``update.num_mini_batches`` M and ``update.epochs`` E are mini-batches and epochs; ``loop.mode: stale`` with
    ``loop.staleness`` n, and ``async`` with ``loop.max_lag`` n (its deterministic schedule: batch b is generated by
    version b − n), delay every batch by n batches = n·M·E optimizer updates; ``rollout.temperature`` T with raw
    log-probs is ``temp-<T>``. A regime with no synthetic counterpart (a real engine, a rollout precision) is a
    ConfigError naming the knob to use instead (``noise-<σ>`` for a low-precision engine).
    """
    over = regime_overrides(name)
    other = sorted(set(over) - _TRANSLATABLE)
    if other or float(over.get("train.temperature", 1.0)) != 1.0:
        raise ConfigError(
            f"synthetic regime {name!r}: {', '.join(other) or 'train.temperature'} has no counterpart on the toy "
            "policy; use its knobs (noise-<s> for a low-precision engine)"
        )
    m, e = int(over.get("update.num_mini_batches", 1)), int(over.get("update.epochs", 1))
    out: dict[str, Any] = {}
    if m != 1:
        out["mini_batches"] = m
    if e != 1:
        out["epochs"] = e
    n = {"stale": over.get("loop.staleness", 0), "async": over.get("loop.max_lag", 0)}.get(over["loop.mode"], 0)
    if n:
        out["lag"] = int(n) * m * e
    if "rollout.temperature" in over:
        out["temperature"] = float(over["rollout.temperature"])
        out["logprob_mode"] = "processed" if over.get("rollout.logprob_mode") == "processed" else "raw"
    return out


def _coerce(value: str) -> Any:
    low = value.lower()
    if low in ("none", "null"):
        return None
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return value


def parse_objective(spec: str) -> tuple[str, dict[str, Any]]:
    """(objective name, hyper-parameters) of a spec: ``name[:key=value[:key=value...]]`` or a preset of
    :data:`p3o.experiments.grid.regimes.OBJECTIVE_PRESETS` (e.g. ``grpo-0.4``), optionally followed by ``:key=value``.

    Example: ``grpo:clip_eps=0.4:agg=token-mean`` → ("grpo", {"clip_eps": 0.4, "agg": "token-mean"}).
    """
    head, *kvs = spec.split(":")
    hyper: dict[str, Any] = {}
    name = head
    preset = OBJECTIVE_PRESETS.get(head)
    if preset is not None:
        name = preset["objective.name"]
        hyper = {k.split(".", 1)[1]: v for k, v in preset.items() if k != "objective.name"}
    for kv in kvs:
        if "=" not in kv:
            raise ConfigError(f"synthetic objective spec {spec!r}: expected key=value, got {kv!r}")
        k, v = kv.split("=", 1)
        hyper[k] = _coerce(v)
    get_objective(name)
    return name, hyper
