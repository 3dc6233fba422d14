"""The schema of a run: one dataclass per component, and the root :class:`TrainConfig` that holds one of each (each
component receives only its own section).

Every field is a :func:`~p3o.options.config_field`: its help text for ``--help`` and its bounds, which pydantic
checks with the field's type. In order: the model (:class:`LoraConfig`, :class:`ModelConfig`), the task
(:class:`TaskConfig`, with the ``task.mixture`` spelling `parse_mixture`), sampling (:class:`RolloutConfig`), the
trainer and its update (:class:`TrainerConfig`, :class:`UpdateConfig`, :class:`OptimConfig`), the data pipeline
(:class:`LoopConfig`, :class:`AdvantageConfig`), the run's outputs (:class:`LogConfig`, :class:`CkptConfig`), the Ray
cluster (:class:`RayConfig`), multi-turn agent episodes (:class:`AgentConfig`), and the root with the checks between
sections. The objective's section, ``ObjectiveConfig``, lives with its keywords in :mod:`p3o.config.objective`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from pydantic_core import core_schema

from p3o.config.objective import ObjectiveConfig, _check_objective, objective_keys
from p3o.errors import ConfigError
from p3o.options import config_field

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
        "float32",
        "trainer parameter dtype, the stored master weights (also gradients and AdamW states); compute precision is "
        "train.mixed_precision (p3o docs gpu)",
    )
    device: str = _f("auto", "trainer and HF rollout device: 'auto' (cuda if available), 'cpu', 'cuda'")
    lora: LoraConfig = field(default_factory=LoraConfig, metadata={"help": "LoRA adapters (r = 0: off)"})


def _mixture_entries(value: Any) -> list[tuple[str, Any]]:
    """(name, weight as given) of each entry of a ``task.mixture`` value (a string, a list, or a mapping)."""
    if isinstance(value, str):
        value = [part for part in value.split(",") if part.strip()]
    if isinstance(value, Mapping):
        value = [{k: v} for k, v in value.items()]
    if not isinstance(value, list | tuple):
        raise ConfigError(f"task.mixture: expected entries name:weight ('arithmetic:0.7,calc:0.3'), got {value!r}")
    pairs: list[tuple[str, Any]] = []
    for item in value:
        if isinstance(item, Mapping) and len(item) == 1:  # YAML `- calc: 0.3`
            ((name, weight),) = item.items()
        elif isinstance(item, str):
            name, sep, weight = item.strip().rpartition(":")
            if not sep:
                name, weight = item.strip(), 1  # a bare name counts 1
            elif not name.strip():
                raise ConfigError(f"task.mixture: entry {item!r} names no task (entries are name:weight)")
        else:
            raise ConfigError(f"task.mixture: entry {item!r} is not name:weight")
        pairs.append((str(name).strip(), weight))
    return pairs


def parse_mixture(value: Any) -> list[str] | None:
    """The ``task.mixture`` value as ["name:weight", ...] (None when empty), or a one-line ConfigError naming it.

    Accepted: ``"arithmetic:0.7,calc:0.3"``, ``["arithmetic:0.7", "calc:0.3"]``, ``[{arithmetic: 0.7}, {calc: 0.3}]``
    (the YAML ``- calc: 0.3`` form); a bare name counts 1. The name is everything before the LAST ``:`` (so
    ``gsm8k:data/x.jsonl:0.5`` names the preset with a path). Weights are finite numbers ≥ 0 (0: evaluated, never
    sampled) with a positive sum; a task appears once.
    """
    if value is None or (isinstance(value, str | list | tuple | Mapping) and not value):
        return None
    out, seen = [], set()
    for name, weight in _mixture_entries(value):
        text = str(weight).strip()
        try:
            if isinstance(weight, bool):
                raise ValueError(text)
            w = float(text)
        except ValueError:
            raise ConfigError(
                f"task.mixture: weight {text!r} of {name!r} is not a number (entries are name:weight)"
            ) from None
        if not math.isfinite(w) or w < 0:
            raise ConfigError(f"task.mixture: weight of {name!r} must be a finite number >= 0, got {text}")
        if name in seen:
            raise ConfigError(f"task.mixture: task {name!r} is listed twice")
        seen.add(name)
        out.append(f"{name}:{w:.12g}")
    if not any(float(e.rpartition(":")[2]) > 0 for e in out):
        raise ConfigError(f"task.mixture: the weights sum to 0 ({', '.join(out)}); give a task a weight > 0")
    return out


class TaskMixture:
    """The type of ``task.mixture``: validation turns any accepted spelling into ["name:weight", ...] or None
    (`parse_mixture`); a bad entry is a one-line ConfigError naming ``task.mixture``."""

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        return core_schema.no_info_plain_validator_function(parse_mixture)


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
    template: str = _f("default", "prompt template: default | plain | hash | boxed | short (p3o docs tasks)")
    system_prompt: str | None = _f(None, "system prompt of every prompt (chat template's system turn, else prefixed)")
    question_key: str | None = _f(None, "data field holding the question (None: the preset's or auto-detected)")
    answer_key: str | None = _f(None, "data field holding the reference answer (None: the preset's or auto-detected)")
    solution_key: str | None = _f(None, "data field holding a worked solution (None: the preset's or auto-detected)")
    test_fraction: float = _f(0.1, "held-out share of a single data file (a hash of the question decides)", ge=0, lt=1)
    n_train: int | None = _f(None, "number of training problems (None: all the task provides)", ge=1)
    eval_name: str | None = _f(None, "evaluation data: a file, folder or preset (None: task.name's held-out rows)")
    eval_split: str = _f("test", "split used for evaluation during and after training")
    n_eval: int = _f(512, "number of evaluation problems (0: no evaluation)", ge=0)
    allow_train_eval_overlap: bool = _f(
        False, "evaluate on training rows too (a single file is then not split); prints a warning"
    )
    reward_timeout_s: float = _f(1.0, "time limit of one verifier call, in seconds", gt=0)
    mixture: TaskMixture | None = _f(  # noqa: RUF009 - the default, None, is immutable
        None,
        "several tasks in one run with sampling weights, 'arithmetic:0.7,calc:0.3' (name:weight; a name as task.name "
        "takes, or calc); per-task metrics task/<name>/... (p3o docs tasks, Task mixtures); None: task.name alone",
    )


@dataclass
class RolloutConfig:
    """Sampling: how many completions per step and how the rollout engine generates and records log-probs."""

    engine: Literal["hf", "vllm"] = _f(
        "hf", "rollout engine: 'hf' (p3o's own sampling loop) or 'vllm' (vLLM; extra p3o[vllm], p3o docs vllm)"
    )
    prompts_per_step: int = _f(16, "prompts sampled per training step", ge=1)
    group_size: int = _f(4, "completions per prompt (G); advantages are relative within the group", ge=1)
    max_new_tokens: int = _f(48, "maximum response length T (longer responses are truncated)", ge=1)
    temperature: float = _f(1.0, "sampling temperature of the rollout engine", gt=0)
    top_p: float = _f(1.0, "nucleus sampling mass (1: off)", gt=0, le=1)
    top_k: int = _f(0, "top-k sampling (0: off)", ge=0)
    precision: Literal["fp32", "bf16", "fp16", "int8", "fp8", "fp8-tensor"] = _f(
        "fp32",
        "rollout engine copy: fp32 / bf16 / fp16 cast it; int8 / fp8 simulate W8A8 numerics (per-channel weights, "
        "per-token activations; no speed-up); fp8-tensor: vLLM's online FP8 layout (per-tensor scales, head "
        "unquantised); the trainer keeps model.dtype",
    )
    logprob_mode: Literal["processed", "raw"] = _f(
        "processed", "record log-probs of the distribution sampled from ('processed') or before temperature ('raw')"
    )
    replay_sampling_mask: bool | Literal["auto"] = _f(
        "auto",
        "record the set each token was sampled from (its top-k / top-p support) and take the trainer's log-probs over "
        "it, renormalised, so ratios stay importance weights; auto = true = when top_p < 1 or top_k > 0 (nothing "
        "to replay otherwise); false: the whole vocabulary (p3o docs rollout)",
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
        False, "workers take a newer policy version inside a running batch (hf: between decode steps; vllm: chunks)"
    )
    colocate: bool = _f(False, "Ray workers may share the trainer's devices (else they get devices of their own)")
    weight_sync: Literal["object_store", "collective"] = _f(
        "object_store",
        "how a new version reaches Ray workers: one object-store put, or a broadcast over a process group of its own "
        "(gloo on CPU, nccl on GPU; p3o docs scaling)",
    )


@dataclass
class TrainerConfig:
    """The trainer's recomputation of log-probs (``p3o.logprobs.token_logprobs``)."""

    temperature: float = _f(1.0, "temperature the trainer applies to logits when computing log-probs", gt=0)
    chunk_size: int = _f(256, "vocabulary-projection chunk (tokens) for memory-lean log-probs", ge=1)
    ref_model: bool = _f(False, "keep a frozen reference model for ref_logp (added anyway when an objective needs it)")
    gradient_checkpointing: bool = _f(False, "enable gradient checkpointing on the policy")
    strategy: Literal["auto", "ddp", "fsdp"] = _f(
        "auto",
        "data parallelism under torchrun: ddp (torch DDP, replicated), fsdp (FSDP2: parameters, gradients and AdamW "
        "states sharded); auto = ddp at world size > 1 (p3o docs scaling)",
    )
    mixed_precision: Literal["no", "bf16", "fp16"] = _f(
        "no", "compute precision over model.dtype master weights (bf16/fp16 forward and backward; fp16 adds a scaler)"
    )
    cpu_offload: bool = _f(False, "fsdp on GPUs: keep parameter and optimizer shards in host memory")


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
    max_tokens_per_micro_batch: int = _f(
        0,
        "token budget per micro-batch (rows x padded prompt+response width, longest first); 0: micro_batch_size "
        "sequences. With objective.scope micro-batch, P3O's ESS set then depends on it",
        ge=0,
    )


