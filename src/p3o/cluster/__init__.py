"""Disaggregated generation on Ray: rollout workers as actors between `p3o.train` (which consumes a `BatchSource`)
and `p3o.rollout` (which knows nothing of Ray).

    p3o train --rollout.workers 2 --loop.mode async             # a local Ray instance, 2 rollout actors
    p3o train --rollout.workers 2 --ray.address auto            # the same run on an existing cluster

`RaySource` (the batch source, handed to `p3o.train.loop.run(cfg, remote_source=RaySource)`: train/ never imports
this floor), `RolloutWorker` (the actor's class), `connect` / `preflight` (join or start Ray, check an address).
`p3o.cli` hands `RaySource` to `p3o.train.cli.main` for `p3o train`. Ray is imported only when a source is built
(extra ``p3o[ray]``).
"""

from p3o.cluster.runtime import connect, import_ray, preflight
from p3o.cluster.source import MAX_RESTARTS, RaySource
from p3o.cluster.worker import RolloutWorker

__all__ = ["MAX_RESTARTS", "RaySource", "RolloutWorker", "connect", "import_ray", "preflight"]
