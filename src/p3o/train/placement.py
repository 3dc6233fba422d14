"""Where the policy lives and how its gradients meet: one process, torch DDP or FSDP2, × the trainer's compute
precision. The ONE place that wraps the policy; the update step, the loop and the checkpoints call its methods and
never ask which strategy runs.

    placement = Placement(policy, PlacementSettings.of(cfg))   # DDP / fully_shard applied once, before the optimizer
    logp, ent = placement.logprobs(mb, grad=True)              # a forward through the wrapper, in compute precision
    with placement.accumulate(last=False):                     # DDP no_sync but the last; FSDP reduce-scatters each
        placement.backward(loss)
    grad_norm = placement.step(optimizer, scheduler, grad_clip)
    weights = placement.weights()                              # full tensors by name, gathered one at a time

Strategies (`train.strategy`):

* `auto`: `ddp` at world size > 1, one process otherwise (world size 1 is unchanged: no wrapper at all).
* `ddp`: `torch.nn.parallel.DistributedDataParallel` (gradient buckets, all-reduce overlapped with the backward).
  Every rank's loss is normalised by the step's GLOBAL token count, so the gradient of the step is the SUM of the
  ranks' gradients: a communication hook sums instead of DDP's mean. Micro-batches but the last of an optimizer step
  run under `no_sync()`.
* `fsdp`: FSDP2's `fully_shard` on every decoder layer (the classes in the HF model's `_no_split_modules`, or the
  elements of its `ModuleList`s) and on the root, over the data-parallel mesh: parameters, gradients and AdamW states
  are sharded (each rank holds 1/W of them as DTensor shards). The gradient divide factor is 1 (a sum, as above);
  every micro-batch's gradients are reduce-scattered into the shards as its backward runs (torchtune's way), so no
  rank holds the whole model's gradients during accumulation.

Mixed precision (`train.mixed_precision`): the parameters (master weights) and AdamW states stay in `model.dtype`
(float32 by default); forward and backward run in bf16 / fp16: FSDP2's `MixedPrecisionPolicy(param_dtype=…,
reduce_dtype=float32)`, `torch.autocast` otherwise. fp16 adds a gradient scaler (the sharded one under FSDP). The
vocabulary projection of `p3o.logprobs` still takes its log-softmax in float32.

Whole weights out (`weights`, `full_state_dict`): under FSDP the engines get full tensors gathered one parameter at a
time (`DTensor.full_tensor()`), streamed into each engine's own copy; LoRA sends the merged adapted layers. Every
rank must read such a mapping in the same order (each gather is a collective), which holds because every rank runs
the same engine code on it.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from transformers import AutoModelForCausalLM

from p3o import dist
from p3o.errors import ConfigError
from p3o.logprobs import token_logprobs
from p3o.models.lora import AdaptersOff, is_lora, merged_copy, merged_weights
from p3o.models.lora import _adapted_layers as adapted_layers
from p3o.train import checkpoint  # called through the module: tests patch its functions

try:  # FSDP2's public API (torch >= 2.6): only train.strategy fsdp needs it, one process and DDP import without it
    from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
except ImportError:  # pragma: no cover - an older torch (tests/train/test_sharded_trainer.py imports it so)

    class FSDPModule:  # type: ignore[no-redef]  # never an instance: no module is sharded
        pass


Strategy = Literal["auto", "ddp", "fsdp"]
Precision = Literal["no", "bf16", "fp16"]
STRATEGIES = ("auto", "ddp", "fsdp")
PRECISIONS = ("no", "bf16", "fp16")
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class PlacementSettings:
    """The trainer's placement: `train.strategy`, `train.mixed_precision`, `train.cpu_offload`."""

    strategy: str = "auto"
    mixed_precision: str = "no"
    cpu_offload: bool = False

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"train.strategy: unknown strategy {self.strategy!r}; known: {', '.join(STRATEGIES)}")
        if self.mixed_precision not in PRECISIONS:
            raise ConfigError(
                f"train.mixed_precision: unknown precision {self.mixed_precision!r}; known: {', '.join(PRECISIONS)}"
            )

    @classmethod
    def of(cls, cfg: Any) -> PlacementSettings:
        """The settings of a `p3o.config.TrainConfig` (its `train` section)."""
        t = cfg.train
        return cls(t.strategy, t.mixed_precision, t.cpu_offload)

    def resolved(self) -> str:
        """The strategy that runs: "single" (one process, no wrapper), "ddp" or "fsdp"."""
        if self.strategy == "fsdp":
            return "fsdp"
        return "ddp" if dist.world_size() > 1 else "single"


