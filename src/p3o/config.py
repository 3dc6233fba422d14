"""Run configuration: nested dataclasses, YAML presets and dotted command-line overrides.

The root :class:`TrainConfig` holds one sub-config per component (each component receives only its own
sub-config). Every field carries its help text in ``field(metadata={"help": ...})`` so ``config_help()``
can list it; ranges (``gt``/``ge``/``le``/``lt``) live in the same metadata and are checked by ``validate``.

    cfg = load_config(["--config", "quick", "--optim.lr", "3e-4", "--objective.name=grpo", "--objective.clip_eps=0.4"])

Order of application: the embedded defaults (or ``base``), then every ``--config`` file in order, then
the dotted overrides in order, then ``--resume``. Values are parsed as YAML scalars and then checked
against the field's type (int / float / bool / str / Literal choices / tuples); errors are one line that
names the key, e.g. ``unknown key 'optim.lrr' (did you mean 'optim.lr'?)``.

``objective.<hyper>`` keys (``--objective.clip_eps 0.4``) are collected in ``ObjectiveConfig.hyper`` and
validated against the keyword-only signature of ``p3o.objectives.get_objective(name)`` when that module
is importable.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import difflib
import functools
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pydantic
import yaml

from p3o.errors import ConfigError

__all__ = [
    "AdvantageConfig",
    "CkptConfig",
    "LogConfig",
    "LoopConfig",
    "LoraConfig",
    "ModelConfig",
    "ObjectiveConfig",
    "OptimConfig",
    "RayConfig",
    "RolloutConfig",
    "TaskConfig",
    "TrainConfig",
    "TrainerConfig",
    "UpdateConfig",
    "apply_overrides",
    "config_help",
    "config_field",
    "default_preset_text",
    "from_dict",
    "list_presets",
    "load_config",
    "objective_hyper",
    "preset_path",
    "save_config",
    "to_dict",
    "validate",
]


# pydantic's error type of a broken bound -> (the Field argument, its symbol in the one-line message)
_BOUNDS = {
    "greater_than": ("gt", ">"),
    "greater_than_equal": ("ge", ">="),
    "less_than": ("lt", "<"),
    "less_than_equal": ("le", "<="),
}


def config_field(default: Any = dataclasses.MISSING, help: str = "", *, factory: Any = None, **bounds: float) -> Any:
    """A dataclass field with its help text and optional numeric bounds in the metadata.

    ``bounds`` are pydantic ``Field`` constraints (``gt``, ``ge``, ``lt``, ``le``): pydantic checks them, with the
    field's type, whenever a value is set or validated. Every config of the project (train, sft, the experiment
    files' sections) declares its fields with it, so the one mechanism (:func:`load_config`, :func:`from_dict`,
    :func:`validate`, :func:`config_help`) types, bounds and documents them all the same way.
    """
    assert help, "every config field needs a help text"
    assert set(bounds) <= {arg for arg, _ in _BOUNDS.values()}, bounds
    metadata = {"help": help, **bounds}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


_f = config_field


# --------------------------------------------------------------------------------------------------------------------
# Sub-configs
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class LoraConfig:
    """LoRA adapters on the policy (``p3o.models.lora``, extra ``p3o[lora]``): W0 + (alpha/r)·B·A, W0 frozen."""

    r: int = _f(0, "adapter rank (0: LoRA off, every parameter trains)", ge=0)
    alpha: float = _f(16.0, "scale numerator: the update is (alpha / r)·B·A", gt=0)
    dropout: float = _f(0.0, "dropout on the adapter input (keep 0 for exact log-prob ratios)", ge=0, lt=1)
    target_modules: str | None = _f(
        None,
        "comma-separated linear layers to adapt ('q_proj,v_proj'), 'all-linear', or None: the architecture's "
        "default (Llama / Qwen / Mistral: q,k,v,o,gate,up,down_proj)",
    )


@dataclass
class ModelConfig:
    """The policy to train (``p3o.models.load_policy``)."""

    name: str = _f("tiny", "model: 'tiny' (built-in, warm-started), 'tiny-random', 'smollm2' or a local HF directory")
    cache_dir: str | None = _f(None, "cache for built-in models and tokenizers (None: $P3O_CACHE or ~/.cache/p3o)")
    dtype: Literal["float32", "bfloat16", "float16"] = _f(
        "float32", "trainer parameter dtype (also its gradients and AdamW states: no fp32 master copy; docs/gpu.md)"
    )
    device: str = _f("auto", "trainer and HF rollout device: 'auto' (cuda if available), 'cpu', 'cuda'")
    lora: LoraConfig = field(default_factory=LoraConfig, metadata={"help": "LoRA adapters (r = 0: off)"})


@dataclass
class TaskConfig:
    """The prompts and the verifier that scores completions (``p3o.tasks.load_task``, ``p3o.rewards``)."""

    name: str = _f(
        "arithmetic", "task: 'arithmetic' (built-in), a preset such as 'gsm8k', 'preset:path', or your own data path"
    )
    difficulty: int | str = _f(2, "difficulty of the built-in arithmetic task (passed to load_task)")
    verifier: str | None = _f(
        None, "exact-int | gsm8k | math | format [+format], or your own 'package.module:function' (None: the task's)"
    )
    template: str = _f("default", "prompt template: default | plain | hash | boxed | short (docs/tasks.md)")
    system_prompt: str | None = _f(None, "system prompt of every prompt (chat template's system turn, else prefixed)")
    question_key: str | None = _f(None, "data field holding the question (None: the preset's or auto-detected)")
    answer_key: str | None = _f(None, "data field holding the reference answer (None: the preset's or auto-detected)")
    solution_key: str | None = _f(None, "data field holding a worked solution (None: the preset's or auto-detected)")
    test_fraction: float = _f(0.1, "held-out share of a single data file (a hash of the question decides)", ge=0, lt=1)
    n_train: int | None = _f(None, "number of training problems (None: all the task provides)", ge=1)
    eval_name: str | None = _f(None, "evaluation data: a file, folder or preset (None: task.name's held-out rows)")
    eval_split: str = _f("test", "split used for evaluation during and after training")
    n_eval: int = _f(128, "number of evaluation problems (0: no evaluation)", ge=0)
    allow_train_eval_overlap: bool = _f(
        False, "evaluate on training rows too (a single file is then not split); prints a warning"
    )
    reward_timeout_s: float = _f(1.0, "time limit of one verifier call, in seconds", gt=0)


@dataclass
class RolloutConfig:
    """Sampling: how many completions per step and how the rollout engine generates and records log-probs."""

    engine: Literal["hf", "vllm"] = _f(
        "hf", "rollout engine: 'hf' (p3o's own sampling loop) or 'vllm' (vLLM; extra p3o[vllm], docs/vllm.md)"
    )
    prompts_per_step: int = _f(16, "prompts sampled per training step", ge=1)
    group_size: int = _f(4, "completions per prompt (G); advantages are relative within the group", ge=1)
    max_new_tokens: int = _f(48, "maximum response length T (longer responses are truncated)", ge=1)
    temperature: float = _f(1.0, "sampling temperature of the rollout engine", gt=0)
    top_p: float = _f(1.0, "nucleus sampling mass (1: off)", gt=0, le=1)
    top_k: int = _f(0, "top-k sampling (0: off)", ge=0)
    precision: Literal["fp32", "bf16", "fp16", "int8", "fp8"] = _f(
        "fp32",
        "rollout engine copy: fp32 / bf16 / fp16 cast it; int8 / fp8 simulate W8A8 numerics (no speed-up); the "
        "trainer keeps model.dtype",
    )
    logprob_mode: Literal["processed", "raw"] = _f(
        "processed", "record log-probs of the distribution sampled from ('processed') or before temperature ('raw')"
    )
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"] = _f(
        "auto", "vLLM only: the KV-cache dtype (fp8*: an FP8 KV cache)"
    )
    kv_cache_gib: float | None = _f(
        None, "vLLM only: KV-cache size in GiB on a CPU (None: P3O_VLLM_KV_CACHE_GIB or 1)", gt=0
    )
    gpu_memory_utilization: float = _f(
        0.3, "vLLM only: share of GPU memory vLLM may take (the trainer shares it)", gt=0, le=1
    )
    workers: int = _f(0, "Ray rollout actors, each with its own engine and verifier (0: the in-process engine)", ge=0)
    inflight_updates: bool = _f(
        False, "workers take a newer policy version between decode steps of a running batch (hf engine only)"
    )
    colocate: bool = _f(False, "Ray workers may share the trainer's devices (else they get devices of their own)")


@dataclass
class TrainerConfig:
    """The trainer's recomputation of log-probs (``p3o.policy.token_logprobs``)."""

    temperature: float = _f(1.0, "temperature the trainer applies to logits when computing log-probs", gt=0)
    chunk_size: int = _f(256, "vocabulary-projection chunk (tokens) for memory-lean log-probs", ge=1)
    ref_model: bool = _f(False, "keep a frozen reference model for ref_logp (added anyway when an objective needs it)")
    gradient_checkpointing: bool = _f(False, "enable gradient checkpointing on the policy")


