"""The frame of the ``python -m p3o.experiments...`` scripts over record files: an argparse parser named after the
module, and a run that turns bad input (a `ConfigError`) into one line on stderr and exit 2.

    parser = script_parser("p3o.experiments.stats.relabel", __doc__)
    parser.add_argument("files", nargs="+", type=Path)
    return run_script("relabel", parser, argv, lambda args: ...)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from p3o.errors import ConfigError


def script_parser(module: str, doc: str | None) -> argparse.ArgumentParser:
    """A parser whose program is ``python -m <module>`` and whose description is the first line of `doc`."""
    return argparse.ArgumentParser(prog=f"python -m {module}", description=(doc or "").split("\n")[0])


def run_script(
    name: str,
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None,
    body: Callable[[argparse.Namespace], int],
) -> int:
    """``body(args)`` with `argv` (``sys.argv[1:]`` when None) parsed by `parser`; a `ConfigError` prints
    ``<name>: error: <its first line>`` on stderr and returns 2."""
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return body(args)
    except ConfigError as err:
        print(f"{name}: error: {str(err).splitlines()[0]}", file=sys.stderr)
        return 2
