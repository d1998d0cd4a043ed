"""The reconfigure data-plane path (torch >= 2.15): recover the SAME process groups in place.

torch 2.15 can re-initialise a process group's communicator without replacing the group object
(``dist._get_reconfigure_handle`` / ``dist._reconfigure(uuid, handles, group=...)``), so every reference
FSDP2, DeviceMesh and DTensor cached stays valid and the guard's rebind is an identity no-op.

Protocol, per group, on the generation's never-used store prefix: every member publishes its handle under
its group rank, group rank 0 also a fresh random uuid (one per group and per (re)initialisation), and each
member calls ``_reconfigure`` with all handles in group-rank order. Then every rank publishes whether all its
groups reconfigured: if ANY rank failed, ALL fall back to rebuild-and-rebind in the same round
(:class:`Fallback`). A heal's replacement creates its groups with ``enable_reconfigure=True`` under the
survivors' names and runs the same protocol (:func:`join_groups`). docs/torch_versions.md has the
measurements on gloo.
"""

from __future__ import annotations

import datetime
import logging
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist

    from accelpact.backends.generations import GroupSpec

_log = logging.getLogger(__name__)

__all__ = [
    "PATH_MODES",
    "Fallback",
    "ReconfigurePath",
    "api_available",
    "group_store_address",
    "join_groups",
    "store_at",
    "unsupported_reason",
]

#: what ``attach(data_plane=...)`` accepts: "auto" (reconfigure when every group supports it),
#: "reconfigure" (the same, but say loudly at attach when it cannot), "rebuild" (always rebuild and rebind)
PATH_MODES = ("auto", "reconfigure", "rebuild")
_RESULT_OK = "ok"
# The longest a reconfigure may take when the caller names no bound: the handle exchange before it
# already waits for every member, so a healthy reconfigure takes milliseconds (0.3-13.6 ms measured
# here); a member that never joins would otherwise hold every other one for c10d's 30-minute default.
DEFAULT_TIMEOUT = datetime.timedelta(seconds=60)


