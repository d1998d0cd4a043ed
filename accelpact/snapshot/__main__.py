"""``python -m accelpact.snapshot list | cleanup``: find and remove jobs' snapshot directories.

Snapshots live in shared memory until removed: a clean exit removes its own (``close(remove=True)``),
a job killed outright leaves them. ``list`` shows every job under the root with its ranks, newest
step, size and how long ago it last wrote; ``cleanup TOKEN...`` removes those jobs, ``cleanup
--idle-s N`` every job that wrote nothing for N seconds (a live job writes a marker every snapshot).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from accelpact.snapshot.layout import default_root, remove_job
from accelpact.snapshot.sizing import gib, used_bytes
from accelpact.snapshot.slots import MARKER, read_marker

__all__ = ["jobs", "main"]


def jobs(root: str | Path) -> list[dict[str, Any]]:
    """Every job directory under ``root``: token, ranks with slots, newest step, bytes, seconds idle."""
    out: list[dict[str, Any]] = []
    root = Path(root)
    if not root.is_dir():
        return out
    now = time.time()
    for job in sorted(p for p in root.iterdir() if p.is_dir()):
        markers = [m for m in job.glob(f"**/{MARKER}")]
        newest = [read_marker(m.parent) for m in markers]
        mtimes = [p.stat().st_mtime for p in job.rglob("*") if p.is_file()] or [job.stat().st_mtime]
        out.append(
            {
                "token": job.name,
                "ranks": sorted(p.name for p in job.glob("rank*")),
                "newest_step": max((m.step for m in newest if m is not None), default=None),
                "bytes": used_bytes(job),
                "idle_s": now - max(mtimes),
            }
        )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m accelpact.snapshot", description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=default_root(), help="snapshot root (default: %(default)s)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="jobs under the root")
    clean = sub.add_parser("cleanup", help="remove jobs' snapshots")
    clean.add_argument("tokens", nargs="*")
    clean.add_argument("--idle-s", type=float, default=None, help="also every job idle this long")
    args = ap.parse_args(argv)
    found = jobs(args.root)
    if args.cmd == "list":
        for j in found:
            print(
                f"{j['token']}  ranks={','.join(j['ranks']) or '-'}  newest_step={j['newest_step']}  "
                f"{gib(j['bytes'])}  idle {j['idle_s']:.0f} s"
            )
        return 0
    if not args.tokens and args.idle_s is None:
        ap.error("cleanup needs job tokens or --idle-s SECONDS")
    targets = set(args.tokens) | {j["token"] for j in found if args.idle_s is not None and j["idle_s"] >= args.idle_s}
    for token in sorted(targets):
        if remove_job(args.root, token):
            print(f"removed {Path(args.root) / token}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