# A model attribute: only rank 0 read the model's weights (`p3o.train.wiring.read_on_rank0`); its value is the device
# the shards go to (the model is on rank 0's CPU and on the meta device elsewhere until it is sharded)
FROM_RANK0 = "p3o_weights_on_rank0"
FSDP_TORCH = "2.8"  # the first torch with every FSDP2 call below (plain-sum reductions: set_force_sum_reduction_…)


def fsdp_missing() -> str | None:
    """What this torch lacks for `train.strategy fsdp` (None: nothing): FSDP2's public `fully_shard` (torch 2.6) and
    `FSDPModule.set_gradient_divide_factor` / `set_force_sum_reduction_for_comms` (the plain-sum gradient reduction
    of the module docstring, later releases)."""
    if "fully_shard" not in globals():
        return "torch.distributed.fsdp.fully_shard"
    for name in ("set_gradient_divide_factor", "set_force_sum_reduction_for_comms"):
        if not hasattr(FSDPModule, name):
            return f"FSDPModule.{name}"
    return None


def check_placement(settings: PlacementSettings, device: torch.device) -> None:
    """One line (ConfigError) for a placement this process cannot run, before any model loads: fsdp on a torch
    without the FSDP2 calls it makes or outside torchrun, fp16 where the device has no fp16 autocast, CPU offload
    without a GPU to offload from."""
    missing = fsdp_missing() if settings.strategy == "fsdp" else None
    if missing:
        raise ConfigError(
            f"train.strategy fsdp: torch {torch.__version__} has no {missing}; FSDP needs torch >= {FSDP_TORCH} "
            "(one process and ddp run on this torch)"
        )
    if settings.strategy == "fsdp" and not dist.is_initialized():
        raise ConfigError(
            "train.strategy fsdp: needs a process group; launch with torchrun (torchrun --nproc_per_node N -m p3o "
            "train --train.strategy fsdp ...), --nproc_per_node 1 included"
        )
    if settings.mixed_precision != "no":
        dtype = _DTYPES[settings.mixed_precision]
        if not torch.amp.autocast_mode.is_autocast_available(device.type):
            raise ConfigError(f"train.mixed_precision {settings.mixed_precision}: no autocast on {device.type}")
        try:
            with torch.autocast(device.type, dtype=dtype):
                torch.ones(2, 2, device=device) @ torch.ones(2, 2, device=device)
        except (RuntimeError, AssertionError) as err:
            why = str(err).splitlines()[0][:120]
            raise ConfigError(
                f"train.mixed_precision {settings.mixed_precision}: the {device.type} device cannot run it ({why})"
            ) from None
    if settings.cpu_offload:
        if settings.strategy != "fsdp":
            raise ConfigError("train.cpu_offload: offloads FSDP shards; set --train.strategy fsdp")
        if device.type != "cuda":
            raise ConfigError(
                f"train.cpu_offload: the parameters already live on the {device.type}; CPU offload moves GPU shards "
                "to host memory (drop --train.cpu_offload)"
            )


