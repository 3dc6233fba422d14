"""Crash-safe training checkpoints: policy weights, optimizer, scheduler, RNG states and the loop's own state.

Layout under a run directory::

    checkpoints/
      step_000020/
        policy/               save_pretrained (safetensors) + tokenizer files; with LoRA the adapters only
                              (PEFT format: adapter_model.safetensors + adapter_config.json)
        trainer_state.pt      {"format", "step", "optimizer", "scheduler", "rng": {rank: states}, "loop_state"}
        meta.json             written last: {"step", "format", "time", "files": {path: {"size", "sha256"}}};
                              a directory without it is incomplete, one whose files differ from it is damaged
      step_000040/ ...
      latest                  text file naming the newest complete checkpoint ("step_000040")

    rng = gather_rng_states()              # every rank calls it (a collective); rank 0 then saves
    path = save_checkpoint(run_dir, 40, model=model, tokenizer=tok, optimizer=opt, rng=rng, loop_state={"fifo": [...]})
    state = load_checkpoint(run_dir, model=model, optimizer=opt)   # None when there is none; state["step"] == 40

Atomicity: everything is written into a hidden temporary directory in ``checkpoints/`` (same filesystem),
each file is fsync'ed, then the directory is renamed into place with ``os.replace`` and the ``latest``
pointer is replaced atomically. A crash at any point leaves the previous checkpoints intact and loadable;
left-over temporary directories are ignored by the loader and removed by the next save. Only one process
(rank 0) should call :func:`save_checkpoint`. A save that fails (a full disk, a file-size limit) removes its
temporary directory and raises :class:`CheckpointWriteError`, one line naming the intact checkpoint to resume from.

Damage: meta.json records the size and sha256 of every file of the checkpoint. :func:`load_checkpoint` checks them
(:func:`p3o.models.checkpoints.checkpoint_damage`) and skips a damaged checkpoint (a truncated copy, a disk that
filled after the rename) with one :class:`CheckpointWarning`, taking the newest intact one; with none intact it
raises P3OError naming each one and what is wrong with it.

RNG: every rank's own generators (Python, NumPy, torch CPU, CUDA) are saved under its rank and each rank restores
its own; a rank the checkpoint holds no state for (or, in a format-1 checkpoint, any rank but 0) keeps the
generators it seeded itself.

Sharded (``train.strategy fsdp``, :func:`save_sharded_checkpoint`, every rank calls it): ``policy/`` is replaced by
``sharded/``, a ``torch.distributed.checkpoint`` directory where every rank writes its own shard of the policy and of
the AdamW states (``__<rank>_0.distcp`` + ``.metadata``); ``trainer_state.pt`` keeps the scheduler, the RNG states and
the loop state, and meta.json records every shard file, so the damage check and the atomic rename work as above.
:func:`load_checkpoint` reshards on load: a sharded checkpoint loads at any world size and into an unsharded model
(DCP reads the saved shards into whatever placement the model has now), and a ``policy/`` checkpoint loads into a
sharded model (its full tensors are scattered, its AdamW state re-keyed by parameter name).

Where the parts live: the RNG states in :mod:`p3o.train.rng`, the intact-checkpoint verdicts (the same on every
rank) in :mod:`p3o.train.intact`, reading weights and the loads into a sharded model in :mod:`p3o.train.weights`;
every name above is imported from here.

Security: ``trainer_state.pt`` is read with ``torch.load(weights_only=True)``: tensors and plain Python values
(dict, list, tuple, str, int, float, bool, None) only, so loading a checkpoint never runs code from it.
``save_checkpoint`` refuses a ``loop_state`` holding anything else (buffered ``Rollouts`` are stored as plain dicts,
``p3o.train.sources.rollouts_to_state``). Format-1 checkpoints, whose NumPy RNG state is an ndarray, load through
an allowlist of exactly the NumPy types that state needs.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import time
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_model
from torch.distributed.checkpoint.state_dict import get_state_dict
from transformers.utils import logging as hf_logging

from p3o import dist
from p3o.errors import CheckpointWriteError, P3OError
from p3o.models.checkpoints import (  # the layout and its read-only lookups live below training (p3o eval uses them)
    CKPT_DIR,
    LATEST,
    META_FILE,
    POLICY_DIR,
    SHARDED_DIR,
    STATE_FILE,
    checkpoint_damage,
    checkpoint_step,
    file_digest,
    file_records,
    latest_checkpoint,
    list_checkpoints,
)
from p3o.models.checkpoints import is_complete_checkpoint as is_complete
from p3o.models.lora import is_lora
from p3o.train.intact import agreed_damage, candidates, intact_checkpoint, together
from p3o.train.rng import gather_rng_states, rng_state, set_rng_state
from p3o.train.weights import load_full_into_sharded, load_optimizer_into_sharded, load_sharded, read_weights

__all__ = [
    "CKPT_DIR",
    "CheckpointWarning",
    "CheckpointWriteError",
    "checkpoint_damage",
    "intact_checkpoint",
    "LATEST",
    "STATE_FILE",
    "checkpoint_step",
    "gather_rng_states",
    "is_complete",
    "latest_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "load_policy_weights",
    "rng_state",
    "save_checkpoint",
    "save_policy",
    "save_sharded_checkpoint",
    "set_rng_state",
]

FORMAT = 2  # 2: per-rank RNG states, NumPy's as a tensor (weights_only loadable); 1: rank 0's RNG, NumPy ndarray
_TMP_PREFIX = ".tmp-"
_OLD_PREFIX = ".old-"


class CheckpointWarning(UserWarning):
    """A checkpoint was skipped on resume because its files differ from what its meta.json records."""


# --------------------------------------------------------------------------------------------------------------------
# Small file-system helpers
# --------------------------------------------------------------------------------------------------------------------


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())


def _fsync_dir(path: Path) -> None:
    """fsync a directory so a rename inside it is durable (no-op where the OS does not support it)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - e.g. Windows
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            _fsync_file(Path(dirpath) / name)
        _fsync_dir(Path(dirpath))


