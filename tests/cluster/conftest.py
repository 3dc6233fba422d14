"""A REAL local Ray cluster of TWO nodes for the cluster tests, started once by the suite and stopped through its own
handle (`ray.cluster_utils.Cluster`: a head node and a second node, each its own raylet and object store, on this
machine).

The trainer (the test process) is a driver on the head node. Only the second node declares the resource `rollout`
(`WORKER_RESOURCE`), so a run with ``--ray.worker_resource rollout`` places its workers there and every weight version
crosses nodes; a run without it lets Ray place them on either node. Ray's `local_mode` no longer exists: the workers
are real processes. At the end the cluster is shut down and the fixture checks that no process it started is left.
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


WORKER_RESOURCE = "rollout"


@pytest.fixture(scope="session")
def ray_cluster():
    """A head node (2 logical CPUs) and a second node (3 CPUs, 3 units of `WORKER_RESOURCE`), 80 MB object store
    each, no dashboard; yields the ray module with `ray.test_nodes` = {"head": node id, "second": node id}; shuts the
    cluster down after."""
    import psutil
    from ray.cluster_utils import Cluster

    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    store = 80 * 1024**2
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 2, "object_store_memory": store, "include_dashboard": False},
    )
    second = cluster.add_node(num_cpus=3, resources={WORKER_RESOURCE: 3}, object_store_memory=store)
    cluster.wait_for_nodes()
    # log_to_driver=False: the raylet's own warnings (e.g. a disk over 95 % full) would otherwise land in the stderr
    # that later tests of the session capture and check line by line
    ray.init(address=cluster.address, logging_level="WARNING", log_to_driver=False)
    ray.test_nodes = {"head": cluster.head_node.node_id, "second": second.node_id}
    started = [p for p in me.children(recursive=True) if p.pid not in before]
    yield ray
    ray.shutdown()
    cluster.shutdown()
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