class PolicyForward(nn.Module):
    """The policy as one module whose forward is `token_logprobs`: the unit DDP and FSDP's root wrap, so their
    hooks (DDP's reducer, FSDP's all-gathers of the root's embedding, norm and head) run on every trainer forward.

    forward(prompt_ids (n, p), prompt_mask, response_ids (n, t), mask, adapters_off, **options) -> (logp (n, t),
    entropy (n, t) or None, …): `options` are `token_logprobs`' keywords (temperature, chunk_size, with_entropy,
    loss_mask, kept). `adapters_off`: a LoRA policy's base alone (the frozen reference of `ref_kl_coef`), through the
    same wrapper.
    """

    def __init__(self, policy: nn.Module) -> None:
        super().__init__()
        self.policy = policy

    def forward(  # type: ignore[override]
        self,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        response_ids: Tensor,
        mask: Tensor,
        adapters_off: bool = False,
        **options: Any,
    ) -> tuple[Tensor, ...]:
        ctx = self.policy.disable_adapter() if adapters_off else contextlib.nullcontext()
        with ctx:
            return token_logprobs(self.policy, prompt_ids, prompt_mask, response_ids, mask, **options)


def _sum_hook(state, bucket):  # type: ignore[no-untyped-def]  # DDP rejects any annotation but dist.GradBucket
    """DDP communication hook: Σ over ranks (DDP's own divides by the world size; the loss is already global).
    (state, bucket: dist.GradBucket) -> Future of the summed flat bucket."""
    fut = torch.distributed.all_reduce(bucket.buffer(), async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The blocks FSDP shards one by one: modules whose class is in the HF model's `_no_split_modules` (the decoder
    layers, as verl and accelerate pick them), else every element of the model's `nn.ModuleList`s."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    base = model.get_base_model() if is_lora(model) else model
    names |= set(getattr(base, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if layers:
        return layers
    return [m for lst in model.modules() if isinstance(lst, nn.ModuleList) for m in lst]


class Placement:
    """The policy placed by `settings` (see the module docstring). `self.policy` stays the HF model (its parameters
    become DTensor shards under FSDP); `self.module` is what forwards go through.

    Build it after LoRA adapters are attached and before the optimizer (whose parameters are the placed ones).
    """

    def __init__(self, policy: nn.Module, settings: PlacementSettings | None = None) -> None:
        self.settings = settings or PlacementSettings()
        self.policy = policy
        self.strategy = self.settings.resolved()
        self.precision = self.settings.mixed_precision
        target = _from_rank0(policy)  # where a model only rank 0 read is to run
        self.device = target if target is not None else next(policy.parameters()).device
        self.compute_dtype = _DTYPES.get(self.precision)
        self.skeleton: nn.Module | None = None
        self._references: dict[int, PolicyForward] = {}
        forward = PolicyForward(policy)
        if self.strategy == "ddp":
            ids = [self.device.index] if self.device.type == "cuda" else None
            self.module: nn.Module = torch.nn.parallel.DistributedDataParallel(forward, device_ids=ids)
            self.module.register_comm_hook(None, _sum_hook)
        elif self.strategy == "fsdp":
            self.module = self._shard(forward)
        else:
            self.module = forward
        self.scaler = self._scaler()

    # -- wrapping ----------------------------------------------------------------------------------------------------
    def _shard(self, forward: PolicyForward) -> nn.Module:
        self.skeleton = _meta_skeleton(self.policy)
        _fully_shard(forward, self._shard_kw(), self.device)
        return forward

    def _shard_kw(self) -> dict[str, Any]:
        """fully_shard's arguments: the data-parallel mesh, the compute precision (float32 reductions), the offload."""
        mesh = init_device_mesh(self.device.type, (dist.world_size(),))
        mp = MixedPrecisionPolicy(param_dtype=self.compute_dtype, reduce_dtype=torch.float32)
        offload = CPUOffloadPolicy() if self.settings.cpu_offload else OffloadPolicy()
        return {"mesh": mesh, "mp_policy": mp, "offload_policy": offload}

    def place_reference(self, ref: nn.Module | None) -> nn.Module | None:
        """The frozen reference model (`ref_kl_coef`), placed like the policy. Under FSDP a full model is sharded as
        its own FSDP module (decoder layers + root, the policy's mesh, mixed precision and offload, as verl does):
        1/N of it per rank, and its log-probs come from the same computation as the policy's, so at identical weights
        the KL is exactly 0 (`logprobs(mb, module=ref)` runs it). A LoRA policy's base (`AdaptersOff`) goes through
        the policy's own wrapper; one process and DDP keep the reference as it is (run under the policy's
        autocast)."""
        if ref is None or not self.sharded or isinstance(ref, (AdaptersOff, PolicyForward)):
            return ref
        placed = self._references.get(id(ref))  # placed once: every later update step gets the same wrapper
        if placed is None:
            placed = self._references[id(ref)] = PolicyForward(ref.requires_grad_(False).eval())
            _fully_shard(placed, self._shard_kw(), self.device)
        return placed

    def _scaler(self) -> Any:
        if self.precision != "fp16":
            return None
        if self.strategy == "fsdp":
            return ShardedGradScaler(self.device.type)
        return torch.amp.GradScaler(self.device.type)

    @property
    def sharded(self) -> bool:
        """True under FSDP: parameters are DTensor shards, every weight read is a collective."""
        return self.strategy == "fsdp"

    def describe(self) -> dict[str, Any]:
        """What runs, for the run's record: strategy, world size, compute precision, parameter dtype."""
        pdtype = str(next(self.policy.parameters()).dtype).removeprefix("torch.")
        compute = {"no": pdtype, "bf16": "bfloat16", "fp16": "float16"}[self.precision]
        return {"strategy": self.strategy, "world_size": dist.world_size(), "param_dtype": pdtype, "compute": compute}

    def summary(self) -> str:
        """One line on how the trainer runs: strategy, world size, compute precision over the master weights' dtype."""
        d = self.describe()
        where = "one process" if d["strategy"] == "single" else f"{d['strategy']} over {d['world_size']} rank(s)"
        return f"trainer {where}; compute {d['compute']}, parameters and AdamW states {d['param_dtype']}"

    # -- forward / backward / step -----------------------------------------------------------------------------------
    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """torch.autocast in the compute dtype (one process and DDP); FSDP casts through its policy instead."""
        if self.compute_dtype is None or self.strategy == "fsdp":
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.compute_dtype)

    def logprobs(
        self,
        mb: Any,
        *,
        grad: bool,
        with_entropy: bool = False,
        temperature: float = 1.0,
        chunk_size: int = 256,
        adapters_off: bool = False,
        module: nn.Module | None = None,
    ) -> tuple[Tensor, ...]:
        """(n, t) log-probs (float32) of micro-batch `mb`'s responses under the placed policy, and their entropies;
        `module`: another placed forward to run instead (the sharded reference of `place_reference`). With `mb.kept`
        (the sampling mask replayed: `p3o.logprobs.token_logprobs`' kept) also the kept sets' mass (n, t)."""
        ctx = contextlib.nullcontext() if grad else torch.no_grad()
        with ctx, self.autocast():
            logp, ent, *mass = (module or self.module)(
                mb.prompt_ids,
                mb.prompt_mask,
                mb.response_ids,
                getattr(mb, "reads", mb.mask),  # the attention mask: an episode's observations too
                adapters_off,
                temperature=temperature,
                chunk_size=chunk_size,
                with_entropy=with_entropy,
                loss_mask=mb.mask
                if getattr(mb, "attn", None) is not None
                else None,  # the loss mask, where it differs
                kept=getattr(mb, "kept", None),
            )
        return logp.float(), (ent.float() if ent is not None else None), *mass

    def accumulate(self, last: bool) -> contextlib.AbstractContextManager[Any]:
        """The backward of a micro-batch. DDP: gradients are all-reduced only on the step's `last` one (`no_sync`
        before: every rank holds whole gradients anyway). FSDP: every micro-batch reduce-scatters its gradients into
        the rank's shard, as torchtune does: skipping the sync would keep the whole model's unsharded float32
        gradients on every rank until the last micro-batch (4Φ bytes per rank instead of 4Φ/N)."""
        if self.strategy == "ddp" and not last:
            return self.module.no_sync()  # type: ignore[operator]
        return contextlib.nullcontext()

    def held_gradient_bytes(self) -> int:
        """Bytes of gradients this rank holds now: its shards' `.grad` (local part) under FSDP, plus any unsharded
        gradient FSDP keeps between micro-batches; every parameter's `.grad` otherwise (a diagnostic: tests and
        benchmarks/trainer_scale.py)."""
        total = 0
        for p in self.policy.parameters():
            g = p.grad
            if g is not None:
                g = g.to_local() if hasattr(g, "to_local") else g
                total += g.numel() * g.element_size()
        if self.sharded:
            for unit in self.module.modules():
                group = unit._get_fsdp_state()._fsdp_param_group if isinstance(unit, FSDPModule) else None
                for fp in group.fsdp_params if group is not None else ():
                    for g in (fp._unsharded_param.grad if hasattr(fp, "_unsharded_param") else None,
                              fp.unsharded_accumulated_grad):  # fmt: skip
                        total += 0 if g is None else g.numel() * g.element_size()
        return total

    def backward(self, loss: Tensor) -> None:
        """loss.backward(), scaled by the fp16 gradient scaler when there is one."""
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def trainable(self) -> list[nn.Parameter]:
        """The parameters the optimizer updates (DTensor shards under FSDP)."""
        return [p for p in self.policy.parameters() if p.requires_grad]

    def step(self, optimizer: torch.optim.Optimizer, scheduler: Any, grad_clip: float) -> Tensor:
        """Unscale (fp16), clip the global gradient norm to `grad_clip` (≤ 0: measure only; under FSDP the norm of
        the sharded gradients over all ranks), step the optimizer (skipped by the scaler on inf/NaN) and the schedule,
        zero the gradients; returns the norm before clipping (0-d float32, the same on every rank)."""
        params = self.trainable()
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)
        max_norm = grad_clip if grad_clip and grad_clip > 0 else float("inf")
        gn = torch.nn.utils.clip_grad_norm_(params, max_norm)
        if hasattr(gn, "full_tensor"):
            gn = gn.full_tensor()
        if self.scaler is not None:
            self.scaler.step(optimizer)
            self.scaler.update()
        else:
            optimizer.step()
        if scheduler is not None:
            scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        return gn.detach().float()

    # -- whole weights out -------------------------------------------------------------------------------------------
    def weights(self) -> Mapping[str, Tensor]:
        """What an engine sync sends: the state dict (LoRA: the merged adapted layers only); under FSDP a mapping
        that gathers each full tensor when read (a collective: every rank reads it in the same order)."""
        if not self.sharded:
            return self._unsharded(whole=False)
        return GatheredWeights(self.policy)

    def push_weights(self, remote: bool) -> Mapping[str, Tensor]:
        """What a weight push sends: in-process engines read `weights` (under FSDP each full tensor is gathered when
        the engine reads it); `remote` (Ray workers) under FSDP: rank 0's `full_state_dict` (every rank gathers, the
        others send nothing)."""
        return self.full_state_dict() if remote and self.sharded else self.weights()

    def for_evaluation(self) -> EvaluationWeights:
        """The weights of an in-loop evaluation; every rank calls it. Under FSDP every rank gathers now (a collective)
        and rank 0 keeps the full CPU state dict, from which the evaluation's model is built; otherwise the view reads
        the policy when the evaluation asks (`weights`, `engine_model`)."""
        if not self.sharded:
            return EvaluationWeights(self.weights, self.engine_model)
        full = self.full_state_dict()
        return EvaluationWeights(lambda: full, lambda: self.materialize(full))

    def full_state_dict(self) -> dict[str, Tensor]:
        """Every rank calls it; rank 0 gets the full CPU state dict of the plain model (LoRA merged), gathered one
        tensor at a time; the other ranks get {} (final/, the in-loop evaluation, Ray workers' object store)."""
        out: dict[str, Tensor] = {}
        main = dist.is_main()
        for k, v in self.plain_weights().items():
            if main:
                out[k] = v.detach().to("cpu", copy=True)
        return out

    def plain_weights(self) -> Mapping[str, Tensor]:
        """Every tensor of the plain (LoRA merged) model by its plain key, full (gathered on read under FSDP)."""
        if not self.sharded:
            return self._unsharded(whole=True).state_dict()
        return GatheredWeights(self.policy, whole=True)

    def engine_model(self) -> nn.Module:
        """A plain full model for a new engine to copy (LoRA merged). Under FSDP it is built from the meta skeleton
        with the gathered weights (every rank calls it)."""
        if not self.sharded:
            return self._unsharded(whole=True)
        return self.materialize(self.plain_weights())

    def _unsharded(self, whole: bool) -> Any:
        """The unsharded policy's plain view, the one place the LoRA merge is asked for: `whole` the plain model (the
        policy itself, or a merged copy), else the tensors an engine sync sends (the state dict, or the merged
        adapted layers only)."""
        if not is_lora(self.policy):
            return self.policy if whole else self.policy.state_dict()
        return merged_copy(self.policy) if whole else merged_weights(self.policy)

    def materialize(self, weights: Mapping[str, Tensor]) -> nn.Module:
        """The plain model of the skeleton filled with `weights` (full tensors by plain key), on the CPU: beside a
        rank's shard on the GPU it costs host memory only (final/ is saved from it; an engine copies it to its own
        device)."""
        assert self.skeleton is not None
        model = copy.deepcopy(self.skeleton).to_empty(device="cpu")
        own = model.state_dict(keep_vars=True)
        with torch.no_grad():
            for k, v in weights.items():
                if k in own:
                    own[k].data.copy_(v)
            # buffers are not sharded and some are not in the state dict (rotary inv_freq): take the policy's own
            base = self.policy.get_base_model() if is_lora(self.policy) else self.policy
            buffers = dict(base.named_buffers())
            for k, b in model.named_buffers():
                if k in buffers:
                    b.copy_(buffers[k])
        if hasattr(model, "tie_weights"):
            model.tie_weights()
        return model.requires_grad_(False).eval()

    # -- checkpoints and final/ ---------------------------------------------------------------------------------------
    def save_checkpoint(
        self,
        run_dir: Path,
        step: int,
        *,
        optimizer: torch.optim.Optimizer,
        scheduler: Any,
        source_state: Any,
        keep_last: int,
        tokenizer: Any = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        """A checkpoint after `step` steps; every rank calls it. Under FSDP every rank writes its shard
        (torch.distributed.checkpoint); otherwise rank 0 writes the policy and the others wait at a barrier.

        loop_state = {"rank_source": {rank: source_state}} (every rank's batch source, gathered) plus `extra` (rank
        0's, e.g. the off-policy monitor's window); every rank's own RNG states go to the checkpoint's per-rank RNG,
        which `load_checkpoint` restores on each rank.
        """
        sources = dist.all_gather_object(source_state)
        rng = checkpoint.gather_rng_states()  # every rank's own Python / NumPy / torch / CUDA generators (collective)
        loop_state = {"rank_source": dict(enumerate(sources)), **(extra or {})}
        saved = dict(optimizer=optimizer, scheduler=scheduler, loop_state=loop_state, keep_last=keep_last, rng=rng)
        if self.sharded:
            checkpoint.save_sharded_checkpoint(run_dir, step, model=self.policy, placement=self.describe(), **saved)
            return
        if dist.is_main():
            checkpoint.save_checkpoint(run_dir, step, model=self.policy, tokenizer=tokenizer, **saved)
        dist.barrier()

    def load_checkpoint(self, run_dir: Path, optimizer: torch.optim.Optimizer, scheduler: Any) -> Any:
        """The newest intact checkpoint of `run_dir` into the policy (its shards under FSDP, resharded from any world
        size), the optimizer and the schedule (`p3o.train.checkpoint.load_checkpoint`); None when there is none."""
        return checkpoint.load_checkpoint(run_dir, model=self.policy, optimizer=optimizer, scheduler=scheduler)

    def save_final(self, out_dir: Path, tokenizer: Any) -> None:
        """final/: the plain HF model (LoRA merged) on rank 0; every rank calls it (under FSDP the full weights are
        gathered, a collective, and rank 0 builds the plain model from them on the CPU)."""
        full = self.full_state_dict() if self.sharded else {}
        if dist.is_main():
            checkpoint.save_policy(out_dir, self.materialize(full) if self.sharded else self.engine_model(), tokenizer)


@dataclass(frozen=True)
class EvaluationWeights:
    """What an in-loop evaluation reads, each when it needs it (`p3o.train.evaluation.Evaluator`): `weights()` the
    tensors a loaded engine takes, `model()` a plain model a new engine copies."""

    weights: Callable[[], Mapping[str, Tensor]]
    model: Callable[[], nn.Module]


def _fully_shard(forward: PolicyForward, kw: dict[str, Any], device: torch.device) -> None:
    """FSDP2 on every decoder layer of `forward.policy` and on `forward` (the root: embedding, norm, head); every
    unit reduces gradients as a plain sum over ranks (module docstring).

    A model only rank 0 read (`FROM_RANK0`: the others hold its structure on the meta device) is sharded as it is,
    given storage on `device` (`to_empty`) and filled from rank 0's tensors, broadcast one at a time into every
    rank's shard (`set_model_state_dict(..., broadcast_from_rank0=True)`, torchtune's way), its buffers (not
    sharded; rotary tables are in no state dict) broadcast whole: no other rank ever holds the whole model."""
    model = forward.policy
    from_rank0 = _from_rank0(model) is not None
    main = dist.is_main()
    full = dict(model.state_dict()) if from_rank0 and main else {}  # rank 0's CPU tensors, until broadcast
    buffers = [b for _, b in model.named_buffers()] if from_rank0 and main else []
    for layer in decoder_layers(model):
        fully_shard(layer, **kw)
    fully_shard(forward, **kw)
    for unit in forward.modules():  # every FSDP unit (the setting does not recurse)
        if isinstance(unit, FSDPModule):
            unit.set_gradient_divide_factor(1.0)  # Σ over ranks, not the mean (module docstring)
            unit.set_force_sum_reduction_for_comms(True)  # plain SUM collectives (gloo has no PREMUL_SUM)
    if not from_rank0:
        return
    forward.to_empty(device=device)
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=True)
    set_model_state_dict(model, full, options=options)
    with torch.no_grad():
        for i, (_, b) in enumerate(model.named_buffers()):
            if main:
                b.copy_(buffers[i])
            torch.distributed.broadcast(b, src=0)


