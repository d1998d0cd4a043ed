"""accelpact's background threads end before the interpreter does: no SIGABRT at the exit of a finished rank.

A daemon thread that returns from a torch call while CPython finalizes is ended with ``pthread_exit``,
which aborts the process (docs/process_loss.md, "How the script ends", has the mechanism). Every accelpact
thread that calls into torch therefore registers its owner here: the snapshot copy
(accelpact.snapshot.snapshotter), the heartbeat and the stall watchdog (accelpact.detection), and the
workers that run control-store calls (accelpact.control.store_client). One ``atexit`` hook, which CPython
runs before finalization starts, asks each owner to stop its thread and waits for it, within
:data:`EXIT_WAIT_S` in all; a thread still inside a call after that is named on stderr.

Standard library only.
"""

from __future__ import annotations

import atexit
import sys
import threading
import time
import weakref
from typing import Protocol

__all__ = ["Stoppable", "register", "stop_all", "join_until", "EXIT_WAIT_S"]

# The longest the exit waits for accelpact's threads, all together: a store call's own timeout is 5 s
# (the heartbeat's and the watchdog's clients), a snapshot copy a fraction of a second per GB.
EXIT_WAIT_S = 15.0


class Stoppable(Protocol):
    def stop_for_exit(self, deadline: float) -> threading.Thread | None:
        """Stop the thread (wait for it until ``deadline``, monotonic); the thread if it still runs, else None."""


_owners: weakref.WeakSet[Stoppable] = weakref.WeakSet()
_lock = threading.Lock()
_hooked = False


def register(owner: Stoppable) -> None:
    """Stop and wait for ``owner``'s thread before the interpreter finalizes (held weakly)."""
    global _hooked
    with _lock:
        _owners.add(owner)
        if not _hooked:
            atexit.register(stop_all)
            _hooked = True


def stop_all(wait_s: float = EXIT_WAIT_S) -> list[str]:
    """Stop every registered thread, waiting for each until ``wait_s`` from now in all; the names of the
    threads still running (said on stderr). The atexit hook; callable earlier."""
    deadline = time.monotonic() + wait_s
    with _lock:
        owners = list(_owners)
    left = []
    for owner in owners:
        try:
            thread = owner.stop_for_exit(deadline)
        except Exception as exc:  # noqa: BLE001 - one owner's failure must not keep the others running
            print(f"accelpact: stopping {type(owner).__name__} at exit failed: {exc}", file=sys.stderr, flush=True)
            continue
        if thread is not None and thread.is_alive():
            left.append(thread.name)
    if left:
        print(
            f"accelpact: thread(s) {left} still inside a call {wait_s:g} s after the interpreter began to exit; "
            "the process may abort (SIGABRT) when such a call returns",
            file=sys.stderr,
            flush=True,
        )
    return left


def join_until(thread: threading.Thread | None, deadline: float) -> threading.Thread | None:
    """Wait for ``thread`` until ``deadline`` (monotonic); it, if it still runs, else None."""
    if thread is None or thread is threading.current_thread() or not thread.is_alive():
        return None
    thread.join(max(0.0, deadline - time.monotonic()))
    return thread if thread.is_alive() else None
