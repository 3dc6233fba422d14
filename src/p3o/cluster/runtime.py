"""Joining or starting the Ray cluster the rollout workers run on.

    started = connect(cfg.ray)      # joins ray.address, or starts a local instance (ray.num_cpus logical CPUs)
    ...
    if started: ray.shutdown()      # only what this process started

A process that already called `ray.init` (a test suite, a notebook) keeps its instance: `connect` joins nothing and
returns False, so the run never shuts down a cluster it did not start.
"""

from __future__ import annotations

import socket
from typing import Any

from p3o.errors import ConfigError


def import_ray() -> Any:
    """The `ray` module, or a one-line ConfigError naming the extra to install."""
    try:
        import ray
    except ImportError as err:
        raise ConfigError(
            'rollout.workers: Ray rollout workers need Ray (pip install "p3o[ray]"); workers 0 runs in-process'
        ) from err
    return ray


def _check_reachable(address: str, timeout_s: float = 3.0) -> None:
    """A 'host:port' address must accept a TCP connection (Ray itself would retry for a minute or more)."""
    host, _, port = address.rpartition(":")
    if address.startswith("ray://"):
        host, _, port = address[len("ray://") :].rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"ray.address: {address!r} is not 'auto', 'host:port' or 'ray://host:port'")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            pass
    except OSError as err:
        raise ConfigError(f"ray.address: cannot reach a Ray cluster at {address} ({err.strerror or err})") from err


def preflight(ray_cfg: Any) -> None:
    """Before any model loads: Ray is installed and `ray.address` (when a host:port) accepts connections."""
    import_ray()
    if ray_cfg.address and ray_cfg.address != "auto":
        _check_reachable(ray_cfg.address)


def connect(ray_cfg: Any, *, object_store_memory: int | None = None) -> bool:
    """Join `ray_cfg.address`, or start a local instance with `ray_cfg.num_cpus` logical CPUs; True when this call
    started (and so must later shut down) the instance. An unreachable address is a one-line ConfigError."""
    ray = import_ray()
    if ray.is_initialized():
        return False
    address = ray_cfg.address
    if address:
        if address != "auto":
            _check_reachable(address)
        try:
            ray.init(address=address, include_dashboard=False, logging_level="WARNING", log_to_driver=True)
        except (ConnectionError, RuntimeError, ValueError) as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise ConfigError(f"ray.address: cannot join the Ray cluster at {address}: {first}") from err
        return True
    ray.init(
        num_cpus=ray_cfg.num_cpus,
        object_store_memory=object_store_memory,
        include_dashboard=False,
        logging_level="WARNING",
    )
    return True


__all__ = ["connect", "import_ray", "preflight"]
