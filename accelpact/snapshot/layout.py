"""Where snapshots live: one root per host, one directory per job, two slots per rank.

``<root>/<job_token>/rank<r>/slot0|slot1/`` hold a rank's own snapshots;
``<root>/<job_token>/replica/rank<src>/slot0|slot1/`` hold the copies a buddy keeps for rank ``src``.
The root defaults to ``$ACCELPACT_SNAPSHOT_ROOT``, else ``/dev/shm/accelpact``: a tmpfs, so a
snapshot is a memory copy that outlives the process that wrote it (not the host). A launcher that
simulates several hosts on one machine gives each "host" its own root through that variable.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

__all__ = [
    "DEFAULT_ROOT",
    "ENV_ROOT",
    "default_root",
    "job_dir",
    "rank_dir",
    "slot_dir",
    "replica_dir",
    "SLOTS",
    "check_token",
    "remove_job",
    "remove_rank",
]

ENV_ROOT = "ACCELPACT_SNAPSHOT_ROOT"
DEFAULT_ROOT = "/dev/shm/accelpact"
SLOTS = (0, 1)
# A token becomes a directory name: nothing that could climb out of the root or hide a separator.
_TOKEN_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")


def default_root() -> str:
    """``$ACCELPACT_SNAPSHOT_ROOT`` if set, else ``/dev/shm/accelpact``."""
    return os.environ.get(ENV_ROOT) or DEFAULT_ROOT


def check_token(job_token: str) -> str:
    """The token itself if it is usable as one path component; ValueError naming the rule otherwise."""
    if not isinstance(job_token, str) or not _TOKEN_RE.match(job_token):
        raise ValueError(
            f"job_token {job_token!r} cannot name a snapshot directory: use 1-200 characters of "
            "letters, digits, '.', '_' or '-', not starting with a dot"
        )
    return job_token


def job_dir(root: str | os.PathLike[str], job_token: str) -> Path:
    return Path(root) / check_token(job_token)


def rank_dir(root: str | os.PathLike[str], job_token: str, rank: int) -> Path:
    return job_dir(root, job_token) / f"rank{int(rank)}"


def slot_dir(root: str | os.PathLike[str], job_token: str, rank: int, slot: int) -> Path:
    if slot not in SLOTS:
        raise ValueError(f"slot {slot!r}: a rank has slots {SLOTS}")
    return rank_dir(root, job_token, rank) / f"slot{slot}"


def replica_dir(root: str | os.PathLike[str], job_token: str, src_rank: int, slot: int | None = None) -> Path:
    """Where a buddy keeps rank ``src_rank``'s replicas (one slot of them when ``slot`` is given)."""
    base = job_dir(root, job_token) / "replica" / f"rank{int(src_rank)}"
    return base if slot is None else base / f"slot{slot}"


def remove_job(root: str | os.PathLike[str], job_token: str) -> bool:
    """Delete every snapshot and replica of ``job_token`` under ``root``; True if there was anything."""
    path = job_dir(root, job_token)
    if not path.exists():
        return False
    shutil.rmtree(path, ignore_errors=True)
    return True


def remove_rank(root: str | os.PathLike[str], job_token: str, rank: int) -> bool:
    """Delete rank ``rank``'s own slots of ``job_token`` (a new job reusing a token: stale slots must go,
    or the double buffer would keep overwriting the new job's older slot next to a stale newer one)."""
    path = rank_dir(root, job_token, rank)
    if not path.exists():
        return False
    shutil.rmtree(path, ignore_errors=True)
    return True
