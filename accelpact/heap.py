"""Give the C heap's free pages back to the OS after a recovery (glibc's ``malloc_trim``).

Measured on 2 ranks over ~100 recoveries of the tiny decoder (``experiments.recovery_memory``):
glibc's in-use heap grew ~16 KB per recovery, but its free-and-kept part grew 0.1-0.6 MiB per
recovery, and RSS with it: each recovery allocates and frees a few hundred KB in C++ (gloo's new
context, c10d's error paths, the store clients) on whichever arena its threads use, and glibc
returns freed memory to the OS only from the top of the main heap. ``MALLOC_ARENA_MAX=2`` did not
help; ``malloc_trim(0)`` after each recovery did (it releases the free pages of every arena).

It runs after the new generation's first collective, with the old generation's retirement, so its
cost (about a millisecond, ``RecoveryEvent.retire_s``) is not part of the recovery's critical path
to agreement. Not glibc (musl, macOS): a no-op. ``ACCELPACT_MALLOC_TRIM=0`` turns it off.
"""

from __future__ import annotations

import ctypes
import os
from typing import Callable

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