@dataclass
class OptimConfig:
    """AdamW and its learning-rate schedule."""

    lr: float = _f(2e-4, "peak learning rate", gt=0)
    weight_decay: float = _f(0.0, "AdamW weight decay", ge=0)
    betas: tuple[float, float] = _f((0.9, 0.999), "AdamW betas (beta1, beta2)")
    eps: float = _f(1e-8, "AdamW epsilon", gt=0)
    warmup_steps: int = _f(0, "linear warm-up steps (optimizer steps)", ge=0)
    schedule: Literal["constant", "cosine"] = _f("cosine", "learning-rate schedule after warm-up")
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
    baseline: Literal["mean", "asymre", "lowered"] = _f(
        "mean",
        "baseline: group mean; asymre = mean - alpha*(mean - min) (the MinPRO paper's AsymRE); lowered = mean - "
        "alpha*std (an earlier reconstruction, kept for the studies that ran it)",
    )
    alpha: float = _f(0.5, "asymre / lowered baseline: alpha", ge=0)
    eps: float = _f(1e-6, "added to the std before dividing", gt=0)


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
    resume: bool = _f(False, "continue run_dir's run from its newest intact checkpoint with its own config.yaml")


@dataclass
class RayConfig:
    """The Ray cluster the rollout workers run on (``rollout.workers > 0``; extra ``p3o[ray]``)."""

    address: str | None = _f(None, "an existing cluster to join ('auto', 'host:port'); None: start a local instance")
    num_cpus: int | None = _f(None, "logical CPUs of a local instance (None: Ray's own count)", ge=1)
    worker_python: str | None = _f(
        None, "Python of the rollout workers (e.g. .venv-vllm/bin/python; None: this one), with the same Ray version"
    )
    worker_resource: str | None = _f(
        None, "a custom Ray resource each worker asks one unit of (places workers on the nodes that declare it)"
    )


