"""The snapshots' CRC-32: ISA-L's implementation when ``isal`` is importable, else the standard library's.

Both compute the same function (the zlib/PNG CRC-32, polynomial 0xEDB88320), so a slot written with one
is verified with the other (``tests/accelpact/test_checksum.py`` checks that they agree). Why the optional
dependency: the CRC-32 was about two thirds of the snapshot thread's CPU, which on a host whose cores all
train is the snapshot overhead, and ISA-L's is about 2.8x zlib's (docs/snapshots.md, "Validation and
checksums", has the measurements). It is the one import beyond torch and the standard library that the
runtime allows (``tests/test_import_rules.py`` names it), always guarded; without it the runtime still
works, at zlib's speed.

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
