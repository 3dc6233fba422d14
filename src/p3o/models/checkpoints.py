"""Where a training run keeps its checkpoints, and the read-only lookups over that layout.

Below the trainer on purpose: evaluation (`p3o eval` on a run directory) finds a run's newest policy here without
importing `p3o.train`. Writing, pruning and restoring checkpoints stay in `p3o.train.checkpoint`.

Layout under a run directory::

    checkpoints/
      step_000020/          policy/ (weights + tokenizer), trainer_state.pt, meta.json (written last)
      latest                text file naming the newest complete checkpoint ("step_000040")

    latest_checkpoint("runs/mine")      # Path("runs/mine/checkpoints/step_000040"), or None
    list_checkpoints("runs/mine")       # complete checkpoints, oldest first
    checkpoint_damage(path)             # None when every file matches the size and sha256 meta.json records

meta.json records ``{"files": {relative path: {"size": bytes, "sha256": hex}}}`` for every other file of the
checkpoint (format 2 since issue 30 item 7); a checkpoint written before that has no record and is not verified.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

__all__ = [
    "CKPT_DIR",
    "LATEST",
    "META_FILE",
    "POLICY_DIR",
    "SHARDED_DIR",
    "STATE_FILE",
    "checkpoint_damage",
    "checkpoint_root",
    "checkpoint_step",
    "file_digest",
    "file_records",
    "is_complete_checkpoint",
    "latest_checkpoint",
    "list_checkpoints",
]

CKPT_DIR = "checkpoints"
LATEST = "latest"
STATE_FILE = "trainer_state.pt"
POLICY_DIR = "policy"
SHARDED_DIR = "sharded"  # train.strategy fsdp: torch.distributed.checkpoint shards of the policy and AdamW states
META_FILE = "meta.json"
_STEP_RE = re.compile(r"^step_(\d+)$")


def checkpoint_step(path: str | Path) -> int | None:
    """The step of a ``step_XXXXXX`` directory name, else None."""
    m = _STEP_RE.match(Path(path).name)
    return int(m.group(1)) if m else None


def is_complete_checkpoint(path: str | Path) -> bool:
    """True when ``path`` is a finished checkpoint (meta.json, trainer_state.pt and policy/ or, written under
    ``train.strategy fsdp``, sharded/ present)."""
    path = Path(path)
    return (
        checkpoint_step(path) is not None
        and (path / META_FILE).is_file()
        and (path / STATE_FILE).is_file()
        and ((path / POLICY_DIR).is_dir() or (path / SHARDED_DIR).is_dir())
    )


def checkpoint_root(run_dir: str | Path) -> Path:
    """The ``checkpoints/`` directory of a run (``run_dir`` itself when it already is one)."""
    run_dir = Path(run_dir)
    return run_dir if run_dir.name == CKPT_DIR and not (run_dir / CKPT_DIR).is_dir() else run_dir / CKPT_DIR


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first (incomplete and temporary directories are skipped)."""
    root = checkpoint_root(run_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and is_complete_checkpoint(p)]
    return sorted(found, key=lambda p: checkpoint_step(p) or 0)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of a run: the ``latest`` pointer when it names a complete one, else a scan."""
    root = checkpoint_root(run_dir)
    pointer = root / LATEST
    if pointer.is_file():
        try:
            target = root / pointer.read_text().strip()
        except OSError:
            target = None
        if target is not None and target.parent == root and is_complete_checkpoint(target):
            # The pointer is only a hint: a newer complete directory (pointer write lost in a crash) still wins.
            newer = [p for p in list_checkpoints(root) if (checkpoint_step(p) or 0) > (checkpoint_step(target) or 0)]
            return newer[-1] if newer else target
    found = list_checkpoints(root)
    return found[-1] if found else None


def file_digest(path: str | Path, chunk: int = 1 << 20) -> str:
    """sha256 (hex) of a file's bytes, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def file_records(root: str | Path, skip: tuple[str, ...] = (META_FILE,)) -> dict[str, dict[str, int | str]]:
    """``{relative path: {"size", "sha256"}}`` of every file under ``root`` (sorted; names in ``skip`` left out)."""
    root = Path(root)
    out: dict[str, dict[str, int | str]] = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if rel not in skip:
            out[rel] = {"size": path.stat().st_size, "sha256": file_digest(path)}
    return out


def checkpoint_damage(path: str | Path) -> str | None:
    """Why the checkpoint at ``path`` cannot be trusted (one short clause), or None when it is intact.

    Intact: meta.json is readable and every file it records has its recorded size and sha256. A checkpoint whose
    meta.json records no files (written before the record existed) is taken as intact here; loading it is the test.
    """
    path = Path(path)
    try:
        meta = json.loads((path / META_FILE).read_text())
    except (OSError, ValueError) as err:
        return f"{META_FILE} unreadable ({type(err).__name__})"
    files = meta.get("files") if isinstance(meta, dict) else None
    if not isinstance(files, dict):
        return None if isinstance(meta, dict) else f"{META_FILE} is not a mapping"
    for rel, rec in files.items():
        f = path / rel
        try:
            size = f.stat().st_size
        except OSError:
            return f"{rel} missing"
        if size != rec.get("size"):
            return f"{rel} has {size} bytes, {rec.get('size')} recorded"
        if file_digest(f) != rec.get("sha256"):
            return f"{rel} does not match its recorded sha256"
    return None