@dataclass
class AgentConfig:
    """Multi-turn agent episodes (docs/agents.md): an environment the model talks to between its turns.

    ``env`` None keeps the single-turn path (a prompt, one completion, the verifier). With an environment every
    training and held-out row is one episode: the model's turns (the loss mask) and the observations the environment
    appended (never in the loss, the ESS or the monitor), rewarded by the environment.
    """

    env: str | None = _f(
        None, "environment: a built-in name (calc, guess) or package.module:Name (None: single-turn, no environment)"
    )
    env_kwargs: dict[str, Any] = field(
        default_factory=dict,
        metadata={"help": "keywords of the environment's constructor, e.g. {latency_s: 0.05} for calc (a slow tool)"},
    )
    max_turns: int = _f(4, "model turns per episode", ge=1)
    max_turn_tokens: int = _f(48, "tokens the model may sample in one turn", ge=1)
    max_total_tokens: int = _f(160, "response tokens per episode, model and observation tokens together", ge=1)
    max_obs_tokens: int = _f(32, "tokens per observation (a longer one is cut in the middle, marked)", ge=1)
    tool_timeout_s: float = _f(
        2.0, "wall-clock limit of one tool call (killed past it; the model reads an error)", gt=0
    )
    max_tool_output_chars: int = _f(2000, "characters of a tool's result kept (a flood is cut and counted)", ge=1)
    env_timeout_s: float = _f(
        60.0, "wall-clock limit of one environment step (past it the episode is cut, scored 0, counted)", gt=0
    )
    overlap: bool = _f(
        False, "generate for ready episodes while others' tools run (faster, not reproducible; False: tick barrier)"
    )
    harness: str | None = _f(
        None,
        "an agent you already have, run against p3o's endpoint (p3o docs harness): package.module:function "
        "(async def f(client, model, problem) -> reward or dict) or verifiers:<module> (None: no harness)",
    )
    episode_timeout_s: float = _f(120.0, "wall-clock limit of one harness episode (past it: a counted fault)", gt=0)
    harness_concurrency: int = _f(64, "harness episodes running at once (over all harness processes)", ge=1)
    harness_processes: int = _f(
        2,
        "processes a package.module:function harness runs in, its episodes dealt among them (0: the trainer's "
        "process; a verifiers environment always runs there)",
        ge=0,
    )
    serve_host: str = _f("127.0.0.1", "address the harness endpoint binds (localhost: only this machine sends data)")
    serve_port: int = _f(0, "port of the harness endpoint (0: a free one; URL and key in run_dir/endpoint.json)", ge=0)
    serve_api_key: str | None = _f(None, "bearer key of the harness endpoint (None: generated per run, never logged)")
    tool_format: str = _f("auto", "tool-call format of the endpoint: auto (the tokenizer's), qwen3, llama3, none")
    serve_gather_s: float = _f(
        0.25,
        "the endpoint waits up to this long for every running harness episode's next call (one engine call)",
        ge=0,
    )


