"""What ranks leave in the control store about each other: a heartbeat's value (:class:`Beat`) and the
judgement that a peer is lost (:class:`Verdict`).

In the bottom layer because both the control channel (which writes and reads beats) and the liveness
rules above it (accelpact.detection.liveness) use them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

__all__ = ["Beat", "Verdict"]


@dataclass(frozen=True)
class Beat:
    """One parsed heartbeat value."""

    t: float  # the writer's wall clock (informative only: staleness uses the reader's clock)
    pid: int
    progress: int

    @staticmethod
    def format(pid: int, progress: int) -> bytes:
        return f"{time.time():.6f} {pid} {progress}".encode()

    @classmethod
    def parse(cls, raw: bytes | str) -> Beat:
        text = raw.decode() if isinstance(raw, bytes) else raw
        parts = text.split()
        t = float(parts[0])
        pid = int(parts[1]) if len(parts) > 1 else -1
        progress = int(parts[2]) if len(parts) > 2 else -1
        return cls(t, pid, progress)


@dataclass(frozen=True)
class Verdict:
    """A peer judged lost, and how: ``detected_by`` is "notice" or "heartbeat"."""

    ranks: tuple[int, ...]
    detected_by: str
    reason: str