def _atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file, fsync and ``os.replace``."""
    tmp = path.with_name(f"{_TMP_PREFIX}{path.name}-{os.getpid()}")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The underlying module of a DDP / FSDP / torch.compile wrapper."""
    while True:
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if not isinstance(inner, torch.nn.Module):
            return model
        model = inner


# --------------------------------------------------------------------------------------------------------------------
# Policy weights
# --------------------------------------------------------------------------------------------------------------------


def save_policy(out_dir: str | Path, model: torch.nn.Module, tokenizer: Any = None) -> Path:
    """Write the policy to ``out_dir`` (safetensors; ``save_pretrained`` when the model has it) plus the tokenizer.

    Used for ``checkpoints/step_XXXXXX/policy`` and a run's ``final/``. ``out_dir`` is written through a temporary
    sibling directory and renamed into place, so a crash never leaves a half-written ``out_dir``.
    """
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.with_name(f"{_TMP_PREFIX}{out_dir.name}-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    _write_policy(tmp, model, tokenizer)
    _fsync_tree(tmp)
    _swap_in(tmp, out_dir)
    return out_dir


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """Silence transformers' "Writing model shards" bar, which would break the training progress bar."""
    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _write_policy(out_dir: Path, model: torch.nn.Module, tokenizer: Any) -> None:
    model = _unwrap(model)
    out_dir.mkdir(parents=True, exist_ok=True)
    if hasattr(model, "save_pretrained"):
        with _quiet_transformers():
            model.save_pretrained(out_dir, safe_serialization=True)
    else:
        save_model(model, str(out_dir / "model.safetensors"))
    if tokenizer is not None:
        tokenizer.save_pretrained(out_dir)


def load_policy_weights(model: torch.nn.Module, policy_dir: str | Path) -> None:
    """Load the safetensors weights in ``policy_dir`` into ``model`` in place (parameters keep their identity).

    Tied parameters dropped by ``save_pretrained`` (e.g. ``lm_head.weight`` tied to the embedding) are accepted as
    missing; any other missing or unexpected key raises P3OError naming it. A LoRA (PEFT) model loads a PEFT
    adapter directory (``adapter_model.safetensors``) into its adapters; the base weights are left as they are.
    """
    policy_dir = Path(policy_dir)
    state = read_weights(policy_dir)
    model = _unwrap(model)
    has_adapters = (policy_dir / "adapter_config.json").is_file()
    if has_adapters != is_lora(model):
        saved, given = ("LoRA adapters", "a full model") if has_adapters else ("a full model", "a LoRA model")
        raise P3OError(f"{policy_dir}: holds {saved} but {given} was given (model.lora.r must match the run's)")
    if has_adapters:
        _load_adapters(model, state, policy_dir)
        return
    missing, unexpected = model.load_state_dict(state, strict=False)
    # A missing key is fine when its tensor shares storage with a loaded one (weight tying).
    params = dict(model.state_dict(keep_vars=True))
    loaded_ptrs = {params[k].data_ptr() for k in state if k in params}
    missing = [k for k in missing if params[k].data_ptr() not in loaded_ptrs]
    if missing or unexpected:
        what = f"missing {missing[:3]}" if missing else f"unexpected {unexpected[:3]}"
        raise P3OError(f"{policy_dir}: weights do not match the model ({what})")


def _load_adapters(model: torch.nn.Module, state: dict[str, torch.Tensor], policy_dir: Path) -> None:
    """Load a PEFT adapter state dict into a PEFT model; a missing or unexpected adapter tensor raises P3OError."""
    from peft import set_peft_model_state_dict  # optional: peft (extra lora); only a LoRA run gets here

    result = set_peft_model_state_dict(model, state)
    missing = [k for k in result.missing_keys if "lora_" in k]
    unexpected = list(result.unexpected_keys)
    if missing or unexpected:
        what = f"missing {missing[:3]}" if missing else f"unexpected {unexpected[:3]}"
        raise P3OError(f"{policy_dir}: adapters do not match the model ({what}; same model.lora.* as the run?)")


# --------------------------------------------------------------------------------------------------------------------
# Checkpoints
# --------------------------------------------------------------------------------------------------------------------


def _swap_in(tmp: Path, final: Path) -> None:
    """Rename the finished ``tmp`` directory to ``final``; an existing ``final`` is moved aside first, then deleted."""
    old = None
    if final.exists():
        old = final.with_name(f"{_OLD_PREFIX}{final.name}-{os.getpid()}-{time.monotonic_ns()}")
        os.replace(final, old)
    os.replace(tmp, final)
    _fsync_dir(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    *,
    model: torch.nn.Module,
    tokenizer: Any = None,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    loop_state: dict[str, Any] | None = None,
    keep_last: int = 2,
    rng: Mapping[int, dict[str, Any]] | None = None,
) -> Path:
    """Atomically write ``run_dir/checkpoints/step_{step:06d}/`` and point ``latest`` at it; returns its path.

    Args:
        run_dir: the run directory (``checkpoints/`` is created inside it).
        step: the number of completed training steps; the loop resumes at ``step``.
        model: the policy (DDP/FSDP/compile wrappers are unwrapped); saved with ``save_pretrained`` (safetensors).
        tokenizer: saved next to the weights when given.
        optimizer, scheduler: their ``state_dict()`` go to ``trainer_state.pt``.
        loop_state: what the loop needs to resume (its sources' buffers, ...): tensors and plain Python values
            only (dict, list, tuple, str, int, float, bool, None), as ``torch.load(weights_only=True)`` reads them;
            anything else raises P3OError naming where it sits.
        keep_last: complete step checkpoints kept after this save (older ones are deleted; >= 1).
        rng: every rank's generator states, ``{rank: rng_state()}`` (:func:`gather_rng_states`); None saves only
            this process's, under its own rank.

    A failure anywhere before the final rename leaves only a hidden ``.tmp-*`` directory, which loaders ignore.
    """
    if keep_last < 1:
        raise P3OError(f"ckpt.keep_last: must be >= 1, got {keep_last}")
    if step < 0:
        raise P3OError(f"checkpoint step must be >= 0, got {step}")
    _check_plain(loop_state, "loop_state")
    root = Path(run_dir) / CKPT_DIR
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(f"{_TMP_PREFIX}step_*"):  # debris of an earlier crash
        shutil.rmtree(stale, ignore_errors=True)
    for stale in root.glob(f"{_OLD_PREFIX}step_*"):
        shutil.rmtree(stale, ignore_errors=True)

    name = f"step_{step:06d}"
    final = root / name
    tmp = root / f"{_TMP_PREFIX}{name}-{os.getpid()}"
    try:
        _write_policy(tmp / POLICY_DIR, model, tokenizer)
        optim = optimizer.state_dict() if optimizer is not None else None
        _commit(tmp, final, _trainer_state(step, optim, scheduler, rng, loop_state))
    except BaseException as err:
        shutil.rmtree(tmp, ignore_errors=True)
        # a full disk or a file-size limit: OSError from Python's writes, SafetensorError from safetensors' (Rust)
        if isinstance(err, OSError | RuntimeError) or type(err).__name__ == "SafetensorError":
            raise _write_error(run_dir, name, err) from None
        raise
    _prune(root, keep_last, keep=final)
    return final


def _trainer_state(
    step: int, optimizer: Any, scheduler: Any, rng: Mapping[int, dict[str, Any]] | None, loop_state: Any
) -> dict[str, Any]:
    """trainer_state.pt's content: format, step, the optimizer's state dict (or None), the scheduler's, every rank's
    RNG states (this process's alone when `rng` is None) and the loop state."""
    return {
        "format": FORMAT,
        "step": int(step),
        "optimizer": optimizer,
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "rng": {int(r): s for r, s in rng.items()} if rng is not None else {dist.rank(): rng_state()},
        "loop_state": loop_state,
    }


def _commit(tmp: Path, final: Path, state: dict[str, Any], known: dict[str, Any] | None = None) -> None:
    """Finish a checkpoint written into `tmp`: trainer_state.pt, then meta.json (sizes and sha256 of every file,
    written last; `known`: records other ranks made of their own shards), fsync, rename into `final` and point
    ``latest`` at it."""
    torch.save(state, tmp / STATE_FILE)
    known = known or {}
    files = dict(sorted({**known, **file_records(tmp, skip=(META_FILE, *known))}.items()))
    meta = {"format": FORMAT, "step": state["step"], "time": time.time(), "files": files}
    (tmp / META_FILE).write_text(json.dumps(meta) + "\n")
    _fsync_tree(tmp)
    _swap_in(tmp, final)
    _atomic_write_text(final.parent / LATEST, final.name + "\n")


def _write_error(run_dir: str | Path, name: str, err: BaseException) -> CheckpointWriteError:
    """The one line for a save that failed: what failed, and the intact checkpoint a resume would take."""
    text = (str(err).strip().splitlines() or [type(err).__name__])[0]
    io = re.search(r"I/O error: (.*?) \(os error \d+\)", text)  # safetensors' wording of an OSError
    why = getattr(err, "strerror", None) or (io.group(1) if io else text[:160])
    intact, _ = intact_checkpoint(run_dir)
    kept = (
        f"the previous checkpoint {intact.name} is intact; `p3o train --run_dir {run_dir} --resume` continues from it"
        if intact is not None
        else "there is no earlier checkpoint to resume from"
    )
    return CheckpointWriteError(f"checkpoint {name} could not be written ({why}); nothing of it was kept, {kept}")


_PLAIN = (str, int, float, bool, type(None), torch.Tensor)


def _check_plain(obj: Any, where: str) -> None:
    """Raise P3OError unless ``obj`` is made of tensors and plain Python values (what weights_only loading reads)."""
    if isinstance(obj, _PLAIN):
        return
    if isinstance(obj, dict):
        for k, v in obj.items():
            if not isinstance(k, (str, int)):
                raise P3OError(f"checkpoint {where}: key {k!r} of type {type(k).__name__} (use str or int keys)")
            _check_plain(v, f"{where}[{k!r}]")
        return
    if isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _check_plain(v, f"{where}[{i}]")
        return
    raise P3OError(
        f"checkpoint {where}: a {type(obj).__name__} cannot be saved (tensors and plain Python values only, which "
        "torch.load(weights_only=True) reads back; convert it, e.g. rollouts_to_state for Rollouts)"
    )


def _legacy_numpy_globals() -> list[Any]:
    """The NumPy types a format-1 checkpoint's RNG state (an ndarray of uint32) needs to unpickle."""
    core = getattr(np, "_core", None) or np.core
    return [np.ndarray, np.dtype, core.multiarray._reconstruct, type(np.dtype(np.uint32))]


def _read_state(path: Path, map_location: str | torch.device) -> Any:
    """``torch.load(weights_only=True)`` of a trainer state (format-1 files through the NumPy allowlist)."""
    with torch.serialization.safe_globals(_legacy_numpy_globals()):
        return torch.load(path, map_location=map_location, weights_only=True)


def _restore_own_rng(saved: Any) -> None:
    """Restore this rank's generators from a checkpoint's ``rng`` entry (format 2: by rank; format 1: rank 0 only)."""
    if not isinstance(saved, dict):
        return
    if "python" in saved:  # format 1 holds rank 0's states: other ranks keep the generators they seeded themselves
        own = saved if dist.rank() == 0 else None
    else:
        own = saved.get(dist.rank())
    if own is not None:
        set_rng_state(own)


def _prune(root: Path, keep_last: int, keep: Path) -> None:
    """Delete all but the newest ``keep_last`` complete checkpoints (never ``keep``)."""
    found = list_checkpoints(root)
    for p in found[: max(0, len(found) - keep_last)]:
        if p != keep:
            shutil.rmtree(p, ignore_errors=True)


def _resolve(path_or_run_dir: str | Path) -> list[Path]:
    """Candidate checkpoint directories, newest first: one explicit checkpoint, or every checkpoint of a run."""
    path = Path(path_or_run_dir)
    if checkpoint_step(path) is not None or (path / STATE_FILE).exists():
        if not is_complete(path):
            raise P3OError(f"{path}: not a complete checkpoint (missing {META_FILE}, {STATE_FILE} or {POLICY_DIR}/)")
        return [path]
    if not path.exists():
        raise P3OError(f"{path}: no such run directory or checkpoint")
    return candidates(path)


def load_checkpoint(
    path_or_run_dir: str | Path,
    *,
    model: torch.nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    restore_rng: bool = True,
    map_location: str | torch.device = "cpu",
) -> dict[str, Any] | None:
    """Restore the newest loadable checkpoint into the given objects; None when a run has no checkpoint yet.

    ``path_or_run_dir`` is a run directory (or its ``checkpoints/``), which picks the newest complete checkpoint and
    falls back to older ones when one is damaged (its files differ from meta.json's record, or cannot be read: one
    :class:`CheckpointWarning` each), or one ``step_XXXXXX`` directory. ``model`` weights are loaded
    in place; ``optimizer`` / ``scheduler`` states when given and saved; when ``restore_rng``, this rank's own RNG
    states (a rank the checkpoint has none for keeps its generators as they are).

    Returns ``{"step": int, "loop_state": dict | None, "path": Path}``. Reads with ``torch.load(weights_only=True)``.
    """
    candidates = together(_resolve, path_or_run_dir, decide=True)  # rank 0 picks, every rank follows
    errors: list[str] = []
    for ckpt in candidates:
        try:
            why = agreed_damage(ckpt)
            if why is not None:
                raise P3OError(why)
            state = together(_load_one, ckpt, model, optimizer, map_location)  # on every rank, or fail together
        except Exception as err:  # a damaged or unreadable checkpoint (on any rank): every rank tries the previous one
            why = str(err) if isinstance(err, P3OError) else f"{type(err).__name__}: {str(err)[:160]}"
            if len(candidates) == 1:
                raise P3OError(f"{ckpt}: damaged checkpoint ({why})") from None
            errors.append(f"{ckpt.name} ({why})")
            warnings.warn(f"skipping damaged checkpoint {ckpt} ({why})", CheckpointWarning, stacklevel=2)
            continue
        if scheduler is not None and state.get("scheduler") is not None:
            scheduler.load_state_dict(state["scheduler"])
        if restore_rng:
            _restore_own_rng(state.get("rng"))
        return {"step": int(state["step"]), "loop_state": state.get("loop_state"), "path": ckpt}
    if errors:
        raise P3OError(f"{path_or_run_dir}: no intact checkpoint to resume from: {'; '.join(errors)}")
    return None


def _load_one(
    ckpt: Path, model: torch.nn.Module | None, optimizer: torch.optim.Optimizer | None, map_location: Any
) -> dict[str, Any]:
    """Every rank calls it: checkpoint `ckpt` into `model` / `optimizer`; returns its trainer state (the optimizer's
    left out). A sharded model reads nothing whole on other ranks than 0: rank 0 reads trainer_state.pt and a
    ``policy/`` checkpoint's weights and AdamW state and broadcasts them into the shards (torchtune's
    ``broadcast_from_rank0``); a ``sharded/`` checkpoint is read shard by shard (DCP)."""
    sharded = model is not None and _is_sharded(model)
    held: dict[str, Any] = {}  # rank 0's whole AdamW state (a policy/ checkpoint's), never pickled to the others

    def read() -> dict[str, Any]:
        state = _read_trainer_state(ckpt / STATE_FILE, map_location)
        held["optim"] = state.pop("optimizer", None)
        return state

    # unsharded ranks (DDP) each need the whole AdamW state: each reads; a sharded model reads on rank 0 alone
    state = together(read, decide=True) if sharded else read()
    optim = held.get("optim")
    if model is not None and (ckpt / SHARDED_DIR).is_dir():
        load_sharded(ckpt / SHARDED_DIR, _unwrap(model), optimizer)
    elif sharded:
        load_full_into_sharded(_unwrap(model), ckpt / POLICY_DIR)
        if optimizer is not None and dist.broadcast_object(optim is not None):
            load_optimizer_into_sharded(_unwrap(model), optimizer, optim)
    elif model is not None:  # safetensors reads every file before the model changes: a bad one leaves it
        load_policy_weights(model, ckpt / POLICY_DIR)
        if optimizer is not None and optim is not None:
            optimizer.load_state_dict(optim)
    return state


def _read_trainer_state(path: Path, map_location: Any) -> dict[str, Any]:
    state = _read_state(path, map_location)
    if not isinstance(state, dict) or "step" not in state:
        raise P3OError(f"{STATE_FILE}: not a p3o trainer state")
    return state


# --------------------------------------------------------------------------------------------------------------------
# Sharded checkpoints (train.strategy fsdp)
# --------------------------------------------------------------------------------------------------------------------


def _is_sharded(model: torch.nn.Module) -> bool:
    """True when the model's parameters are DTensor shards (FSDP2)."""
    return any(hasattr(p, "full_tensor") for p in _unwrap(model).parameters())


def save_sharded_checkpoint(
    run_dir: str | Path,
    step: int,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any = None,
    loop_state: dict[str, Any] | None = None,
    keep_last: int = 2,
    rng: Mapping[int, dict[str, Any]] | None = None,
    placement: dict[str, Any] | None = None,
) -> Path:
    """``save_checkpoint`` for a sharded policy; EVERY rank calls it. The policy and the AdamW states go to
    ``sharded/`` with ``torch.distributed.checkpoint`` (each rank writes its shard), rank 0 writes the rest and
    renames the finished directory into place; returns its path (on every rank). `placement`: the strategy and
    world size that wrote it (recorded in trainer_state.pt; a resume may use another)."""

    if keep_last < 1:
        raise P3OError(f"ckpt.keep_last: must be >= 1, got {keep_last}")
    _check_plain(loop_state, "loop_state")
    root = Path(run_dir) / CKPT_DIR
    name = f"step_{step:06d}"
    final = root / name
    tmp = root / f"{_TMP_PREFIX}{name}-{os.getpid()}"
    if dist.is_main():
        root.mkdir(parents=True, exist_ok=True)
        for stale in [*root.glob(f"{_TMP_PREFIX}step_*"), *root.glob(f"{_OLD_PREFIX}step_*")]:
            shutil.rmtree(stale, ignore_errors=True)
        tmp.mkdir()
    tmp = Path(dist.broadcast_object(str(tmp)))
    try:
        msd, osd = get_state_dict(_unwrap(model), optimizer)
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(tmp / SHARDED_DIR))
        dist.barrier()
        # each rank hashes the shard it wrote (in parallel); rank 0 the rest, in _commit
        mine = sorted((tmp / SHARDED_DIR).glob(f"__{dist.rank()}_*.distcp"))
        own = {p.relative_to(tmp).as_posix(): {"size": p.stat().st_size, "sha256": file_digest(p)} for p in mine}
        known = {k: v for records in dist.all_gather_object(own) for k, v in records.items()}
        if dist.is_main():
            state = _trainer_state(step, None, scheduler, rng, loop_state)  # the optimizer is in sharded/
            _commit(tmp, final, {**state, "placement": placement or {}}, known)
    except BaseException as err:
        if dist.is_main():
            shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(err, OSError | RuntimeError):
            raise _write_error(run_dir, name, err) from None
        raise
    if dist.is_main():
        _prune(root, keep_last, keep=final)
    dist.barrier()
    return final
