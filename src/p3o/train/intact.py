"""Which checkpoint of a run is intact, and the same answer on every rank.

A checkpoint is intact when it is complete and every file is as its meta.json records (size and sha256,
:func:`p3o.models.checkpoints.checkpoint_damage`). :func:`intact_checkpoint` scans a run's checkpoints newest first
(the ``latest`` pointer's first, :func:`candidates`); :func:`agreed_damage` gives every rank of a resume one
verdict, each rank hashing its share of the files, and remembers it while the files stay as they are (a resume
check and the load after it hash each file once). :func:`together` runs a step on every rank (or on rank 0 for all)
and fails on every rank when it failed on any, so no rank goes on alone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from p3o import dist
from p3o.errors import P3OError
from p3o.models.checkpoints import META_FILE, checkpoint_damage, file_digest, latest_checkpoint, list_checkpoints

__all__ = ["agreed_damage", "candidates", "intact_checkpoint", "together"]


def intact_checkpoint(run_dir: str | Path) -> tuple[Path | None, list[tuple[Path, str]]]:
    """(the newest intact checkpoint of a run or None, [(damaged checkpoint, why)] newer than it, newest first).

    Intact: complete (meta.json, trainer_state.pt, policy/) and every file as its meta.json records
    (:func:`p3o.models.checkpoints.checkpoint_damage`). Reads every file once (sha256); loads nothing.
    """
    damaged: list[tuple[Path, str]] = []
    for ckpt in candidates(Path(run_dir)):
        why = _damage(ckpt)
        if why is None:
            return ckpt, damaged
        damaged.append((ckpt, why))
    return None, damaged


def candidates(run_dir: Path) -> list[Path]:
    """Every complete checkpoint of a run, newest first (the ``latest`` pointer's first)."""
    latest = latest_checkpoint(run_dir)
    others = [p for p in reversed(list_checkpoints(run_dir)) if p != latest]
    return ([latest] if latest is not None else []) + others


def together(fn: Any, *args: Any, decide: bool = False) -> Any:
    """Every rank calls it: `fn(*args)`'s result, or the same P3OError on every rank when it raised on any (naming
    the first rank that failed), so no rank goes on alone. `decide`: rank 0 alone runs `fn` and broadcasts its result
    (or its error). At world size 1, `fn(*args)` itself. `fn`'s own collectives must not depend on its failing."""
    if dist.world_size() == 1:
        return fn(*args)
    result, err = None, None
    if dist.is_main() or not decide:
        try:
            result = fn(*args)
        except Exception as e:  # every rank must learn of it before raising
            err = str(e) if isinstance(e, P3OError) else f"{type(e).__name__}: {str(e)[:160]}"
    if decide:
        result, err = dist.broadcast_object((result, err))
        errs = [err]
    else:
        errs = dist.all_gather_object(err)
    failed = [(r, e) for r, e in enumerate(errs) if e is not None]
    if failed:
        rank, why = failed[0]
        raise P3OError(why if decide or dist.world_size() == 1 else f"rank {rank}: {why}")
    return result


_VERDICTS: dict[tuple[Any, ...], str | None] = {}  # a checkpoint's files as they stand -> its damage verdict


def _meta_key(ckpt: Path) -> tuple[Any, ...] | None:
    """The checkpoint as it stands on disk: its path and every file's (name, size, mtime); a verdict is reused only
    while none of them changed."""
    try:
        files = sorted((p.relative_to(ckpt).as_posix(), p.stat().st_size, p.stat().st_mtime_ns)
                       for p in ckpt.rglob("*") if p.is_file())  # fmt: skip
        return (str(ckpt.resolve()), *files)
    except OSError:
        return None


def _damage(ckpt: Path, share: tuple[int, int] = (0, 1)) -> str | None:
    """:func:`checkpoint_damage` of the files (rank, world) = `share` checks (every world-th file of meta.json's
    record from the rank-th); the whole verdict is remembered while the checkpoint's files stay as they are, so a
    resume check and the load after it hash each file once."""
    key = _meta_key(ckpt)
    if key is not None and key in _VERDICTS:
        return _VERDICTS[key]
    if share != (0, 1):
        return _share_damage(ckpt, *share)
    why = checkpoint_damage(ckpt)  # the whole record, read and checked by models.checkpoints
    if key is not None:
        _VERDICTS[key] = why
    return why


def _share_damage(ckpt: Path, rank: int, world: int) -> str | None:
    """The first damage among every world-th file of meta.json's record from the rank-th (a meta.json that cannot
    be read, or is not a mapping, is rank 0's to report)."""
    try:
        recorded = json.loads((ckpt / META_FILE).read_text()).get("files")
        mine = sorted(recorded.items())[rank::world] if isinstance(recorded, dict) else []
    except (OSError, ValueError, AttributeError) as err:
        return f"{META_FILE} unreadable or not a mapping ({type(err).__name__})" if rank == 0 else None
    whys = (_file_damage(ckpt / rel, rel, rec) for rel, rec in mine)
    return next((w for w in whys if w is not None), None)


def _file_damage(f: Path, rel: str, rec: dict[str, Any]) -> str | None:
    """Why file `f` (`rel` in meta.json, whose record is `rec`) differs from its record, or None."""
    size = f.stat().st_size if f.is_file() else None
    if size is None:
        return f"{rel} missing"
    if size != rec.get("size"):
        return f"{rel} has {size} bytes, {rec.get('size')} recorded"
    return None if file_digest(f) == rec.get("sha256") else f"{rel} does not match its recorded sha256"


def agreed_damage(ckpt: Path) -> str | None:
    """Every rank calls it: `ckpt`'s damage verdict, the same on every rank. Rank 0's remembered verdict when it has
    one (its resume check hashed it); else every rank hashes its share of the files and the verdicts are gathered."""
    if dist.world_size() == 1:
        return _damage(ckpt)
    key = _meta_key(ckpt) if dist.is_main() else None
    known = dist.broadcast_object((True, _VERDICTS[key]) if key in _VERDICTS else (False, None))
    if known[0]:
        return known[1]
    whys = [w for w in dist.all_gather_object(_damage(ckpt, (dist.rank(), dist.world_size()))) if w is not None]
    return whys[0] if whys else None
