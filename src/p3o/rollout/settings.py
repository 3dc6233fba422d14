"""EngineSettings: how a rollout engine samples and what it records, as ONE record every engine and caller shares.

    settings = EngineSettings.from_config(cfg.rollout, seed=cfg.seed, device="auto")   # training's rollout engine
    engine = make_engine(settings, model, tokenizer)                                 # p3o.rollout.factory
    greedy = make_engine(dataclasses.replace(settings, temperature=0.0), model, tokenizer)
    HFEngine(model, tokenizer, settings)  ≡  HFEngine(model, tokenizer, precision="bf16", ...)  # fields as keywords

The record is built once (from ``cfg.rollout``, or from a command's options named like its fields: ``p3o eval``,
``p3o mismatch``) and checked once, when it is made: a bad value is a one-line `ConfigError` naming
``rollout.<field>`` before any model loads. What is not a sampling setting stays a keyword of the engine that has it
(stop / pad ids; HF: ``fast_decode``; vLLM: ``max_model_len``, ``llm_kwargs``).

It lives on the rollout floor and never imports `p3o.config`: `from_config` reads any object whose attributes are
named like the fields (duck-typed).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from p3o.errors import ConfigError
from p3o.rollout.base import check_sampling
from p3o.rollout.quant import PRECISIONS

__all__ = ["ENGINES", "KV_CACHE_DTYPES", "EngineSettings"]

ENGINES = ("hf", "vllm")
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
_NUMBERS: dict[str, type] = {
    "temperature": float,
    "top_p": float,
    "top_k": int,
    "max_new_tokens": int,
    "seed": int,
    "gpu_memory_utilization": float,
}
"""The numeric fields and the type the engines always converted them to."""


@dataclass(frozen=True)
class EngineSettings:
    """The settings a rollout engine takes (`p3o.rollout.base.RolloutEngine`), checked when the record is made."""

    engine: str = "hf"
    """Which engine `p3o.rollout.factory.make_engine` builds: "hf" (p3o's own sampler) or "vllm"."""
    precision: str = "fp32"
    """The engine copy's precision: "fp32" | "bf16" | "fp16" | "int8" | "fp8" | "fp8-tensor" (each engine refuses
    what it cannot run: vLLM has no int8 and no fp8-tensor, and its fp8 needs a GPU)."""
    temperature: float = 1.0
    """τ ≥ 0 (0 = greedy)."""
    top_p: float = 1.0
    """Nucleus mass in (0, 1] (1 = off)."""
    top_k: int = 0
    """Top-k ≥ 0 (0 = off)."""
    max_new_tokens: int = 64
    """Response length cap T; a row that reaches it without a stop token is truncated."""
    logprob_mode: str = "processed"
    """What is recorded: "processed", log q(y_t) of the distribution sampled from (after τ, top-k, top-p; 0 for
    greedy); "raw", log_softmax(z)[y_t] of the unscaled logits z (refused with a top-p / top-k truncation)."""
    seed: int = 0
    """Seeds the engine's own generator (used when `generate` gets no seed)."""
    device: str = "cpu"
    """Where the engine runs: "cpu", "cuda", "cuda:1", ... or "auto" (cuda when available, else cpu: the engine
    resolves it with `p3o.dist.resolve_device` when it is built)."""
    kv_cache_dtype: str = "auto"
    """vLLM only: "auto" (the model dtype) or an FP8 KV cache ("fp8", "fp8_e4m3", "fp8_e5m2")."""
    kv_cache_gib: float | None = None
    """vLLM only: KV-cache size in GiB on a CPU (None: ``$P3O_VLLM_KV_CACHE_GIB``, else 1)."""
    gpu_memory_utilization: float = 0.3
    """vLLM only: share of GPU memory vLLM may take (the trainer shares the device)."""
    replay_sampling_mask: bool | str = "auto"
    """Record the set each token was sampled from (`Rollouts.sampling_mask`) so the trainer takes its log-probs
    over it: "auto" / True = whenever the distribution is truncated (τ > 0 and top-p < 1 or top-k > 0), False =
    never (see `records_sampling_mask`)."""

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ConfigError(f"rollout.engine: unknown engine {self.engine!r}; known: {', '.join(ENGINES)}")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"rollout.precision: unknown {self.precision!r}; choose from {', '.join(PRECISIONS)}")
        check_sampling(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            max_new_tokens=self.max_new_tokens,
            logprob_mode=self.logprob_mode,
        )
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ConfigError(
                f"rollout.kv_cache_dtype: unknown {self.kv_cache_dtype!r}; choose from {', '.join(KV_CACHE_DTYPES)}"
            )
        if self.kv_cache_dtype != "auto" and self.engine != "vllm":
            raise ConfigError(
                "rollout.kv_cache_dtype: an FP8 KV cache needs rollout.engine vllm (HFEngine keeps its KV cache in "
                "the rollout precision)"
            )
        if self.replay_sampling_mask not in (True, False, "auto"):
            raise ConfigError(
                f"rollout.replay_sampling_mask: {self.replay_sampling_mask!r}; choose from auto, true, false"
            )
        for name, kind in _NUMBERS.items():  # the engines' own conversions, once: temperature 1 samples as 1.0
            object.__setattr__(self, name, kind(getattr(self, name)))
        object.__setattr__(self, "device", str(self.device))  # a torch.device as its name

    @property
    def truncates(self) -> bool:
        """Whether tokens are sampled from a truncated distribution: τ > 0 and top-p < 1 or top-k > 0."""
        return self.temperature > 0 and (self.top_p < 1.0 or self.top_k > 0)

    @property
    def records_sampling_mask(self) -> bool:
        """Whether the engine records each token's kept set: `replay_sampling_mask` resolved ("auto": when it
        `truncates`; with no truncation there is nothing to replay)."""
        return self.replay_sampling_mask is not False and self.truncates

    @classmethod
    def fields_of(cls, source: Any) -> dict[str, Any]:
        """{field: value} for every field `source` has as an attribute and does not leave None."""
        given = {f.name: getattr(source, f.name, None) for f in dataclasses.fields(cls)}
        return {k: v for k, v in given.items() if v is not None}

    @classmethod
    def from_config(cls, source: Any, **overrides: Any) -> EngineSettings:
        """The record of `source` (``cfg.rollout``, or a command's parsed options named like the fields: see
        `fields_of`), then `overrides` (what `source` does not hold, e.g. ``seed=cfg.seed, device=...``); the
        fields neither gives keep their defaults."""
        return cls(**{**cls.fields_of(source), **overrides})

    @classmethod
    def for_engine(cls, kind: str, settings: EngineSettings | None, overrides: dict[str, Any]) -> EngineSettings:
        """What an engine of `kind` runs with: `settings` (else the defaults) with `overrides` (fields given as
        keywords) laid over it; an unknown keyword is a TypeError, as for any constructor."""
        base = settings if settings is not None else cls(engine=kind)
        if base.engine == kind and not overrides:
            return base  # the caller's record itself: one record for every engine built from it
        return dataclasses.replace(base, engine=kind, **overrides)
