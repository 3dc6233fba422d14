"""Joining or starting the Ray cluster the rollout workers run on.

    started = connect(cfg.ray)      # joins ray.address, or starts a local instance (ray.num_cpus logical CPUs)
    ...
    if started: ray.shutdown()      # only what this process started

A process that already called `ray.init` (a test suite, a notebook) keeps its instance: `connect` joins nothing and
returns False, so the run never shuts down a cluster it did not start.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import socket
import subprocess
from pathlib import Path
from typing import Any

import torch

from p3o import dist
from p3o.errors import ConfigError


def import_ray() -> Any:
    """The `ray` module, or a one-line ConfigError naming the extra to install."""
    try:
        import ray  # optional: ray (extra ray)
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


_STARTED = {"by_preflight": False}


def check_worker_python(python: str | None, *, engine: str, driver_ray: str) -> None:
    """The rollout workers' interpreter (`ray.worker_python`, None: this one) has Ray at the driver's version and, for
    `rollout.engine vllm`, vLLM: a one-line ConfigError otherwise (before any model loads)."""
    if python is None:
        if engine == "vllm" and importlib.util.find_spec("vllm") is None:
            raise ConfigError(
                "rollout.engine: vllm workers need vLLM in their interpreter; run p3o from .venv-vllm, or set "
                "ray.worker_python to a Python that has it (p3o docs scaling)"
            )
        return
    if not Path(python).is_file():
        raise ConfigError(f"ray.worker_python: {python} does not exist")
    probe = (
        "import importlib.util, json\ntry:\n    import ray; v = ray.__version__\nexcept ImportError:\n    v = None\n"
        "print(json.dumps({'ray': v, 'vllm': importlib.util.find_spec('vllm') is not None}))"
    )
    try:
        out = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=120)
        found = json.loads(out.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as err:
        raise ConfigError(f"ray.worker_python: {python} does not run as a Python interpreter ({err})") from err
    if found["ray"] is None:
        raise ConfigError(f"ray.worker_python: {python} has no Ray (pip install ray=={driver_ray} there)")
    if found["ray"] != driver_ray:
        raise ConfigError(
            f"ray.worker_python: {python} has Ray {found['ray']} but this driver has Ray {driver_ray}; "
            f"Ray needs the same version on both sides (pip install ray=={driver_ray} there)"
        )
    if engine == "vllm" and not found["vllm"]:
        raise ConfigError(f"ray.worker_python: {python} has no vLLM, which rollout.engine vllm workers need")


def check_weight_sync(kind: str, backend: str) -> None:
    """`rollout.weight_sync collective` needs torch.distributed with a backend that can form the group here."""
    if kind == "collective" and not dist.backend_available(backend):
        raise ConfigError(
            f"rollout.weight_sync: collective needs a torch.distributed {backend} backend, which this torch build or "
            f"machine cannot form; use rollout.weight_sync object_store"
        )


def check_resources(ray: Any, *, gpus_per_worker: float, workers: int, resource: str | None) -> None:
    """The connected cluster has the GPUs the workers ask for and declares `ray.worker_resource` (one unit per
    worker): a one-line ConfigError otherwise (Ray itself would wait forever for an actor it cannot place)."""
    total = ray.cluster_resources()
    need = gpus_per_worker * workers
    if need > float(total.get("GPU", 0.0)) + 1e-9:
        raise ConfigError(
            f"rollout.workers: {workers} workers ask for {need:g} GPUs but the Ray cluster has "
            f"{float(total.get('GPU', 0.0)):g}; use fewer workers or --rollout.colocate true"
        )
    if resource is not None and float(total.get(resource, 0.0)) < workers:
        raise ConfigError(
            f"ray.worker_resource: the Ray cluster declares {float(total.get(resource, 0.0)):g} units of "
            f"{resource!r}, {workers} workers need one each (ray start --resources '{{\"{resource}\": {workers}}}')"
        )


def gpus_per_worker(workers: int, colocate: bool) -> float:
    """GPUs one rollout worker asks Ray for: 0 without CUDA here; 1 / (N + 1) colocated with the trainer, else 1."""
    if not torch.cuda.is_available():  # unverified with GPUs: none on the machines this was written on
        return 0.0
    return 1.0 / (workers + 1) if colocate else 1.0


def preflight(cfg: Any) -> None:
    """Before any model loads, on the trainer's rank 0: Ray is installed, `ray.address` (when a host:port) accepts
    connections, the workers' interpreter has vLLM (when asked) and the driver's Ray version, the weight-sync
    backend exists; then Ray is joined or started (`connect`) and its resources are checked. `cfg` is the run's
    TrainConfig (a bare RayConfig checks only the address)."""
    ray_cfg = getattr(cfg, "ray", cfg)
    _check_address(ray_cfg)
    ro = getattr(cfg, "rollout", None)
    if ro is None or dist.rank() != 0:  # trainer rank 0 alone joins Ray and owns the workers
        return

    ray = import_ray()
    check_worker_python(ray_cfg.worker_python, engine=ro.engine, driver_ray=ray.__version__)
    check_weight_sync(ro.weight_sync, dist.group_backend())
    _STARTED["by_preflight"] = connect(ray_cfg) or _STARTED["by_preflight"]
    check_resources(
        ray,
        gpus_per_worker=gpus_per_worker(ro.workers, ro.colocate),
        workers=ro.workers,
        resource=ray_cfg.worker_resource,
    )


def _check_address(ray_cfg: Any) -> None:
    """Ray is installed and `ray.address` (when a host:port, or 'auto') names a cluster that accepts connections."""
    ray = import_ray()
    address = ray_cfg.address
    if address == "auto":  # the cluster `ray start` recorded on this machine (or RAY_ADDRESS): ask Ray which
        try:
            address = ray._private.services.canonicalize_bootstrap_address_or_die("auto")
        except ConnectionError as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise ConfigError(f"ray.address: auto finds no running Ray cluster on this machine ({first})") from err
        except AttributeError:  # pragma: no cover - a Ray without this helper: ray.init will tell
            return
    if address:
        _check_reachable(address)


def connect(ray_cfg: Any, *, object_store_memory: int | None = None) -> bool:
    """Join `ray_cfg.address`, or start a local instance with `ray_cfg.num_cpus` logical CPUs; True when this call
    started (and so must later shut down) the instance. An unreachable address is a one-line ConfigError."""
    ray = import_ray()
    if ray.is_initialized():
        started, _STARTED["by_preflight"] = _STARTED["by_preflight"], False  # preflight started it for this run
        return started
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
    # Ray announces, on every local start, that its token authentication is on by default: not a finding of this run
    auth_log = logging.getLogger("ray._private.authentication.authentication_token_setup")
    level = auth_log.level
    auth_log.setLevel(logging.ERROR)
    try:
        ray.init(
            address="local",  # a new instance of its own, even where another Ray cluster runs on this machine
            num_cpus=ray_cfg.num_cpus,
            object_store_memory=object_store_memory,
            include_dashboard=False,
            logging_level="WARNING",
        )
    finally:
        auth_log.setLevel(level)
    return True


__all__ = [
    "check_resources",
    "check_weight_sync",
    "check_worker_python",
    "connect",
    "gpus_per_worker",
    "import_ray",
    "preflight",
]
