"""User-facing errors: one clear line, non-zero exit, no traceback (the CLI catches these)."""


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
