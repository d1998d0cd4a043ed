"""Give the C heap's free pages back to the OS after a recovery (glibc's ``malloc_trim``).

Measured on 2 ranks of the tiny decoder (``experiments.recovery_memory``, the 1000-fault soak): per
recovery, glibc's in-use heap grew 6-16 KiB, but its free-and-kept part grew 0.1-0.3 MiB, and RSS with
it. Each recovery allocates and frees a few hundred KB in C++ (a new gloo context and its thread, store
clients, error paths) among blocks that stay, and glibc returns only the top of a heap to the OS by
itself. ``MALLOC_ARENA_MAX=2`` did not help. ``malloc_trim(0)`` after each recovery returns every free
page of every arena: over 1000 faults RSS grew 0.019 MiB per fault instead of 0.097.

It runs after the new generation's first collective, with the old generation's retirement, so its
cost (3-6 ms on this host, counted in ``RecoveryEvent.retire_s``) is outside the recovery's ``total_s``.
Not glibc (musl, macOS): a no-op. ``ACCELPACT_MALLOC_TRIM=0`` turns it off.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable

__all__ = ["release_free_heap"]

_trim: Callable[[int], int] | None = None
_looked = False


def _malloc_trim() -> Callable[[int], int] | None:
    global _trim, _looked
    if not _looked:
        _looked = True
        try:
            _trim = ctypes.CDLL(None).malloc_trim  # the C library this process already uses
            _trim.argtypes, _trim.restype = [ctypes.c_size_t], ctypes.c_int
        except (OSError, AttributeError):  # not glibc: nothing to call
            _trim = None
    return _trim


def release_free_heap() -> bool:
    """``malloc_trim(0)``: return every arena's free pages to the OS. True if glibc released any.

    Never raises; a no-op without glibc or with ``ACCELPACT_MALLOC_TRIM=0``.
    """
    if os.environ.get("ACCELPACT_MALLOC_TRIM", "1") == "0":
        return False
    trim = _malloc_trim()
    return bool(trim(0)) if trim is not None else False
