"""User-facing errors: one clear line, non-zero exit, no traceback (the CLI catches these)."""

from __future__ import annotations

import json
from typing import Any


class P3OError(Exception):
    """Bad input from the user (a file, field or option); its message is one line that names it."""


class ConfigError(P3OError):
    """An invalid configuration key or value."""


class DataError(P3OError):
    """A malformed data file (names the file, row and field)."""


class CheckpointWriteError(P3OError):
    """A checkpoint could not be written (disk full, file-size limit); the earlier checkpoints are left intact (the
    CLI exits 1: the run's settings were fine). Raised by `p3o.train.checkpoint`, which re-exports it."""


class VerifierError(ConfigError, ValueError):
    """An unknown verifier name or a custom `module:function` that cannot be used (one line; the CLI exits 2)."""


def json_object(text: str, where: str, error: type[P3OError] = DataError) -> dict[str, Any]:
    """`text` parsed as one JSON object, else one-line `error`s naming `where` (a file and line, an option):
    ``{where}: invalid JSON (Expecting value at char 0)`` or ``{where}: expected a JSON object, got list``."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise error(f"{where}: invalid JSON ({e.msg} at char {e.pos})") from None
    if not isinstance(value, dict):
        raise error(f"{where}: expected a JSON object, got {type(value).__name__}")
    return value
