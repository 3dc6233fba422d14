"""How a new policy version reaches the rollout workers (`rollout.weight_sync`): Ray's object store, or a collective
group of its own between the trainer's rank 0 and every worker.

    channel = make_channel(cfg.rollout.weight_sync, ray, actors, on_dead=source._restarted)
    nbytes = channel.send(weights, version)    # every worker can now generate from `version`
    box = channel.box(version)                 # what a request carries: [object ref] or [] (the worker holds it)
    channel.keep({3, 4})                       # versions a pending or future request may still need

* ``object_store``: ONE ``ray.put`` per version, shared by every worker; a worker fetches it when a request names it.
* ``collective``: a process group of N + 1 members (the trainer's rank 0 is rank 0, worker i is rank i + 1) formed
  over a TCP store the trainer hosts, apart from the trainer's data-parallel group: gloo on CPU, NCCL on GPUs when
  every member has a GPU of its own (`collective_backend`; gloo through host memory when a worker shares the
  trainer's GPU, since NCCL refuses two members on one device). A version is broadcast in buckets of at most
  `BUCKET_BYTES` (tensors of one dtype flattened into one buffer, in the state dict's order); every worker unpacks it
  and keeps it until the trainer says no request needs it; the engine then loads it in place (HF: a copy into its
  live parameters, vLLM: its ``reload_weights`` path). With LoRA the trainer sends the merged adapted layers only
  (`sync_weights`). A restarted worker makes the trainer form the group again (a new generation, every member joins)
  and resend the versions still needed before any request reaches it.

Both log ``sync_bytes`` (bytes of one version, tied tensors once); the loop logs ``time_sync_s``.
"""

from __future__ import annotations

import datetime
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from p3o import dist

BUCKET_BYTES = 64 * 2**20
"""Upper size of one broadcast buffer (a larger tensor goes alone in its own bucket)."""
WEIGHT_SYNCS = ("object_store", "collective")
GROUP_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class TensorSpec:
    """Name, shape and dtype of one tensor of a version (what a receiver allocates); `alias_of` names an earlier
    tensor of the same storage (tied embeddings): not sent, the receiver reuses that one."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    alias_of: str | None = None

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


def unique_bytes(weights: dict[str, Tensor]) -> int:
    """Bytes of a state dict with tensors that share storage (tied embeddings) counted once."""
    unique = {v.untyped_storage().data_ptr(): v for v in weights.values()}
    return sum(v.numel() * v.element_size() for v in unique.values())


def specs_of(weights: dict[str, Tensor]) -> list[TensorSpec]:
    """The `TensorSpec` of every tensor, in the state dict's order; a tensor that is another one (same storage, offset,
    shape and strides: tied weights) is marked as its alias."""
    seen: dict[tuple[int, int, tuple[int, ...], tuple[int, ...]], str] = {}
    specs = []
    for k, v in weights.items():
        key = (v.untyped_storage().data_ptr(), v.storage_offset(), tuple(v.shape), tuple(v.stride()))
        specs.append(TensorSpec(k, tuple(v.shape), str(v.dtype).removeprefix("torch."), seen.get(key)))
        seen.setdefault(key, k)
    return specs


def snapshot(weights: dict[str, Tensor]) -> dict[str, Tensor]:
    """A CPU copy of a state dict that later updates of the live tensors do not reach; tied tensors stay tied."""
    copies: dict[tuple[int, int, tuple[int, ...], tuple[int, ...]], Tensor] = {}
    out = {}
    for k, v in weights.items():
        key = (v.untyped_storage().data_ptr(), v.storage_offset(), tuple(v.shape), tuple(v.stride()))
        if key not in copies:
            copies[key] = v.detach().to("cpu", copy=True)
        out[k] = copies[key]
    return out


def plan_buckets(specs: list[TensorSpec], bucket_bytes: int = BUCKET_BYTES) -> list[list[int]]:
    """Consecutive tensors of one dtype grouped into buckets of at most `bucket_bytes` (indices into `specs`; aliases
    are not sent and belong to no bucket)."""
    buckets: list[list[int]] = []
    size, dtype = 0, None
    for i, s in enumerate(specs):
        if s.alias_of is not None:
            continue
        nbytes = s.numel * torch.empty(0, dtype=getattr(torch, s.dtype)).element_size()
        if not buckets or s.dtype != dtype or size + nbytes > bucket_bytes:
            buckets.append([])
            size, dtype = 0, s.dtype
        buckets[-1].append(i)
        size += nbytes
    return buckets


def broadcast_state(
    group: Any,
    specs: list[TensorSpec],
    weights: dict[str, Tensor] | None,
    *,
    device: torch.device,
    bucket_bytes: int = BUCKET_BYTES,
) -> dict[str, Tensor]:
    """Send (rank 0, `weights` given) or receive (`weights` None) one version over `group`, bucket by bucket.

    Every member calls it with the same `specs`. Returns the version's tensors (on the CPU; a receiver's are views
    of its own bucket buffers, so nothing is copied twice)."""
    out: dict[str, Tensor] = {}
    for idx in plan_buckets(specs, bucket_bytes):
        dtype = getattr(torch, specs[idx[0]].dtype)
        if weights is not None:
            flat = torch.cat([weights[specs[i].name].detach().reshape(-1).to(dtype) for i in idx]).to(device)
        else:
            flat = torch.empty(sum(specs[i].numel for i in idx), dtype=dtype, device=device)
        dist.broadcast_(flat, group, src=0)
        flat = flat.to("cpu")
        offset = 0
        for i in idx:
            s = specs[i]
            out[s.name] = flat[offset : offset + s.numel].view(s.shape)
            offset += s.numel
    for s in specs:
        if s.alias_of is not None:
            out[s.name] = out[s.alias_of]
    return {s.name: out[s.name] for s in specs}


def node_address() -> str:
    """This process's address as other nodes see it (Ray's node IP when Ray is up, else the host's)."""
    try:
        import ray  # optional: ray (extra ray); without it, the host's address

        if ray.is_initialized():
            return str(ray.util.get_node_ip_address())
    except ImportError:
        pass
    return socket.gethostbyname(socket.gethostname())


