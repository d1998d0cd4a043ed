"""The snapshots' CRC-32 gives zlib's values whichever implementation computes it.

A marker written by a process with ``isal`` must verify in one without it (and back), so ISA-L's
CRC-32 and zlib's must agree bit for bit: on random buffers of awkward sizes, continued across chunk
boundaries (``crc32_bytes`` feeds 64 MiB chunks; the writer may continue a value), and through the
file path (a read-only mapping). The fallback is checked in a fresh process with
``ACCELPACT_CRC32=zlib``, which must pick zlib and still produce the same marker checksums.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from accelpact.snapshot import checksum, slots

ROOT = Path(__file__).resolve().parents[2]
SIZES = (0, 1, 7, 63, 64, 65, 4095, 4096, 65537, (1 << 20) + 3)


def _buffers(seed: int = 11) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(n) for n in SIZES]


def test_crc32_equals_zlib_on_random_buffers():
    for buf in _buffers():
        assert checksum.crc32(buf) == zlib.crc32(buf) & 0xFFFFFFFF, len(buf)


def test_isal_and_zlib_agree_when_continued_at_every_split():
    isal_zlib = pytest.importorskip("isal.isal_zlib", reason="isal not installed: only zlib is in use here")
    rng = random.Random(5)
    buf = rng.randbytes(3 * 4096 + 17)
    want = zlib.crc32(buf)
    for cut in sorted(
        {0, 1, 63, 64, 4096, 4097, len(buf) // 2, len(buf) - 1, len(buf)} | {rng.randrange(len(buf)) for _ in range(20)}
    ):
        assert isal_zlib.crc32(buf[cut:], isal_zlib.crc32(buf[:cut])) == want, cut
        assert isal_zlib.crc32(buf[cut:], zlib.crc32(buf[:cut])) == want, cut  # a value handed across
        assert zlib.crc32(buf[cut:], isal_zlib.crc32(buf[:cut])) == want, cut


def test_crc32_bytes_across_its_chunk_boundary(monkeypatch):
    buf = random.Random(3).randbytes(10_000)
    monkeypatch.setattr(slots, "_CHUNK", 4096)  # 3 chunks, the last one short
    assert slots.crc32_bytes(memoryview(buf)) == zlib.crc32(buf)
    assert slots.crc32_bytes(buf[5000:], slots.crc32_bytes(buf[:5000])) == zlib.crc32(buf)


def test_crc32_file_matches_zlib(tmp_path):
    for i, buf in enumerate(_buffers(seed=2)):
        p = tmp_path / f"f{i}"
        p.write_bytes(buf)
        assert slots.crc32_file(p) == (len(buf), zlib.crc32(buf)), len(buf)


def test_implementation_is_isal_when_installed():
    try:
        import isal.isal_zlib  # noqa: F401
    except ImportError:
        assert checksum.IMPLEMENTATION == "zlib" and "pip install isal" in checksum.describe()
    else:
        assert checksum.IMPLEMENTATION == "isal" or os.environ.get("ACCELPACT_CRC32") == "zlib"


def test_zlib_fallback_gives_the_same_marker_checksums(tmp_path):
    """A fresh process forced onto zlib: same file CRCs and combined checksum as this process."""
    files = {}
    for i, buf in enumerate(_buffers(seed=9)[-3:]):
        (tmp_path / f"f{i}").write_bytes(buf)
        n, crc = slots.crc32_file(tmp_path / f"f{i}")
        files[f"f{i}"] = {"nbytes": n, "crc32": crc}
    code = (
        "import sys, json; from pathlib import Path; from accelpact.snapshot import checksum, slots; "
        "d = Path(sys.argv[1]); fs = {p.name: dict(zip(('nbytes', 'crc32'), slots.crc32_file(p))) "
        "for p in sorted(d.iterdir())}; print(json.dumps([checksum.IMPLEMENTATION, fs, slots.combined_checksum(fs)]))"
    )
    env = {**os.environ, "ACCELPACT_CRC32": "zlib", "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], env=env, capture_output=True, text=True, timeout=120, check=True
    )
    impl, theirs, combined = json.loads(out.stdout)
    assert impl == "zlib"
    assert theirs == files
    assert combined == slots.combined_checksum(files)
