"""Each simulated host's own snapshot root (its "shared-memory directory"), and removing them.

A rank reads its snapshot root from ``ACCELPACT_SNAPSHOT_ROOT`` (the snapshot package's default is
``/dev/shm/accelpact``). With network namespaces every host namespace is a host of its own, so the
topology gives the ranks of host ``h`` the root ``<base>/<prefix>-h<h>`` (``<prefix>-r<h>`` with one
namespace per rank): ``host_loss`` deletes exactly one host's copies, and a buddy replica on another
host survives it. The base is the parent's ``ACCELPACT_SNAPSHOT_ROOT`` or ``/dev/shm/accelpact``.
A run without namespaces is one host: its ranks share ``<base>/<fresh prefix>-h0``
(:func:`single_host_snapshot_env`), removed when the parent finishes, Ctrl-C included.

Every root carries the job's netns prefix, so ``python -m harness.faults.netns cleanup PREFIX`` (the
stale cleanup) removes them with the namespaces, and ``leftovers PREFIX`` lists them.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from harness.faults.addressing import PREFIX_RE, new_prefix

__all__ = [
    "ROOT_ENV",
    "DEFAULT_BASE",
    "snapshot_base",
    "host_root",
    "job_roots",
    "remove_job_roots",
    "single_host_snapshot_env",
    "root_prefixes",
]

ROOT_ENV = "ACCELPACT_SNAPSHOT_ROOT"
DEFAULT_BASE = "/dev/shm/accelpact"


def snapshot_base() -> Path:
    """Where this job's hosts get their roots: the parent's ``ACCELPACT_SNAPSHOT_ROOT``, else /dev/shm/accelpact."""
    return Path(os.environ.get(ROOT_ENV) or DEFAULT_BASE)


def host_root(host_ns: str, base: Path | None = None) -> Path:
    """The snapshot root of the host whose namespace is ``host_ns`` (e.g. ``ap3f9a1c-h1``)."""
    return (base or snapshot_base()) / host_ns


def job_roots(prefix: str, base: Path | None = None) -> list[Path]:
    """Every host root of job ``prefix`` that exists now."""
    b = base or snapshot_base()
    return sorted(b.glob(f"{prefix}-*")) if b.is_dir() else []


def remove_job_roots(prefix: str, base: Path | None = None) -> list[str]:
    """Delete every host root of job ``prefix``; returns what was removed, for the cleanup's report."""
    removed = []
    for root in job_roots(prefix, base):
        shutil.rmtree(root, ignore_errors=True)
        removed.append(f"snapshots {root}")
    return removed


def single_host_snapshot_env(env: dict[str, str], tag_env: str) -> str:
    """Point the ranks of a run without namespaces (one host) at a fresh root of their own; returns
    the fresh prefix that names it (``remove_job_roots(prefix)`` at the end, ``cleanup PREFIX`` after
    a parent that was killed)."""
    prefix = new_prefix()
    env[ROOT_ENV] = str(host_root(f"{prefix}-h0"))
    env[tag_env] = prefix  # the job tag (netns_host.TAG_ENV): `cleanup PREFIX` finds ranks a killed parent orphaned
    return prefix


def root_prefixes(base: Path | None = None) -> list[str]:
    """Job prefixes that own a snapshot root now (live or stale)."""
    b = base or snapshot_base()
    names = {p.name.split("-", 1)[0] for p in b.iterdir() if "-" in p.name} if b.is_dir() else set()
    return sorted(n for n in names if PREFIX_RE.match(n))