def join_group(
    host: str, port: int, generation: int, rank: int, size: int, backend: str, timeout_s: float = GROUP_TIMEOUT_S
) -> Any:
    """A worker's side of `CollectiveChannel`'s group: connect to the trainer's store at host:port and join
    generation `generation` as `rank` (blocks until every member has joined)."""
    timeout = datetime.timedelta(seconds=timeout_s)
    store = torch.distributed.TCPStore(host, port, is_master=False, timeout=timeout)
    prefixed = torch.distributed.PrefixStore(f"p3o-weights/{generation}", store)
    return dist.new_group(prefixed, rank=rank, size=size, backend=backend, host=node_address(), timeout_s=timeout_s)


class ObjectStoreChannel:
    """`rollout.weight_sync object_store`: one ``ray.put`` per version; a request carries the reference."""

    def __init__(self, ray: Any, actors: list[Any]) -> None:
        self.ray = ray
        self.refs: dict[int, Any] = {}

    def send(self, weights: dict[str, Tensor], version: int) -> int:
        cpu = {k: v.detach().to("cpu") for k, v in weights.items()}
        self.refs[version] = self.ray.put(cpu)  # ONE put per version, shared by every worker
        return unique_bytes(cpu)

    def box(self, version: int) -> list[Any]:
        return [self.refs[version]]

    def keep(self, versions: set[int]) -> None:
        for v in [v for v in self.refs if v not in versions]:
            del self.refs[v]  # Ray frees the object once no worker borrows it any more

    def rejoin(self) -> None:
        """Nothing to do: a restarted worker fetches what its next request names."""

    def close(self) -> None:
        self.refs.clear()


class CollectiveChannel:
    """`rollout.weight_sync collective`: a process group of its own, the trainer's rank 0 as root (module docstring).

    Args:
        ray: the ray module. actors: the worker handles (their `join_weight_group` / `receive_weights` methods).
        on_dead: called with a worker's index when it died during a broadcast (waits for Ray's restart);
            the group is then formed again and the kept versions resent.
        backend: "gloo" | "nccl" (default: `p3o.dist.group_backend()`).
    """

    def __init__(
        self,
        ray: Any,
        actors: list[Any],
        *,
        on_dead: Callable[[int, str], None],
        backend: str | None = None,
        bucket_bytes: int = BUCKET_BYTES,
        timeout_s: float = GROUP_TIMEOUT_S,
    ) -> None:
        self.ray, self.actors, self.on_dead = ray, actors, on_dead
        self.backend = backend or dist.group_backend()
        self.bucket_bytes, self.timeout_s = bucket_bytes, timeout_s
        self.device = (
            torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl" else torch.device("cpu")
        )
        self.host = node_address()
        self.store = torch.distributed.TCPStore(
            self.host, 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=timeout_s)
        )
        self.generation = -1
        self.group: Any = None
        self.kept: dict[int, dict[str, Tensor]] = {}  # what a restarted worker may still be asked to generate from
        self.rejoin()

    @property
    def size(self) -> int:
        return len(self.actors) + 1

    def rejoin(self) -> None:
        """Form the group (again): a new generation every member joins; then resend every kept version."""
        self.generation += 1
        refs = [
            a.join_weight_group.remote(self.host, self.store.port, self.generation, i + 1, self.size, self.backend)
            for i, a in enumerate(self.actors)
        ]
        prefixed = torch.distributed.PrefixStore(f"p3o-weights/{self.generation}", self.store)
        self.group = dist.new_group(
            prefixed, rank=0, size=self.size, backend=self.backend, host=self.host, timeout_s=self.timeout_s
        )
        self.ray.get(refs)
        for version in sorted(self.kept):
            self._broadcast(self.kept[version], version)

    def _broadcast(self, weights: dict[str, Tensor], version: int) -> None:
        specs = specs_of(weights)
        keep = sorted(self.kept)
        gen = self.generation
        refs = [a.receive_weights.remote(version, specs, keep, self.bucket_bytes, gen) for a in self.actors]
        try:
            broadcast_state(self.group, specs, weights, device=self.device, bucket_bytes=self.bucket_bytes)
            failed = None
        except RuntimeError as err:  # a member died mid-broadcast (gloo: connection closed)
            failed = err
        dead = []
        for w, ref in enumerate(refs):
            try:
                if not self.ray.get(ref):  # the worker is not in this generation (restarted): form the group again
                    failed = failed or RuntimeError(f"worker {w} is not in generation {gen}")
            except (self.ray.exceptions.RayActorError, self.ray.exceptions.ActorUnavailableError) as err:
                dead.append((w, type(err).__name__))
            except self.ray.exceptions.RayTaskError:  # a survivor whose broadcast broke with the dead member's
                failed = failed or RuntimeError("a member's broadcast failed")
        if dead or failed is not None:
            for w, why in dead:
                self.on_dead(w, why)
            self.rejoin()  # resends every kept version, this one included

    def send(self, weights: dict[str, Tensor], version: int) -> int:
        cpu = snapshot(weights)  # kept for a restarted worker: the trainer's live tensors move on
        self.kept[version] = cpu
        self._broadcast(cpu, version)
        return unique_bytes(cpu)

    def box(self, version: int) -> list[Any]:
        return []  # the worker holds the version already

    def keep(self, versions: set[int]) -> None:
        for v in [v for v in self.kept if v not in versions]:
            del self.kept[v]

    def close(self) -> None:
        self.kept.clear()
        self.group = None


