"""Buddies of the replica channel: who holds whose replicas, and where to reach them.

Who is whose buddy (:func:`buddy_of`): the same local rank on the next host, wrapping around; with
one host, the next rank. Hosts are, in this order of preference: an explicit list of each host's
ranks (``hosts=``), or contiguous blocks of ``local_world_size`` ranks (torchrun's and Slurm's
block placement; read from ``LOCAL_WORLD_SIZE`` when not given), else one host holding every rank.

Where (:class:`AddressBook`): each rank's replica server binds on its *control-network* address
(:func:`control_bind_address`) and publishes it in the control store under the job token, signed with
it (``accelpact.control.notice_auth``), so another job can neither read nor redirect it.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from typing import Any, Protocol

from accelpact.control.notice_auth import NoticeRejected, sign, verify
from accelpact.snapshot._replica_wire import WireError

__all__ = ["buddy_of", "wards_of", "host_groups", "control_bind_address", "AddressBook"]

_CONNECT_TIMEOUT_S = 5.0
_IO_TIMEOUT_S = 60.0
_RESOLVE_DEADLINE_S = 2.0


class AddressStore(Protocol):  # the part of accelpact.ControlChannel the replica channel uses
    job_token: str

    def key(self, *parts: str) -> str: ...
    def set(self, key: str, value: bytes) -> None: ...
    def get(self, key: str, deadline_s: float | None = None) -> bytes: ...


def host_groups(
    world_size: int, *, hosts: Sequence[Sequence[int]] | None = None, local_world_size: int | None = None
) -> list[list[int]]:
    """Each host's ranks: ``hosts`` as given, else blocks of ``local_world_size`` (default: the
    ``LOCAL_WORLD_SIZE`` environment variable, else every rank on one host)."""
    if hosts is not None:
        groups = [list(h) for h in hosts]
        flat = sorted(r for h in groups for r in h)
        if flat != list(range(world_size)) or any(not h for h in groups):
            raise ValueError(
                f"hosts={hosts!r} must split ranks 0..{world_size - 1} into non-empty hosts, each rank once"
            )
        return groups
    if local_world_size is None:
        env = os.environ.get("LOCAL_WORLD_SIZE")
        local_world_size = int(env) if env else world_size
    if local_world_size < 1:
        raise ValueError(f"local_world_size={local_world_size} must be >= 1")
    return [list(range(s, min(s + local_world_size, world_size))) for s in range(0, world_size, local_world_size)]


def buddy_of(rank: int, world_size: int, **topology: Any) -> int | None:
    """The rank that holds ``rank``'s replicas (None with a single rank: there is nobody to hold them).

    The same local rank on the next host (a smaller next host wraps the local rank); with one host,
    the next rank. ``topology``: ``hosts=`` or ``local_world_size=`` as for :func:`host_groups`."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside 0..{world_size - 1}")
    if world_size == 1:
        return None
    groups = host_groups(world_size, **topology)
    if len(groups) == 1:
        return (rank + 1) % world_size
    h = next(i for i, g in enumerate(groups) if rank in g)
    nxt = groups[(h + 1) % len(groups)]
    return nxt[groups[h].index(rank) % len(nxt)]


def wards_of(rank: int, world_size: int, **topology: Any) -> list[int]:
    """The ranks whose replicas ``rank`` holds."""
    return [r for r in range(world_size) if buddy_of(r, world_size, **topology) == rank]


def control_bind_address(control_host: str) -> str:
    """This host's address on the control network: ``ACCELPACT_REPLICA_ADDR`` if set, else the local
    address the kernel routes to the control store from (a UDP connect sends nothing)."""
    explicit = os.environ.get("ACCELPACT_REPLICA_ADDR")
    if explicit:
        return explicit
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((control_host, 9))
        return str(s.getsockname()[0])


class AddressBook:
    """Each rank's replica server address in ``store``, signed with ``job_token``; looked up once and
    cached (``fresh=True`` looks again: after a broken connection the buddy may have been replaced)."""

    def __init__(self, store: AddressStore, job_token: str) -> None:
        self.store, self.job_token = store, job_token
        self._cache: dict[int, tuple[str, int]] = {}

    def _key(self, rank: int) -> str:
        return self.store.key("replica", "addr", str(rank))

    def publish(self, rank: int, host: str, port: int) -> None:
        body = {"rank": rank, "host": host, "port": port, "pid": os.getpid()}
        self.store.set(self._key(rank), sign(body, self.job_token))

    def resolve(self, rank: int, fresh: bool = False) -> tuple[str, int]:
        if fresh or rank not in self._cache:
            raw = self.store.get(self._key(rank), deadline_s=_RESOLVE_DEADLINE_S)
            try:
                body = verify(raw, self.job_token)
            except NoticeRejected as why:
                raise WireError(f"replica address of rank {rank} refused: {why}") from None
            self._cache[rank] = (str(body["host"]), int(body["port"]))
        return self._cache[rank]

    def connect(self, rank: int, fresh: bool) -> socket.socket:
        sock = socket.create_connection(self.resolve(rank, fresh), timeout=_CONNECT_TIMEOUT_S)
        sock.settimeout(_IO_TIMEOUT_S)
        return sock