class Fallback(Exception):
    """Some rank could not reconfigure in this round: every rank rebuilds instead (``reason`` says why)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def api_available() -> bool:
    """True when this torch has the process-group reconfigure API (2.15 and later)."""
    import torch.distributed as dist

    return all(hasattr(dist, f) for f in ("_supports_reconfigure", "_get_reconfigure_handle", "_reconfigure"))


def unsupported_reason(groups: Sequence[Any]) -> str | None:
    """Why ``groups`` cannot take the reconfigure path, or None when every one of them can."""
    import torch
    import torch.distributed as dist

    if not api_available():
        return (
            f"torch {torch.__version__} has no process-group reconfigure (torch 2.15 added it): "
            "recovery rebuilds the groups and rebinds every cached reference"
        )
    for pg in groups:
        try:
            ok = bool(dist._supports_reconfigure(pg))  # type: ignore[attr-defined]  # torch >= 2.15
        except Exception as exc:  # noqa: BLE001 - a backend without the property: not supported, say why
            return f"group {_name(pg)!r} cannot say whether it supports reconfigure ({exc})"
        if not ok:
            return (
                f"group {_name(pg)!r} does not support reconfigure (its backend; for nccl create it with "
                "init_process_group(..., enable_reconfigure=True))"
            )
    return None


@dataclass(frozen=True)
class _Keys:
    """The store keys of one group's reconfigure on a generation's store prefix."""

    name: str

    def handle(self, group_rank: int) -> str:
        return f"reconf/pg{self.name}/handle/{group_rank}"

    @property
    def uuid(self) -> str:
        return f"reconf/pg{self.name}/uuid"

    @staticmethod
    def result(rank: int) -> str:
        return f"reconf/result/{rank}"


def _name(pg: Any) -> str:
    return str(getattr(pg, "group_name", pg))


# How often a rank waiting for the others' handles looks again (and for a rank that gave up).
_POLL_S = 0.005


def _wait_for_handles(
    store: dist.Store, keys: list[str], world_ranks: Sequence[int], timeout: datetime.timedelta
) -> None:
    """Until every one of ``keys`` is set; raises at once when a rank of ``world_ranks`` posted that it
    gave up (a replacement that could not create its groups never publishes a handle: without this the
    others waited out the store's timeout, and the replacement's fallback rendezvous with them could
    time out first)."""
    deadline = time.monotonic() + timeout.total_seconds()
    results = [_Keys.result(r) for r in world_ranks]
    while not store.check(keys):
        for key in results:
            if store.check([key]):
                word = store.get(key).decode()
                if word != _RESULT_OK:
                    raise RuntimeError(f"another rank gave up: {word}")
        if time.monotonic() >= deadline:
            raise TimeoutError(f"reconfigure handles {keys} not all published within {timeout.total_seconds():g} s")
        time.sleep(_POLL_S)


def reconfigure_group(
    pg: Any,
    spec: GroupSpec,
    store: dist.Store,
    rank: int,
    timeout: datetime.timedelta = DEFAULT_TIMEOUT,
    world_ranks: Sequence[int] = (),
) -> float:
    """Exchange handles for ``pg`` on ``store`` and reconfigure it in place; returns the seconds it took.

    Every member of the group calls it with the same ``store`` (the generation's prefix). Raises what
    ``_reconfigure`` or its Work raises (a peer that never joins: ``timeout``, or the group's own
    timeout when that is shorter).
    """
    import torch.distributed as dist

    keys = _Keys(spec.name)
    group_rank = spec.ranks.index(rank)
    handle = dist._get_reconfigure_handle(pg)  # type: ignore[attr-defined]  # torch >= 2.15
    if group_rank == 0:
        store.set(keys.uuid, str(secrets.randbits(62)))
    store.set(keys.handle(group_rank), handle)
    _wait_for_handles(store, [keys.uuid] + [keys.handle(i) for i in range(len(spec.ranks))], world_ranks, timeout)
    uuid = int(store.get(keys.uuid).decode())
    handles = [store.get(keys.handle(i)).decode() for i in range(len(spec.ranks))]
    t0 = time.perf_counter()
    bound = min(spec.timeout, timeout) if spec.timeout is not None else timeout
    dist._reconfigure(uuid, handles, group=pg, timeout=bound).wait()  # type: ignore[attr-defined]  # torch >= 2.15
    return time.perf_counter() - t0


class ReconfigurePath:
    """One guard's reconfigure capability: reconfigure every live group in place, or say why not."""

    def __init__(self, world_ranks: Sequence[int], timeout: datetime.timedelta = DEFAULT_TIMEOUT) -> None:
        self.world_ranks = tuple(world_ranks)  # every rank that takes part in a recovery round
        self.timeout = timeout  # each group's reconfigure, once every handle is published
        self.disabled: str | None = None  # set once a round fell back: later rounds rebuild too
        self.last_reconfigure_s = 0.0

    def reconfigure(self, groups: Sequence[Any], specs: Sequence[GroupSpec], store: dist.Store, rank: int) -> list[Any]:
        """Reconfigure ``groups`` (the live ones, in ``specs`` order) in place and return them.

        Raises :class:`Fallback` on EVERY rank when any rank failed (each reads every rank's result);
        the caller then rebuilds. Communication faults of the reconfigure itself are folded into the
        fallback too: the rebuild path is the proven one.
        """
        why: str | None = None
        total = 0.0
        for pg, spec in zip(groups, specs):
            try:
                total += reconfigure_group(pg, spec, store, rank, self.timeout, self.world_ranks)
            except Exception as exc:  # noqa: BLE001 - any failure: fall back, and say which and why
                why = f"rank {rank}: reconfigure of group {spec.name!r} failed: {type(exc).__name__}: {str(exc)[:300]}"
                _log.warning("%s; every rank falls back to rebuild-and-rebind", why)
                break
        self.last_reconfigure_s = total
        store.set(_Keys.result(rank), _RESULT_OK if why is None else why)
        for r in self.world_ranks:
            word = store.get(_Keys.result(r)).decode()
            if word != _RESULT_OK:
                raise Fallback(word)
        return list(groups)


def group_store_address(pg: Any) -> dict[str, Any]:
    """Where ``pg`` was created: ``{"host", "port", "prefix"}`` of the TCPStore and the key prefix its
    creator passed to c10d (below c10d's own ``<group name>/``), which a replacement needs to create
    the group on the same keys (:func:`store_at`). Raises :class:`Fallback` naming what stops it.

    c10d keeps the group's store (``_world.pg_map``) but no way to read a PrefixStore's prefix, so it is
    read from the keys: one probe key written through the group's store and found in the TCPStore's
    key list (a few ms, once per heal plan), then deleted.
    """
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    name = _name(pg)
    entry = c10d._world.pg_map.get(pg)
    if entry is None:
        raise Fallback(f"group {name!r} is not registered with c10d: its store is unknown")
    group_store = entry[1]
    base = getattr(group_store, "_underlying_non_prefix_store", group_store)
    if not isinstance(base, dist.TCPStore):
        raise Fallback(
            f"group {name!r} was created on a {type(base).__name__}, not a TCPStore: a replacement "
            "process cannot reach it to reconfigure with the survivors"
        )
    probe = f"accelpact-store-probe/{secrets.token_hex(8)}"
    full = None
    try:
        group_store.set(probe, b"1")  # type: ignore[arg-type]  # the stub says str; bytes are stored as is
        full = next((k for k in base.list_keys() if k.endswith(probe)), None)
    except Exception as exc:  # noqa: BLE001 - a store that cannot list its keys: say so, and rebind
        raise Fallback(f"group {name!r}: could not read its store's key prefix: {type(exc).__name__}: {exc}") from exc
    finally:
        if full is not None:
            base.delete_key(full)
    if full is None:
        raise Fallback(f"group {name!r}: the probe key written through its store was not found in the TCPStore")
    group_prefix = full[: -len(probe)]  # e.g. "init/0//": the creator's prefix, then c10d's "<name>/" and "/"
    own = f"{name}//"
    if not group_prefix.endswith(own):
        raise Fallback(f"group {name!r}: its store prefix {group_prefix!r} does not end with c10d's {own!r}")
    return {"host": base.host, "port": base.port, "prefix": group_prefix[: -len(own)]}


def store_at(address: dict[str, Any], timeout: datetime.timedelta) -> dist.Store:
    """A client of the store :func:`group_store_address` described, under the same key prefix."""
    import torch.distributed as dist

    store: dist.Store = dist.TCPStore(
        address["host"], int(address["port"]), is_master=False, timeout=timeout, wait_for_workers=False
    )
    prefix = address["prefix"]
    # Every PrefixStore joins ``prefix + "/" + key``, so a creator's prefix is "" or ends with "/".
    return dist.PrefixStore(prefix[:-1], store) if prefix else store


def join_groups(
    specs: Sequence[GroupSpec],
    store: dist.Store,
    rank: int,
    device_id: torch.device | None = None,
    *,
    group_stores: Sequence[dict[str, Any]],
    timeout: datetime.timedelta = DEFAULT_TIMEOUT,
) -> list[Any]:
    """On a replacement process: create every group in the reconfigure regime under the survivors'
    names, each on the store ``group_stores[i]`` describes (the survivors' group's own store and prefix,
    :func:`group_store_address`), and reconfigure it with them (they run
    :meth:`ReconfigurePath.reconfigure` on ``store``).

    Raises :class:`Fallback` when any rank failed (then everyone rebuilds, the replacement with
    :func:`accelpact.backends.generations.rebuild_group`, which frees the names registered here first).
    """
    import torch.distributed.distributed_c10d as c10d

    world = sorted({r for s in specs for r in s.ranks})
    try:
        if len(group_stores) != len(specs):
            raise ValueError(f"the plan names {len(group_stores)} group stores for {len(specs)} groups")
        groups = [
            _create_in_regime(spec, store_at(address, timeout), rank, device_id if spec.device_id is not None else None)
            for spec, address in zip(specs, group_stores)
        ]
    except Exception as exc:  # noqa: BLE001 - say so to the survivors (they read every rank's word)
        why = f"rank {rank}: could not create its groups in the reconfigure regime: {type(exc).__name__}: {exc}"
        store.set(_Keys.result(rank), why)
        raise Fallback(why) from exc
    c10d._world.group_count = max(c10d._world.group_count, 1)  # as after init_process_group
    return ReconfigurePath(world, timeout).reconfigure(groups, specs, store, rank)


def _create_in_regime(spec: GroupSpec, store: dist.Store, rank: int, device_id: Any) -> Any:
    """A group registered under ``spec.name`` on ``store`` (c10d adds ``<name>/`` as for the survivors),
    created with ``enable_reconfigure=True`` (no communicator yet)."""
    import torch.distributed.distributed_c10d as c10d

    for pg, name in list(c10d._world.pg_names.items()):  # a half-built group of an earlier round
        if name == spec.name:
            c10d._cleanup_process_group_global_state(pg)
            if c10d._world.default_pg is pg:
                c10d._update_default_pg(None)
    new, _ = c10d._new_process_group_helper(  # type: ignore[call-arg]  # enable_reconfigure: torch >= 2.15
        len(spec.ranks),
        spec.ranks.index(rank),
        [] if spec.is_default else list(spec.ranks),
        spec.backend,
        store,
        spec.name,  # type: ignore[arg-type]  # torch types the name GroupName, a NewType of str
        timeout=spec.timeout or datetime.timedelta(minutes=30),
        pg_tag=spec.tag,
        group_desc=spec.desc,
        device_id=device_id,
        enable_reconfigure=True,
    )
    if spec.is_default:
        c10d._update_default_pg(new)
    c10d._world.pg_group_ranks[new] = {r: i for i, r in enumerate(spec.ranks)}
    return new
