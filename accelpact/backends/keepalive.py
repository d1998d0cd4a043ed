"""Abandoned generations, kept alive for the whole process until their collectives have timed out.

A generation is *abandoned* when this rank gives up waiting on one of its collectives (a peer started a
newer recovery round, or the watchdog fired) while the collective may still be running in the backend.
Destroying such a group blocks until the PG timeout (gloo's destructor joins a worker stuck in the
collective), so the groups and their pending work are kept here until the deadline, then dropped.
They are kept process-wide, not by the backend that abandoned them: a Guard and its backend form a
reference cycle, and whichever garbage collection freed a closed Guard would otherwise wait out the
collective. docs/design.md, "Waiting on the guard's own collectives", has the measurements.

Standard library only; no lock: recoveries run on the training thread.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["Kept", "new_owner", "keep", "forget_expired", "kept_by"]

# Beyond the PG timeout: the backend's own timeout check runs on its own clock and may fire a bit late.
MARGIN_S = 5.0


@dataclass(frozen=True)
class Kept:
    """One abandoned generation: when it may go, its groups, its pending work, and who abandoned it."""

    deadline: float  # time.monotonic() after which the collective has timed out
    groups: list[Any]
    work: Any
    owner: int  # the abandoning backend's new_owner() number (for its own count only)


_kept: list[Kept] = []
_owners = itertools.count(1)


def new_owner() -> int:
    """A number for one backend's entries (never reused, unlike ``id()`` of a freed object)."""
    return next(_owners)


def keep(owner: int, groups: list[Any], work: Any, timeout_s: float) -> Kept:
    """Keep ``groups`` and ``work`` alive until ``timeout_s`` (the PG timeout) plus a margin from now."""
    entry = Kept(time.monotonic() + timeout_s + MARGIN_S, list(groups), work, owner)
    _kept.append(entry)
    return entry


def forget_expired() -> None:
    """Drop every kept generation whose deadline has passed (any owner's): their destructors are quick now."""
    global _kept
    if not _kept:
        return
    now = time.monotonic()
    _kept = [k for k in _kept if k.deadline > now]


def kept_by(owner: int) -> list[Kept]:
    """The generations ``owner`` abandoned that are still kept."""
    return [k for k in _kept if k.owner == owner]