def _from_rank0(model: nn.Module) -> torch.device | None:
    """The device a model only rank 0 read is to run on (`FROM_RANK0`), None for a model every rank holds."""
    base = model.get_base_model() if is_lora(model) else model
    return getattr(base, FROM_RANK0, None)


def _meta_skeleton(policy: nn.Module) -> nn.Module:
    """The plain HF model's structure on the meta device (no memory): what `Placement.materialize` fills."""
    base = policy.get_base_model() if is_lora(policy) else policy
    with torch.device("meta"):
        skel = AutoModelForCausalLM.from_config(base.config, torch_dtype=next(policy.parameters()).dtype)
    return skel


def _full(t: Tensor) -> Tensor:
    """The whole tensor of a DTensor shard (a collective), or `t` itself."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _full_copy(t: Tensor) -> Tensor:
    """The whole tensor of `t` as a tensor of its own (safe to change in place): the gathered one, copied only where
    it is `t`'s own storage (one rank, or an unsharded tensor)."""
    w = _full(t)
    local = t.to_local() if hasattr(t, "to_local") else t
    return w.clone() if w.untyped_storage().data_ptr() == local.untyped_storage().data_ptr() else w


class GatheredWeights(Mapping[str, Tensor]):
    """Full tensors of a sharded policy by plain key, each gathered when read (`DTensor.full_tensor()`, a
    collective) and dropped by the reader: no rank holds a second full state dict. With LoRA, `whole=False` gives the
    merged adapted layers only (what an engine sync sends), `whole=True` every tensor of the merged plain model.

    Every rank must read the same keys in the same order. A tensor under two keys (tied embeddings) is gathered
    once: both keys give the same full tensor (kept only until read under both).
    """

    def __init__(self, policy: nn.Module, whole: bool = False) -> None:
        self.policy = policy
        self.lora = is_lora(policy)
        self._merged: dict[str, tuple[nn.Module, Tensor]] = {}
        if self.lora:
            for name, mod in adapted_layers(policy):
                self._merged[f"{name}.weight"] = (mod, mod.get_base_layer().weight)
            base = policy.get_base_model()
            plain = {_plain_key(k): v for k, v in base.state_dict(keep_vars=True).items() if "lora_" not in k}
            self._plain = plain if whole else {k: plain[k] for k in self._merged}
        else:
            self._plain = dict(policy.state_dict(keep_vars=True))  # tied tensors: one object under two keys
        self._keys_of: dict[int, int] = {}  # id(tensor) -> how many keys name it (2: tied embeddings)
        for v in self._plain.values():
            self._keys_of[id(v)] = self._keys_of.get(id(v), 0) + 1
        self._shared: dict[int, list[Any]] = {}  # id(tensor) -> [its full tensor, reads left]

    def __iter__(self) -> Iterator[str]:
        return iter(self._plain)

    def __len__(self) -> int:
        return len(self._plain)

    def __getitem__(self, key: str) -> Tensor:
        if key in self._merged:
            mod, base = self._merged[key]
            w = _full_copy(base.detach())  # the merge adds in place: never into the parameter, no second copy
            for adapter in mod.active_adapters:
                if adapter in mod.lora_A:
                    a = _full(mod.lora_A[adapter].weight.detach())
                    b = _full(mod.lora_B[adapter].weight.detach())
                    delta = (b @ a) * mod.scaling[adapter]
                    w += (delta.T if getattr(mod, "fan_in_fan_out", False) else delta).to(w.dtype)
            return w
        t = self._plain[key]
        if self._keys_of[id(t)] == 1:
            return _full(t.detach())
        entry = self._shared.setdefault(id(t), [None, self._keys_of[id(t)]])
        if entry[0] is None:
            entry[0] = _full(t.detach())
        entry[1] -= 1
        if entry[1] == 0:  # read under every key: released
            del self._shared[id(t)]
        return entry[0]


def _plain_key(key: str) -> str:
    """A PEFT base model's state-dict key as the plain model's ("…q_proj.base_layer.weight" -> "…q_proj.weight")."""
    return key.replace(".base_layer.", ".")


__all__ = [
    "FROM_RANK0",
    "FSDP_TORCH",
    "PRECISIONS",
    "STRATEGIES",
    "EvaluationWeights",
    "GatheredWeights",
    "Placement",
    "PlacementSettings",
    "PolicyForward",
    "check_placement",
    "decoder_layers",
    "fsdp_missing",
]
