"""The control store in a child process of the parent, for ``fault=control_store_loss``.

Normally the parent hosts the ranks' control store in itself, and nothing can take it away without
taking the parent (and the results row) with it. To lose it for real, the parent hosts it in a child
(``harness.faults.store_server``), which the fault SIGKILLs; before the relaunch that falls back to
checkpoint restore, :meth:`ChildStore.ensure_running` starts a fresh one (a new port, as a restarted
store host would have: the relaunched ranks rendezvous under a new token anyway).
"""

from __future__ import annotations

import subprocess
import threading

from harness.faults.store_server import start_here

__all__ = ["ChildStore"]


class ChildStore:
    """A killable control store: ``addr`` to give the ranks, ``set`` for the parent's own writes."""

    def __init__(self, host: str) -> None:
        self.host = host
        self._lock = threading.Lock()
        self.proc: subprocess.Popen[str] | None = None
        self.addr: tuple[str, int] = (host, 0)
        self.kills = 0
        self.ensure_running()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def ensure_running(self) -> tuple[str, int]:
        """Start a store if none is running (first start, or after :meth:`kill`); its (host, port)."""
        with self._lock:
            if not self.alive:
                self.proc, self.addr = start_here(self.host, tag="control-store")
            return self.addr

    def set(self, key: str, value: bytes) -> None:
        """Set ``key`` (death notices): a line on the server's stdin. OSError once it is dead."""
        with self._lock:
            if self.proc is None or self.proc.stdin is None or not self.alive:
                raise OSError(f"the control store at {self.addr[0]}:{self.addr[1]} is gone")
            self.proc.stdin.write(f"SET {key} {value.hex()}\n")
            self.proc.stdin.flush()

    def kill(self) -> None:
        """SIGKILL the store's process: every rank's connection to it drops, its keys are gone."""
        with self._lock:
            if self.alive:
                assert self.proc is not None
                self.proc.kill()
                self.proc.wait()
                self.kills += 1

    def close(self) -> None:
        """Stop it (EOF on its stdin ends the server; SIGKILL if it does not within 5 s)."""
        with self._lock:
            proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()