@dataclass
class UpdateConfig:
    """How one rollout batch is split into optimizer steps."""

    num_mini_batches: int = _f(1, "optimizer steps per epoch (> 1 makes later mini-batches off-policy)", ge=1)
    micro_batch_size: int = _f(
        64,
        "sequences per forward/backward (gradient accumulation inside a mini-batch); for P3O with its default "
        "objective.scope micro-batch it is also the set its ESS is taken over, so part of the objective",
        ge=1,
    )
    epochs: int = _f(1, "passes over each rollout batch", ge=1)


@dataclass
class OptimConfig:
    """AdamW and its learning-rate schedule."""

    lr: float = _f(2e-4, "peak learning rate", gt=0)
    weight_decay: float = _f(0.0, "AdamW weight decay", ge=0)
    betas: tuple[float, float] = _f((0.9, 0.999), "AdamW betas (beta1, beta2)")
    eps: float = _f(1e-8, "AdamW epsilon", gt=0)
    warmup_steps: int = _f(0, "linear warm-up steps (optimizer steps)", ge=0)
    schedule: Literal["constant", "cosine"] = _f("constant", "learning-rate schedule after warm-up")
    min_lr_ratio: float = _f(0.0, "cosine schedule floor as a fraction of lr", ge=0, le=1)
    grad_clip: float = _f(1.0, "global gradient-norm clip (0: off)", ge=0)


