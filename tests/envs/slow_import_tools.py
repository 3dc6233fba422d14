"""Tools whose module takes a while to import (a worker that imports them is slow to start) and a tool that starts a
process of its own and then hangs (the tests of tests/envs/test_env_tools.py import these by `module:name`)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

time.sleep(1.5)  # a heavy import: every worker that loads this module is ready only ~1.5 s after it starts


def quick(arguments: dict) -> str:
    return "quick"


def spawn_and_hang(arguments: dict) -> str:
    """Start a long `sleep` child, write its pid to ``arguments["pid_file"]``, then hang."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    Path(arguments["pid_file"]).write_text(str(child.pid))
    time.sleep(600)
    return "never"