def collective_backend(ray: Any, workers: int, colocate: bool) -> str:
    """nccl when every member can have a GPU of its own (CUDA here, workers not colocated, the cluster holding
    workers + 1 GPUs); gloo otherwise: NCCL cannot form a group whose members share one device (a worker colocated
    with the trainer), so the weights then go over gloo through host memory. Unverified on GPUs."""
    if not torch.cuda.is_available() or colocate:
        return "gloo"
    return "nccl" if float(ray.cluster_resources().get("GPU", 0.0)) >= workers + 1 else "gloo"


def make_channel(
    kind: str, ray: Any, actors: list[Any], *, on_dead: Callable[[int, str], None], colocate: bool = False
) -> Any:
    """The weight channel named by `rollout.weight_sync`."""
    if kind == "collective":
        return CollectiveChannel(ray, actors, on_dead=on_dead, backend=collective_backend(ray, len(actors), colocate))
    return ObjectStoreChannel(ray, actors)


class HeldVersions:
    """A worker's side of the collective channel: the group, and the versions it received and may be asked for."""

    def __init__(self) -> None:
        self.group: Any = None
        self.generation = -1
        self.backend = "gloo"
        self.versions: dict[int, dict[str, Tensor]] = {}

    def join(self, host: str, port: int, generation: int, rank: int, size: int, backend: str) -> None:
        """Join generation `generation` of the group; a call of an older generation (delivered late, e.g. queued
        for this process while it restarted) is ignored."""
        if generation <= self.generation:
            return
        self.group = join_group(host, port, generation, rank, size, backend)
        self.generation, self.backend = generation, backend

    def receive(
        self, version: int, specs: list[TensorSpec], keep: list[int], bucket_bytes: int, generation: int
    ) -> bool:
        """Take part in the broadcast of `version` over generation `generation` of the group; False (and nothing
        received) when that is not the generation this process joined: a late call must never consume the buckets of
        another broadcast."""
        if generation != self.generation:
            return False
        nccl = self.backend == "nccl"  # NCCL moves device tensors; gloo host memory
        device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
        if self.group is None:
            raise RuntimeError("receive_weights: this worker has not joined the weight group")
        self.versions[version] = broadcast_state(self.group, specs, None, device=device, bucket_bytes=bucket_bytes)
        for v in [v for v in self.versions if v not in keep and v != version]:
            del self.versions[v]
        return True

    def get(self, version: int) -> dict[str, Tensor]:
        if version not in self.versions:
            raise RuntimeError(
                f"weight group: version {version} was never received here (held: {sorted(self.versions)})"
            )
        return self.versions[version]


__all__ = [
    "BUCKET_BYTES",
    "WEIGHT_SYNCS",
    "CollectiveChannel",
    "HeldVersions",
    "ObjectStoreChannel",
    "TensorSpec",
    "broadcast_state",
    "collective_backend",
    "join_group",
    "make_channel",
    "plan_buckets",
    "snapshot",
    "specs_of",
    "unique_bytes",
]