@dataclass
class LoopConfig:
    """Which pipeline produces the training data (sync / stale / async / reuse) and batch filtering."""

    mode: Literal["sync", "stale", "async", "reuse"] = _f(
        "async", "sync: on-policy; stale: train on rollouts `staleness` steps old; async: bounded lag; reuse: replay"
    )
    staleness: int = _f(4, "stale mode: rollouts generated at step k are trained on at step k + staleness", ge=0)
    max_lag: int = _f(2, "async mode: maximum policy versions between generation and training", ge=0)
    lag_policy: Literal["wait", "drop"] = _f(
        "wait", "a batch holding a token older than max_lag: wait for a fresher one, or drop it (counted)"
    )
    schedule: Literal["fixed", "free"] = _f(
        "fixed",
        "async mode: fixed = batch b is generated by policy version max(0, b - max_lag) (deterministic); free = "
        "an overlapping producer whose lag depends on timing (<= max_lag)",
    )
    reuse_epochs: int = _f(2, "reuse mode: how many steps each rollout batch is trained on", ge=1)
    dynamic_sampling: bool = _f(False, "DAPO dynamic sampling: drop groups whose rewards are all equal and resample")
    dynamic_sampling_max_tries: int = _f(3, "dynamic sampling: generation rounds per step before giving up", ge=1)
    overlong_penalty: bool = _f(False, "DAPO soft overlong punishment on responses near max_new_tokens")
    overlong_buffer: int = _f(16, "overlong penalty ramps over the last `overlong_buffer` tokens", ge=1)
    overlong_factor: float = _f(1.0, "overlong penalty at the maximum length (reward - factor)", ge=0)


@dataclass
class AdvantageConfig:
    """Group-relative advantages (``p3o.advantages.group_advantages``)."""

    std: Literal["population", "bessel"] = _f("population", "group standard deviation: population (paper) or Bessel")
    scale: Literal["group", "batch", "none"] = _f("group", "divide by the group std, batch std, or nothing (Dr.GRPO)")
    baseline: Literal["mean", "lowered"] = _f("mean", "baseline: group mean, or lowered mean - alpha*std (AsymRE)")
    alpha: float = _f(0.5, "lowered baseline: alpha in mean - alpha*std", ge=0)
    eps: float = _f(1e-6, "added to the std before dividing", gt=0)


@dataclass
class ObjectiveConfig:
    """The objective ``p3o.objectives.get_objective(name)`` and its keyword hyper-parameters.

    On the command line and in YAML the hyper-parameters are flat: ``--objective.clip_eps 0.4`` or
    ``objective: {name: grpo, clip_eps: 0.4}``; they are stored in ``hyper`` and passed as ``fn(inputs, **hyper)``
    (unset ones keep the objective's own defaults).
    """

    name: str = _f("p3o", "objective name (see p3o.objectives.OBJECTIVES)")
    hyper: dict[str, Any] = field(
        default_factory=dict,
        metadata={"help": "keyword hyper-parameters overriding the objective's defaults (set as objective.<name>)"},
    )


@dataclass
class LogConfig:
    """Metrics output (``p3o.metrics.MetricsLogger``) and the console progress bar."""

    every: int = _f(1, "write metrics every this many steps", ge=1)
    tensorboard: bool | Literal["auto"] = _f("auto", "TensorBoard event files: auto (when installed), true, false")
    wandb: bool | Literal["auto"] = _f("auto", "Weights & Biases: auto (installed and configured), true, false")
    wandb_project: str = _f("p3o", "W&B project name")
    progress: bool = _f(True, "rich progress bar with live reward and ESS (only on a terminal)")
    eval_every: int = _f(50, "evaluate on the eval split every this many steps (0: only at the end)", ge=0)
    plot: bool = _f(True, "draw plot.png in the run directory at the end")


@dataclass
class CkptConfig:
    """Checkpoints under ``run_dir/checkpoints/step_XXXXXX`` (``p3o.train.checkpoint``)."""

    every: int = _f(20, "save a checkpoint every this many steps (0: none besides final/)", ge=0)
    keep_last: int = _f(2, "number of step checkpoints kept (older ones are pruned)", ge=1)
    resume: bool = _f(False, "resume from the latest valid checkpoint in run_dir")


@dataclass
class RayConfig:
    """The Ray cluster the rollout workers run on (``rollout.workers > 0``; extra ``p3o[ray]``)."""

    address: str | None = _f(None, "an existing cluster to join ('auto', 'host:port'); None: start a local instance")
    num_cpus: int | None = _f(None, "logical CPUs of a local instance (None: Ray's own count)", ge=1)


@dataclass
class TrainConfig:
    """Root config of one training run: ``p3o train`` with no arguments runs exactly these defaults.

    Defaults = the embedded default job: P3O on the built-in arithmetic task with the built-in tiny model.
    """

    run_dir: str = _f("runs/default", "output directory (config.yaml, metrics.jsonl, checkpoints/, final/, plot.png)")
    overwrite: bool = _f(
        False, "replace an earlier run's outputs in run_dir (a fresh run otherwise refuses such a directory)"
    )
    seed: int = _f(0, "random seed (python, numpy, torch, sampling)")
    steps: int = _f(150, "training steps (one rollout batch each)", ge=1)
    model: ModelConfig = field(default_factory=ModelConfig, metadata={"help": "policy model"})
    task: TaskConfig = field(default_factory=TaskConfig, metadata={"help": "task and verifier"})
    rollout: RolloutConfig = field(default_factory=RolloutConfig, metadata={"help": "sampling"})
    train: TrainerConfig = field(default_factory=TrainerConfig, metadata={"help": "trainer-side log-probs"})
    update: UpdateConfig = field(default_factory=UpdateConfig, metadata={"help": "mini-/micro-batching"})
    optim: OptimConfig = field(default_factory=OptimConfig, metadata={"help": "optimizer"})
    loop: LoopConfig = field(default_factory=LoopConfig, metadata={"help": "data pipeline"})
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig, metadata={"help": "advantages"})
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig, metadata={"help": "objective"})
    log: LogConfig = field(default_factory=LogConfig, metadata={"help": "metrics"})
    ckpt: CkptConfig = field(default_factory=CkptConfig, metadata={"help": "checkpoints"})
    ray: RayConfig = field(default_factory=RayConfig, metadata={"help": "Ray cluster of the rollout workers"})

    def _cross_check(self) -> None:
        _check_train(self)


