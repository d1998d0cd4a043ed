"""Tracebacks of caught faults: where they came from (for the recovery log), and dropping their frames.

A caught gloo error's traceback frames hold the old process group, and with it its sockets and
threads: the guard clears them before it rebuilds, or no generation would ever be freed.
"""

from __future__ import annotations

import traceback

__all__ = ["where", "drop_traceback"]


def where(exc: BaseException) -> str:
    """``file:line in function`` of the innermost frames of ``exc`` (for the recovery log)."""
    frames = traceback.extract_tb(exc.__traceback__)[-3:]
    return " <- ".join(f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno} {f.name}" for f in reversed(frames))


def drop_traceback(exc: BaseException) -> None:
    """Clear the frames of a caught fault: they hold the old group (and its sockets) alive."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if cur.__traceback__ is not None:
            traceback.clear_frames(cur.__traceback__)
            cur.__traceback__ = None
        cur = cur.__cause__ or cur.__context__
