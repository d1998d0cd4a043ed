"""Which exceptions are recoverable data-plane communication faults, given a backend's message fragments.

Pure classification (no torch import: torch.distributed's error classes are read from sys.modules).
Each :class:`accelpact.backends.Backend` calls :func:`matches_comm_fault` with its own fragments;
``accelpact.backends.is_comm_fault`` with every registered backend's.
"""

from __future__ import annotations

import sys
from collections.abc import Collection

from accelpact.errors import CommFault, ControlChannelError, UnrecoverableError

__all__ = ["GENERIC_FAULT_MARKERS", "matches_comm_fault"]

# Lower-cased fragments of operating-system socket errors, whatever the backend's transport. The
# backend-specific fragments (gloo's "Connection closed by peer" / "Timed out waiting", NCCL's
# "ncclRemoteError", ...) live with each backend (accelpact.backends, ``Backend.fault_markers``).
GENERIC_FAULT_MARKERS: tuple[str, ...] = (
    "connection reset by peer",
    "connection refused",
    "broken pipe",
    "socket timeout",
    "no route to host",
    "network is unreachable",
    "transport endpoint is not connected",
)

# Errors that are never comm faults even if their text happens to contain a marker.
_NEVER_COMM: tuple[type[BaseException], ...] = (MemoryError, KeyboardInterrupt, SystemExit, GeneratorExit)


def _dist_error_types() -> tuple[type[BaseException], ...]:
    """torch.distributed's backend/network/store error classes, or () when it was never imported.

    Read from sys.modules instead of importing: an exception of those classes can only exist once
    torch.distributed is loaded, and pure-logic callers should not pay seconds for importing torch.
    """
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return ()
    # DistStoreError counts: raw store errors reach the caller only from the data-plane store (gloo's
    # rendezvous when a peer never joins); the control channel converts its own into ControlChannelError.
    names = ("DistBackendError", "DistNetworkError", "DistStoreError")
    return tuple(cls for cls in (getattr(dist, n, None) for n in names) if isinstance(cls, type))


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError):
        return True
    if type(exc).__name__ == "OutOfMemoryError":  # torch.OutOfMemoryError without importing torch
        return True
    return "out of memory" in str(exc).lower()


def matches_comm_fault(exc: BaseException, markers: Collection[str], never_markers: Collection[str] = ()) -> bool:
    """True when ``exc`` is a recoverable data-plane communication fault.

    Accepts :class:`CommFault`, torch's ``DistBackendError`` / ``DistNetworkError`` / ``DistStoreError``,
    and plain ``RuntimeError`` whose text carries a transport message: an operating-system socket error
    (:data:`GENERIC_FAULT_MARKERS`) or one of ``markers``, the lower-cased fragments a backend's
    transport raises (e.g. gloo's "Connection closed by peer" or "Timed out waiting";
    ``accelpact.backends.is_comm_fault`` passes every registered backend's). ``never_markers`` are
    fragments that make an error NOT a comm fault even if it is a ``DistBackendError`` (a backend's usage
    errors). An exception explicitly wrapping a fault
    (``raise X from fault``) counts too; an unrelated error merely raised while handling one
    (``__context__``) does not. Rejects unrecoverable AccelPact errors, out-of-memory,
    KeyboardInterrupt/SystemExit, and ordinary errors such as shape mismatches.
    """
    fragments = GENERIC_FAULT_MARKERS + tuple(markers)
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, _NEVER_COMM) or isinstance(cur, (UnrecoverableError, ControlChannelError)):
            return False
        if _is_oom(cur):
            return False
        if isinstance(cur, CommFault):
            return True
        if isinstance(cur, RuntimeError):
            text = str(cur).lower()
            if any(marker in text for marker in never_markers):
                return False
            dist_types = _dist_error_types()
            if dist_types and isinstance(cur, dist_types):
                return True
            if any(marker in text for marker in fragments):
                return True
        cur = cur.__cause__
    return False