# --------------------------------------------------------------------------------------------------------------------
# Introspection helpers
# --------------------------------------------------------------------------------------------------------------------

_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    """Resolved type hints of a config dataclass (the module uses postponed annotations)."""
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _leaf_fields(cls: type = TrainConfig, prefix: str = "") -> list[tuple[str, dataclasses.Field, Any]]:
    """(dotted key, field, type) of every leaf field, in declaration order."""
    out: list[tuple[str, dataclasses.Field, Any]] = []
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(tp):
            out += _leaf_fields(tp, key + ".")
        else:
            out.append((key, f, tp))
    return out


def _objective(name: str) -> Any:
    """The registry record of objective ``name`` (``p3o.objectives.Objective``): the one source of its
    hyper-parameters, their types, defaults and deprecated spellings. Unknown name: ConfigError with the nearest."""
    from p3o.objectives import OBJECTIVES

    if name not in OBJECTIVES:
        near = difflib.get_close_matches(name, list(OBJECTIVES), n=1)
        hint = f" (did you mean '{near[0]}'?)" if near else ""
        raise ConfigError(f"objective.name: unknown objective '{name}'{hint}; known: {', '.join(sorted(OBJECTIVES))}")
    return OBJECTIVES[name]


def _all_keys(objective_name: str | None = None, cls: type | None = None) -> list[str]:
    """Every valid dotted key of root ``cls`` (default TrainConfig): leaf fields, plus objective.<hyper>."""
    keys = [k for k, _, _ in _leaf_fields(cls or TrainConfig) if k != "objective.hyper"]
    if objective_name is not None:
        with contextlib.suppress(ConfigError):
            keys += [f"objective.{h}" for h in _objective(objective_name).hypers]
    return keys


def _nearest(key: str, candidates: list[str]) -> str | None:
    """Closest valid key: same section first (comparing the last component), then the whole dotted name."""
    section, _, last = key.rpartition(".")
    same = {c.rpartition(".")[2]: c for c in candidates if c.rpartition(".")[0] == section}
    near = difflib.get_close_matches(last, list(same), n=1, cutoff=0.6)
    if near:
        return same[near[0]]
    near = difflib.get_close_matches(key, candidates, n=1, cutoff=0.75)
    if near:
        return near[0]
    by_last = {c.rpartition(".")[2]: c for c in candidates}
    near = difflib.get_close_matches(last, list(by_last), n=1, cutoff=0.75)
    return by_last[near[0]] if near else None


def _unknown(key: str, objective_name: str | None, cls: type | None = None) -> ConfigError:
    near = _nearest(key, _all_keys(objective_name, cls))
    hint = f" (did you mean '{near}'?)" if near else ""
    return ConfigError(f"unknown key '{key}'{hint}")


# --------------------------------------------------------------------------------------------------------------------
# Value parsing and type checking
# --------------------------------------------------------------------------------------------------------------------