@dataclass
class TrainConfig:
    """Root config of one training run: ``p3o train`` with no arguments runs exactly these defaults.

    Defaults = the embedded default job: P3O on the built-in arithmetic task with the built-in tiny model.
    """

    cli_aliases: ClassVar[dict[str, str]] = {"resume": "ckpt.resume"}

    run_dir: str = _f("runs/default", "output directory (config.yaml, metrics.jsonl, checkpoints/, final/, plot.png)")
    overwrite: bool = _f(
        False, "replace an earlier run's outputs in run_dir (a fresh run otherwise refuses such a directory)"
    )
    seed: int = _f(0, "random seed (python, numpy, torch, sampling)")
    steps: int = _f(400, "training steps (one rollout batch each)", ge=1)
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
    agent: AgentConfig = field(default_factory=AgentConfig, metadata={"help": "multi-turn agent episodes"})

    def _cross_check(self) -> None:
        """The constraints between sections (one line each), then the objective's keywords typed by its record."""
        b1, b2 = self.optim.betas
        if not (0 <= b1 < 1 and 0 <= b2 < 1):
            raise ConfigError(f"optim.betas: each beta must be in [0, 1), got [{b1}, {b2}]")
        if not self.run_dir.strip():
            raise ConfigError("run_dir: must not be empty")
        if self.overwrite and self.ckpt.resume:
            raise ConfigError("overwrite: --overwrite replaces the run in run_dir and --resume continues it; pick one")
        if self.rollout.engine != "vllm":
            for key in ("kv_cache_dtype", "kv_cache_gib", "gpu_memory_utilization"):
                if getattr(self.rollout, key) != getattr(RolloutConfig(), key):
                    raise ConfigError(f"rollout.{key}: a vLLM setting; it needs rollout.engine vllm")
        if not self.rollout.workers:
            for key in ("address", "num_cpus", "worker_python", "worker_resource"):
                if getattr(self.ray, key) is not None:
                    raise ConfigError(f"ray.{key}: a Ray setting; it needs rollout.workers > 0 (Ray rollout workers)")
        if self.agent.harness and self.agent.env:
            raise ConfigError("agent.harness: a harness drives its own episodes; unset agent.env (or agent.harness)")
        if self.rollout.workers > 0 and self.loop.mode not in ("sync", "async"):
            raise ConfigError(
                f"rollout.workers: Ray rollout workers run with loop.mode sync or async, not {self.loop.mode}"
            )
        n, mini = self.rollout.prompts_per_step * self.rollout.group_size, self.update.num_mini_batches
        if mini > n:
            raise ConfigError(
                f"update.num_mini_batches: {mini} mini-batches but only {n} sequences per step "
                f"(rollout.prompts_per_step × rollout.group_size)"
            )
        if self.loop.overlong_penalty and self.loop.overlong_buffer > self.rollout.max_new_tokens:
            raise ConfigError(
                f"loop.overlong_buffer: {self.loop.overlong_buffer} exceeds rollout.max_new_tokens "
                f"{self.rollout.max_new_tokens}"
            )
        _check_objective(self.objective)

    def _extra_keys(self) -> list[str]:
        """The chosen objective's ``objective.<hyper>`` keys (nearest-name hints for a mistyped key; from the
        registry's snapshot, `objective_keys`: no torch)."""
        return [f"objective.{h}" for h in objective_keys().get(self.objective.name, {}).get("hypers", {})]
