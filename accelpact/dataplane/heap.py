"""Give the C heap's free pages back to the OS after a recovery (glibc's ``malloc_trim``).

Each recovery allocates and frees a few hundred KB in C++ among blocks that stay, and glibc returns only
the top of a heap by itself, so RSS grew with every recovery; ``malloc_trim(0)`` returns every free page
of every arena (docs/reliability.md has the soak's measurements). It runs with the old generation's
retirement, after the new generation's first collective, so its cost is in ``RecoveryEvent.retire_s``,
outside the recovery's ``total_s``. Not glibc (musl, macOS): a no-op. ``ACCELPACT_MALLOC_TRIM=0`` turns
it off.
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