def _describe(tp: Any) -> str:
    """Human-readable type name used in error messages."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(str(c).lower() if isinstance(c, bool) else str(c) for c in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        text = " or ".join(_describe(a) for a in args)
        return text + (" or null" if len(args) < len(typing.get_args(tp)) else "")
    if origin is tuple:
        args = typing.get_args(tp)
        return f"a list of {len(args)} {_describe(args[0]).removeprefix('a ').removeprefix('an ')}s"
    return {int: "an int", float: "a float", bool: "a bool", str: "a string", dict: "a mapping"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


@functools.cache
def _adapter(tp: Any, bounds: tuple[tuple[str, float], ...] = ()) -> pydantic.TypeAdapter:
    """pydantic's validator for type ``tp`` with ``Field`` constraints ``bounds`` (lax mode: '1e-4' -> 1e-4,
    'yes' -> True, [1, 2] -> (1, 2); floats must be finite)."""
    annotated = typing.Annotated[tp, pydantic.Field(**dict(bounds))] if bounds else tp
    return pydantic.TypeAdapter(annotated, config=pydantic.ConfigDict(allow_inf_nan=False))


def _bounds(f: dataclasses.Field) -> tuple[tuple[str, float], ...]:
    """The pydantic constraints a :func:`config_field` declared (hashable, for :func:`_adapter`)."""
    return tuple((k, v) for k, v in f.metadata.items() if k != "help")


def _is_text(tp: Any) -> bool:
    """``str`` or ``str | None``: command-line text is kept verbatim ('007' stays '007', not 7)."""
    return tp is str or (typing.get_origin(tp) in (typing.Union, types.UnionType) and str in typing.get_args(tp))


class _Flag:
    """The value of a bare ``--key`` on the command line: true for a bool field, a missing value otherwise."""


FLAG = _Flag()


def _check(key: str, value: Any, tp: Any, raw: str | None = None, bounds: tuple = ()) -> Any:
    """Coerce ``value`` to ``tp`` and check ``bounds`` (pydantic, lax) or raise a one-line ConfigError naming ``key``.

    ``raw`` is the original command-line text: a string field keeps it verbatim, and errors quote it.
    """
    if value is FLAG:
        if tp is not bool:
            raise ConfigError(f"--{key}: expected a value")
        return True
    if tp is Any:
        return value
    # a text-only field (str, str | None) takes the command-line text verbatim; int | str keeps a parsed number
    text_only = set(typing.get_args(tp) or (tp,)) <= {str, type(None)}
    if raw is not None and value is not None and _is_text(tp) and (isinstance(value, str) or text_only):
        value = raw
    if isinstance(value, str) and typing.get_origin(tp) is Literal:  # choices match case-insensitively
        text = value.strip().lower()
        value = next((c for c in typing.get_args(tp) if isinstance(c, str) and c.lower() == text), value)
    try:
        value = _adapter(tp).validate_python(value)
        return _adapter(tp, bounds).validate_python(value) if bounds else value
    except pydantic.ValidationError as err:
        error = err.errors()[0]
        if error["type"] in _BOUNDS:
            arg, symbol = _BOUNDS[error["type"]]
            raise ConfigError(f"{key}: must be {symbol} {dict(bounds)[arg]}, got {value}") from None
        if error["type"] == "finite_number":
            raise ConfigError(f"{key}: must be a finite number, got {error['input']}") from None
        got = raw if raw is not None else value
        raise ConfigError(f"{key}: expected {_describe(tp)}, got {got!r}") from None


def _parse_scalar(text: str) -> Any:
    """Parse a command-line value as a YAML scalar/flow value ('1e-4' and 'abc' stay strings)."""
    try:
        return yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:
        return text


# --------------------------------------------------------------------------------------------------------------------
# Setting keys
# --------------------------------------------------------------------------------------------------------------------


def _objective_name(cfg: Any) -> str | None:
    """The objective name of a config that has an ``objective`` section (TrainConfig), else None."""
    return getattr(getattr(cfg, "objective", None), "name", None)


def _set(cfg: Any, key: str, value: Any, *, raw: str | None = None) -> None:
    """Set dotted ``key`` on ``cfg`` in place, type-checking the value (hyper keys go to objective.hyper)."""
    parts = key.split(".")
    if any(not p for p in parts):
        raise ConfigError(f"malformed key '{key}'")
    obj: Any = cfg
    for i, part in enumerate(parts):
        if isinstance(obj, ObjectiveConfig) and part not in {"name", "hyper"}:
            if i != len(parts) - 1:
                raise _unknown(key, _objective_name(cfg), type(cfg))
            obj.hyper[part] = value  # typed against the objective's signature in validate()
            return
        if isinstance(obj, ObjectiveConfig) and part == "hyper" and i == len(parts) - 2:
            obj.hyper[parts[-1]] = value
            return
        fields = {f.name: f for f in dataclasses.fields(obj)} if dataclasses.is_dataclass(obj) else {}
        if part not in fields:
            raise _unknown(key, _objective_name(cfg), type(cfg))
        tp = _hints(type(obj))[part]
        if i == len(parts) - 1:
            if dataclasses.is_dataclass(tp):
                if isinstance(value, Mapping):
                    for k, v in value.items():
                        _set(cfg, f"{key}.{k}", v)
                    return
                raise ConfigError(f"{key}: is a section; set its keys, e.g. '{key}.{dataclasses.fields(tp)[0].name}'")
            if part == "hyper" and isinstance(obj, ObjectiveConfig):
                if not isinstance(value, Mapping):
                    raise ConfigError(f"{key}: expected a mapping, got {value!r}")
                obj.hyper.update(value)
                return
            setattr(obj, part, _check(key, value, tp, raw, _bounds(fields[part])))
            return
        obj = getattr(obj, part)


def _flatten(d: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """Nested mapping -> [(dotted key, leaf value)]; lists and scalars are leaves."""
    out: list[tuple[str, Any]] = []
    for k, v in d.items():
        if not isinstance(k, str):
            raise ConfigError(f"key {prefix}{k!r}: keys must be strings")
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out += _flatten(v, key + ".")
        elif isinstance(v, Mapping):
            continue  # an empty section (e.g. `objective: {hyper: {}}`) sets nothing
        else:
            out.append((key, v))
    return out


def apply_overrides(cfg: TrainConfig, overrides: Mapping[str, Any], *, check: bool = True) -> TrainConfig:
    """A copy of ``cfg`` with dotted ``overrides`` applied, e.g. ``{"loop.mode": "stale", "objective.clip_eps": 0.4}``.

    Values may be Python objects or strings (strings are converted like command-line values); nested
    mappings are flattened (``{"optim": {"lr": 1e-3}}``). ``check`` runs :func:`validate` at the end.
    """
    new = copy.deepcopy(cfg)
    for key, value in _flatten(overrides):
        _set(new, key, value)
    if check:
        validate(new)
    return new


# --------------------------------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------------------------------


def objective_hyper(cfg: ObjectiveConfig) -> dict[str, Any]:
    """Every keyword hyper-parameter of the objective: ``cfg.hyper`` over its defaults (the registry's resolver)."""
    return _objective(cfg.name).resolve(cfg.hyper, where="objective")


def _check_objective(cfg: ObjectiveConfig) -> None:
    """Type ``cfg.hyper`` by the record's declared types and store it under the current spellings.

    An unknown keyword is one line with the nearest one of this objective and the objectives it belongs to.
    """
    from p3o.objectives import OBJECTIVES

    rec = _objective(cfg.name)
    typed: dict[str, Any] = {}
    for k, v in cfg.hyper.items():
        key = f"objective.{k}"
        if not isinstance(k, str) or not k.isidentifier():
            raise ConfigError(f"{key}: not a valid hyper-parameter name")
        hyper = rec.hypers.get(rec.aliases.get(k, k))
        if hyper is None:
            near = _nearest(key, [f"objective.{h}" for h in rec.hypers])
            hint = f" (did you mean '{near}'?)" if near else ""
            others = [name for name, other in OBJECTIVES.items() if k in other.hypers]
            where = f"; '{k}' belongs to {', '.join(others)}" if others else ""
            known = ", ".join(rec.hypers) or "none"
            raise ConfigError(
                f"unknown key '{key}' for objective '{cfg.name}'{hint}{where}; its hyper-parameters: {known}"
            )
        typed[k] = _check(key, v, hyper.type)
    full = rec.resolve(typed, where="objective")  # deprecated spellings renamed (with a warning), both refused
    cfg.hyper = {h: full[h] for h in (rec.aliases.get(k, k) for k in typed)}


def validate(cfg: Any) -> Any:
    """Check types, ranges and cross-field constraints of any config dataclass (TrainConfig, SFTConfig, the
    experiment specs); raises a one-line ConfigError. Returns ``cfg``.

    Cross-field checks live in the class's ``_cross_check(self)`` method. For a TrainConfig this also normalises
    the objective's hyper-parameter types to those its registry record declares.
    """
    if not dataclasses.is_dataclass(cfg) or isinstance(cfg, type):
        raise ConfigError(f"expected a config dataclass, got {type(cfg).__name__}")
    for key, f, tp in _leaf_fields(type(cfg)):
        if key == "objective.hyper":
            continue  # typed by the objective's record in TrainConfig's cross-check
        obj: Any = cfg
        for part in key.split(".")[:-1]:
            obj = getattr(obj, part)
        setattr(obj, f.name, _check(key, getattr(obj, f.name), tp, bounds=_bounds(f)))
    check = getattr(cfg, "_cross_check", None)
    if check is not None:
        check()
    return cfg


def _check_train(cfg: TrainConfig) -> None:
    """TrainConfig's cross-field constraints (and its objective's hyper-parameters, typed by the record)."""
    b1, b2 = cfg.optim.betas
    if not (0 <= b1 < 1 and 0 <= b2 < 1):
        raise ConfigError(f"optim.betas: each beta must be in [0, 1), got [{b1}, {b2}]")
    if not cfg.run_dir.strip():
        raise ConfigError("run_dir: must not be empty")
    if cfg.overwrite and cfg.ckpt.resume:
        raise ConfigError("overwrite: --overwrite replaces the run in run_dir and --resume continues it; pick one")
    if cfg.rollout.engine != "vllm":
        for key in ("kv_cache_dtype", "kv_cache_gib", "gpu_memory_utilization"):
            if getattr(cfg.rollout, key) != getattr(RolloutConfig(), key):
                raise ConfigError(f"rollout.{key}: a vLLM setting; it needs rollout.engine vllm")
    if cfg.rollout.inflight_updates and cfg.rollout.engine == "vllm":
        raise ConfigError(
            "rollout.inflight_updates needs the hf engine: vLLM has no pause/resume around a weight swap here"
        )
    if cfg.rollout.workers > 0 and cfg.loop.mode not in ("sync", "async"):
        raise ConfigError(
            f"rollout.workers: Ray rollout workers run with loop.mode sync or async, not {cfg.loop.mode}"
        )
    n = cfg.rollout.prompts_per_step * cfg.rollout.group_size
    if cfg.update.num_mini_batches > n:
        raise ConfigError(
            f"update.num_mini_batches: {cfg.update.num_mini_batches} mini-batches but only {n} sequences per step "
            f"(rollout.prompts_per_step × rollout.group_size)"
        )
    if cfg.loop.overlong_penalty and cfg.loop.overlong_buffer > cfg.rollout.max_new_tokens:
        raise ConfigError(
            f"loop.overlong_buffer: {cfg.loop.overlong_buffer} exceeds rollout.max_new_tokens "
            f"{cfg.rollout.max_new_tokens}"
        )
    _check_objective(cfg.objective)


# --------------------------------------------------------------------------------------------------------------------
# Dict / YAML round trip
# --------------------------------------------------------------------------------------------------------------------


def to_dict(cfg: TrainConfig, *, resolve_objective: bool = False) -> dict[str, Any]:
    """Plain nested dict of ``cfg`` (tuples as lists; objective hyper-parameters flat next to ``name``).

    ``resolve_objective=True`` writes every hyper-parameter of the objective (its defaults filled in) when
    ``p3o.objectives`` is available.
    """

    def conv(obj: Any) -> Any:
        if dataclasses.is_dataclass(obj):
            if isinstance(obj, ObjectiveConfig):
                hyper = objective_hyper(obj) if resolve_objective else dict(obj.hyper)
                return {"name": obj.name, **{k: conv(v) for k, v in hyper.items()}}
            return {f.name: conv(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
        if isinstance(obj, tuple | list):
            return [conv(v) for v in obj]
        if isinstance(obj, Mapping):
            return {k: conv(v) for k, v in obj.items()}
        return obj

    return conv(cfg)


def from_dict(d: Mapping[str, Any], *, base: Any = None, source: str | None = None, cls: type | None = None) -> Any:
    """A validated config of root ``cls`` (default: ``type(base)``, else TrainConfig) from a (nested or dotted)
    dict laid over ``base`` (default: ``cls()``, the embedded defaults).

    ``source`` (a file name, or ``file: section``) prefixes error messages.
    """
    cls = cls or (type(base) if base is not None else TrainConfig)
    cfg = copy.deepcopy(base) if base is not None else cls()
    try:
        for key, value in _flatten(d):
            _set(cfg, key, value)
        return validate(cfg)
    except ConfigError as err:
        if source:
            raise ConfigError(f"{source}: {err}") from None
        raise


def save_config(cfg: TrainConfig, path: str | Path, *, resolve_objective: bool = True) -> Path:
    """Write ``cfg`` as YAML (the resolved config of a run); returns the path.

    The file reloads with ``load_config(["--config", path])`` to an equal config.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "# resolved p3o config; rerun with: p3o train --config " + str(path) + "\n"
    text += yaml.safe_dump(
        to_dict(cfg, resolve_objective=resolve_objective), sort_keys=False, default_flow_style=False
    )
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return path


# --------------------------------------------------------------------------------------------------------------------
# Presets and files
# --------------------------------------------------------------------------------------------------------------------


def _preset_dirs() -> list[Path | Any]:
    """Where presets live: the repository's configs/ (source checkout / editable install), then the packaged copy."""
    dirs: list[Path | Any] = []
    repo = Path(__file__).resolve().parents[2]
    if (repo / "pyproject.toml").is_file() and (repo / "configs").is_dir():
        dirs.append(repo / "configs")
    try:
        from importlib.resources import files

        packaged = files("p3o") / "configs"
        if packaged.is_dir():
            dirs.append(packaged)
    except (ModuleNotFoundError, TypeError):  # pragma: no cover - namespace/zip oddities
        pass
    return dirs


def list_presets() -> list[str]:
    """Training presets accepted by ``--config NAME``: the files configs/<name>.yaml (sub-folders are not presets)."""
    names: set[str] = set()
    for d in _preset_dirs():
        names |= {p.name[:-5] for p in d.iterdir() if p.name.endswith(".yaml") and p.is_file()}
    return sorted(names)


def preset_path(name_or_path: str) -> Path:
    """Resolve ``--config`` to a file: an existing path, else a preset name (configs/<name>.yaml)."""
    p = Path(name_or_path).expanduser()
    if p.is_file():
        return p
    if p.suffix in {".yaml", ".yml"} and (p.is_absolute() or ("/" in name_or_path and p.parent.exists())):
        raise ConfigError(f"--config: file not found: {name_or_path}")
    stem = name_or_path[:-5] if name_or_path.endswith(".yaml") else name_or_path
    for d in _preset_dirs():
        cand = d / f"{stem}.yaml" if isinstance(d, Path) else d.joinpath(*f"{stem}.yaml".split("/"))
        if cand.is_file():
            return Path(str(cand))
    presets = list_presets()
    near = difflib.get_close_matches(stem, presets, n=1)
    hint = f" (did you mean '{near[0]}'?)" if near else ""
    raise ConfigError(
        f"--config: no file or preset named '{name_or_path}'{hint}; presets: {', '.join(presets) or 'none'}"
    )


def _read_yaml(path: Path, seen: tuple[Path, ...] = ()) -> list[tuple[str, Any]]:
    """Dotted (key, value) pairs of a YAML config file, following an optional top-level ``extends: <preset>``."""
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}:{where} invalid YAML ({getattr(err, 'problem', err)})") from None
    except OSError as err:
        raise ConfigError(f"{path}: cannot read ({err.strerror})") from None
    if data is None:
        return []
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: expected a mapping of config keys at the top level, got {type(data).__name__}")
    data = dict(data)
    pairs: list[tuple[str, Any]] = []
    parent = data.pop("extends", None)
    if parent is not None:
        if not isinstance(parent, str):
            raise ConfigError(f"{path}: extends: expected a preset name or path, got {parent!r}")
        ppath = preset_path(parent)
        if ppath.resolve() in seen:
            raise ConfigError(f"{path}: extends: cycle through {ppath}")
        pairs += _read_yaml(ppath, (*seen, path.resolve()))
    return pairs + _flatten(data)


def load_config(argv: list[str] | None = None, *, base: Any = None, cls: type | None = None) -> Any:
    """Parse ``--config PATH_OR_PRESET``, dotted overrides and ``--resume`` into a validated config.

    The one command-line mechanism of ``p3o train`` (root ``TrainConfig``), ``p3o sft`` (``SFTConfig``) and
    ``p3o compare`` (its options): ``cls`` is the root dataclass (default: ``type(base)``, else TrainConfig).
    ``argv`` None or [] gives ``base`` (default: ``cls()``, the embedded defaults). Accepted forms:
    ``--config quick``, ``--config=path.yaml``, ``--optim.lr 3e-4``, ``--optim.lr=3e-4``, a bare boolean flag
    ``--loop.dynamic_sampling`` (= true), ``--resume`` (= ``--ckpt.resume true``); ``-`` and ``_`` are the same in
    a key (``--batch-size`` = ``--batch_size``). ``--help`` is not handled here (see :func:`config_help`).
    """
    cls = cls or (type(base) if base is not None else TrainConfig)
    argv = list(argv or [])
    configs: list[str] = []
    overrides: list[tuple[str, str | None]] = []
    i = 0
    while i < len(argv):
        tok = argv[i]
        if not tok.startswith("--") or tok == "--":
            raise ConfigError(f"unexpected argument '{tok}' (options look like --key value or --key=value)")
        name, eq, val = tok[2:].partition("=")
        name = name.replace("-", "_")
        if not eq:
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            is_flag = nxt is None or (nxt.startswith("--") and len(nxt) > 2)
            if is_flag:
                val = None
                i += 1
            else:
                val = nxt
                i += 2
        else:
            i += 1
        if name == "config":
            if not val:
                raise ConfigError("--config: expected a file path or preset name")
            configs.append(val)
        elif name == "resume" and cls is TrainConfig:
            overrides.append(("ckpt.resume", "true" if val is None else val))
        else:
            overrides.append((name, val))

    cfg = copy.deepcopy(base) if base is not None else cls()
    for c in configs:
        path = preset_path(c)
        try:
            for key, value in _read_yaml(path):
                _set(cfg, key, value)
        except ConfigError as err:
            msg = str(err)
            raise ConfigError(msg if msg.startswith(str(path)) else f"{path}: {msg}") from None
    for key, val in overrides:  # a bare --key is FLAG: true for a bool (objective.<hyper> ones once typed)
        _set(cfg, key, FLAG if val is None else _parse_scalar(val), raw=val)
    return validate(cfg)


def _metavar(tp: Any) -> str:
    """Short type name for --help: INT, FLOAT, BOOL, STR, {a,b}, INT|null, [FLOAT,FLOAT]."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "{" + ",".join(str(c).lower() if isinstance(c, bool) else str(c) for c in typing.get_args(tp)) + "}"
    if origin in (typing.Union, types.UnionType):
        return "|".join("null" if a is type(None) else _metavar(a) for a in typing.get_args(tp))
    if origin is tuple:
        return "[" + ",".join(_metavar(a) for a in typing.get_args(tp)) + "]"
    return {int: "INT", float: "FLOAT", bool: "BOOL", str: "STR"}.get(tp, "VALUE")


def _shown(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    if isinstance(value, tuple):
        return "[" + ", ".join(_shown(v) for v in value) + "]"
    return str(value)


def config_help(cls: type | None = None, extra: list[tuple[str, str]] | None = None) -> str:
    """Every option of root ``cls`` (default TrainConfig) grouped by section, with its type, default and help.

    The ``--help`` of ``p3o train``, ``p3o sft`` and ``p3o compare``; ``extra`` adds (option, help) rows that are
    not config fields (``p3o sft --out``). For TrainConfig the objectives and their typed ``objective.<hyper>``
    keys are listed from the registry records.
    """
    cls = cls or TrainConfig
    default = cls()
    rows: list[tuple[str, str] | str] = ["general:"]
    if cls is TrainConfig:
        rows.append(("--config PATH_OR_PRESET", "YAML file or preset: " + ", ".join(list_presets())))
        rows.append(("--resume", "resume from the latest checkpoint in run_dir (= --ckpt.resume true)"))
    else:
        rows.append(("--config PATH", "YAML file of these keys (applied before the command-line options)"))
    rows += list(extra or [])
    section = None
    for key, f, tp in _leaf_fields(cls):
        head = key.split(".")[0] if "." in key else None
        if head != section:
            section = head
            if head is not None:
                sub = _hints(cls)[head]
                rows.append(f"{head}: {(sub.__doc__ or '').strip().splitlines()[0].replace('``', '')}")
        if key == "objective.hyper":
            rows.append(("--objective.<hyper> VALUE", "a keyword hyper-parameter of the chosen objective (below)"))
            continue
        obj: Any = default
        for part in key.split("."):
            obj = getattr(obj, part)
        rows.append((f"--{key} {_metavar(tp)}", f"{f.metadata['help']} [default: {_shown(obj)}]"))
    records = []
    if cls is TrainConfig:
        from p3o.objectives import OBJECTIVES

        records = list(OBJECTIVES.values())
    common = set.intersection(*(set(r.hypers) for r in records)) if records else set()
    for i, rec in enumerate(records):
        rows.append(f"objective.name {rec.name}: {rec.summary}")
        for h in rec.hypers.values():
            if h.name not in common or i == len(records) - 1:
                rows.append((f"--objective.{h.name} {_metavar(h.type)}", f"[default: {_shown(h.default)}]"))
        if i == len(records) - 1 and common:
            rows.append(f"(every objective also takes {', '.join(sorted(common))}; defaults as for {rec.name})")
    width = min(48, max(len(r[0]) for r in rows if isinstance(r, tuple)) + 2)
    lines = ["options (--key value or --key=value; values are YAML scalars):"]
    for r in rows:
        if isinstance(r, str):
            lines += ["", r]
        else:
            opt, text = r
            lines.append(f"  {opt:<{width}}{text}" if len(opt) < width else f"  {opt}\n  {'':<{width}}{text}")
    return "\n".join(lines)


def default_preset_text() -> str:
    """The text of configs/default.yaml: every key of the embedded defaults under the preset header.

    Regenerate both copies after changing a default:
    ``python -m p3o.config > configs/default.yaml && cp configs/default.yaml src/p3o/configs/``
    """
    header = (
        "# p3o train --config default\n"
        "# The embedded default job (= `p3o train` with no arguments): P3O on the built-in arithmetic task with the\n"
        "# built-in tiny model. Every key is listed; a preset only needs the keys it changes.\n"
    )
    return header + yaml.safe_dump(to_dict(TrainConfig()), sort_keys=False, default_flow_style=False)


if __name__ == "__main__":
    print(default_preset_text(), end="")
