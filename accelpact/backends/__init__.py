"""Backend registry: one :class:`Backend` class per c10d backend name, looked up from a live group.

``backend_for(pg)`` returns a fresh backend object for the c10d backend ``pg`` was created with
("gloo" or "nccl"); the guard holds it for its lifetime. An unsupported backend raises an error
that names the supported ones. ``is_comm_fault(exc)`` classifies an exception with every registered
backend's message fragments (backends/faults.py has the rule). :func:`rebuild_group` builds a group
from its :class:`GroupSpec` on a store prefix, :func:`retire_group` drops one, :func:`store_ports` names the
store connections a fault must spare.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

from accelpact.backends.base import Backend, backend_name
from accelpact.backends.faults import GENERIC_FAULT_MARKERS, matches_comm_fault
from accelpact.backends.generations import rebuild_group, retire_group, store_ports
from accelpact.backends.gloo import DataPlaneSockets, GlooBackend
from accelpact.backends.nccl import NcclBackend
from accelpact.common.group_spec import GroupSpec
from accelpact.errors import AccelPactError

if TYPE_CHECKING:
    import torch.distributed as dist

__all__ = [
    "BACKENDS",
    "Backend",
    "DataPlaneSockets",
    "GENERIC_FAULT_MARKERS",
    "GlooBackend",
    "NcclBackend",
    "all_fault_markers",
    "backend_for",
    "backend_name",
    "is_comm_fault",
    "register",
    "GroupSpec",
    "rebuild_group",
    "retire_group",
    "store_ports",
]

BACKENDS: dict[str, type[Backend]] = {"gloo": GlooBackend, "nccl": NcclBackend}


def register(cls: type[Backend]) -> type[Backend]:
    """Add a backend class under its ``name`` (a plugin's, say). The same class again is a no-op; another
    class under a taken name raises."""
    old = BACKENDS.get(cls.name)
    if old is not None and old is not cls:
        raise ValueError(f"backend {cls.name!r} is already registered ({old.__name__}); pick another name")
    BACKENDS[cls.name] = cls
    return cls


def backend_for(pg: dist.ProcessGroup) -> Backend:
    """A new :class:`Backend` for ``pg``'s c10d backend; AccelPactError naming the supported ones otherwise."""
    name = backend_name(pg)
    cls = BACKENDS.get(name)
    if cls is None:
        raise AccelPactError(
            f"accelpact cannot recover process groups of backend {name!r}; supported backends: "
            f"{', '.join(sorted(BACKENDS))}. Create the data-plane groups with one of them "
            "(init_process_group(backend=...)); mixed backends such as 'cpu:gloo,cuda:nccl' are not supported"
        )
    return cls()


def all_fault_markers() -> tuple[str, ...]:
    """Every registered backend's fault-message fragments (for ``is_comm_fault`` without a backend)."""
    return tuple(m for cls in BACKENDS.values() for m in cls.fault_markers)


def is_comm_fault(
    exc: BaseException, markers: Collection[str] | None = None, never_markers: Collection[str] = ()
) -> bool:
    """True when ``exc`` is a recoverable data-plane communication fault (see
    :func:`accelpact.backends.faults.matches_comm_fault`); ``markers`` None: every registered backend's."""
    return matches_comm_fault(exc, all_fault_markers() if markers is None else markers, never_markers)
