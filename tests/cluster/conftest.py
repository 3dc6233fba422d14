"""A REAL local Ray instance for the cluster tests, started once by the suite and stopped through its own handle.

Ray's `local_mode` no longer exists: the workers are real processes. The instance gets a few logical CPUs and a small
object store; at the end `ray.shutdown()` stops it and the fixture checks that no process it started is left.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import torch

ray = pytest.importorskip("ray", reason="the Ray tests need the ray extra (make setup installs it)")

HERE = Path(__file__).resolve().parent
TRAIN = str(HERE.parent / "train")
if TRAIN not in sys.path:
    sys.path.insert(0, TRAIN)


@pytest.fixture(scope="session")
def ray_cluster():
    """ray.init(num_cpus=4, 100 MB object store, no dashboard); yields the ray module; shuts it down after."""
    import psutil

    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    # log_to_driver=False: the raylet's own warnings (e.g. a disk over 95 % full) would otherwise land in the stderr
    # that later tests of the session capture and check line by line
    ray.init(
        num_cpus=4,
        object_store_memory=100 * 1024**2,
        include_dashboard=False,
        logging_level="WARNING",
        log_to_driver=False,
    )
    started = [p for p in me.children(recursive=True) if p.pid not in before]
    yield ray
    ray.shutdown()
    deadline = time.monotonic() + 30
    alive = [p for p in started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"Ray processes left behind: {[(p.pid, p.name()) for p in alive]}"


@pytest.fixture(autouse=True)
def _one_thread():
    """The trainer single-threaded (the workers take the trainer's thread count, so the engines compute alike)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
