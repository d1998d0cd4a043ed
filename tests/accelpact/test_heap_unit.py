"""accelpact.dataplane.heap.release_free_heap on a real glibc heap: freed memory that glibc keeps (a live block
above it stops the automatic trim) goes back to the OS, and ACCELPACT_MALLOC_TRIM=0 leaves it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

SCRIPT = r"""
import ctypes, os, sys
from accelpact.dataplane.heap import release_free_heap  # first: importing accelpact (torch) moves RSS itself

libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]

def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

blocks = []
for _ in range(3200):  # 200 MiB in 64 KiB blocks: below the mmap threshold, so from the heap
    p = libc.malloc(64 * 1024)
    ctypes.memset(p, 1, 64 * 1024)  # touch it: resident
    blocks.append(p)
for p in blocks[:-1]:  # the newest stays: a live block at the top, so glibc cannot shrink the heap itself
    libc.free(p)
before = rss_mib()
released = release_free_heap()
print(before, rss_mib(), released)
"""


def _run(env_extra: dict[str, str]) -> tuple[float, float, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]), **env_extra)
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    before, after, released = out.stdout.split()
    return float(before), float(after), released


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim: Linux only")
def test_free_pages_kept_by_glibc_go_back_to_the_os():
    before, after, released = _run({})
    assert before - after > 150, f"RSS {before:.0f} -> {after:.0f} MiB: the 200 MiB freed stayed resident"
    assert released == "True"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim: Linux only")
def test_switched_off_it_leaves_the_heap_alone():
    before, after, released = _run({"ACCELPACT_MALLOC_TRIM": "0"})
    assert before - after < 20, f"RSS {before:.0f} -> {after:.0f} MiB although the trim was off"
    assert released == "False"
