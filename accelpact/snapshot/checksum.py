"""The snapshots' CRC-32: ISA-L's implementation when ``isal`` is importable, else the standard library's.

Both compute the same function (the zlib/PNG CRC-32, polynomial 0xEDB88320), so the values in a
marker do not depend on which one wrote or reads it: a slot written with one is verified with the
other (``tests/accelpact/test_checksum.py`` checks that they agree on random buffers, continued over
chunk boundaries too).

Why the optional dependency: the CRC-32 of each snapshot was about two thirds of the snapshot
thread's CPU, and that thread's CPU is the snapshot overhead on a host whose cores all train.
Measured on this 2-core EPYC over 256 MiB: ``zlib.crc32`` 3.65 GB/s, ``isal.isal_zlib.crc32``
10.3 GB/s; over a 35 MiB mistral_tiny-like shard, copy + CRC took 16.4 ms of thread CPU with zlib
and 9.6 ms with ISA-L (the copy alone 6.7 ms). Both release the GIL on large buffers. ``isal`` is
a small C extension (python-isal, manylinux/macOS wheels) and a runtime dependency of the package;
an environment without it still works, at zlib's speed. It is the one import beyond torch and the
standard library that the runtime allows (``tests/test_import_rules.py`` names it), always guarded.

``ACCELPACT_CRC32=zlib`` forces the standard library's (e.g. to measure the difference).
"""

from __future__ import annotations

import logging
import os
import zlib
from collections.abc import Callable
from typing import Any

__all__ = ["crc32", "IMPLEMENTATION", "describe"]

_log = logging.getLogger("accelpact.snapshot")


def _pick() -> tuple[Callable[..., int], str]:
    if os.environ.get("ACCELPACT_CRC32", "").lower() != "zlib":
        try:
            from isal import isal_zlib  # optional: ~2.8x zlib's CRC-32 here, same values

            return isal_zlib.crc32, "isal"
        except ImportError:
            pass
    return zlib.crc32, "zlib"


_crc32, IMPLEMENTATION = _pick()
_logged = False


def describe() -> str:
    """Which CRC-32 implementation this process uses, in words."""
    if IMPLEMENTATION == "isal":
        return "isal (ISA-L) CRC-32"
    why = (
        "ACCELPACT_CRC32=zlib"
        if os.environ.get("ACCELPACT_CRC32", "").lower() == "zlib"
        else "isal is not installed: `pip install isal` for ~2.8x faster snapshot checksums"
    )
    return f"zlib CRC-32 ({why})"


def crc32(data: Any, value: int = 0) -> int:
    """CRC-32 of a bytes-like object, continuing from ``value`` (as ``zlib.crc32``); logged once per process."""
    global _logged
    if not _logged:
        _logged = True
        _log.info("snapshot checksums: %s", describe())
    return _crc32(data, value) & 0xFFFFFFFF
