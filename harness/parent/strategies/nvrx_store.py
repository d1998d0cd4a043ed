"""Where NVRx's TCPStore lives: in a process that outlives the ranks, at an address every rank reaches.

The harness parent hosts it, not NVRx's rank 0 (whose death would otherwise take every rank's restart
with it); NVRx's rank 0 then connects as a client. ``StoreHome.renew()`` hosts a fresh store per
incarnation, since NVRx keys the store by its own iteration number, which restarts at 0. Two homes
(``harness.server_home`` decides, as for every strategy server):

- ``ParentStores``: ranks in the parent's network namespace; a TCPStore in the parent itself.
- ``NamespaceStores``: ranks in network namespaces; one server process in the bridge namespace
  (``python -m harness.parent.strategies.nvrx_store --host ADDR``) hosts a fresh TCPStore on
  each ``NEW`` line of its stdin and answers ``PORT <port>``, so a relaunch pays no server start-up. It
  exits at stdin EOF. docs/harness.md, "The NVRx baseline", says why.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import queue
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Protocol

from harness.server_home import ServerHome, server_home
from harness.strategies.checkpoint_restore.nvrx_types import STORE_HOST_ENV, STORE_PORT_ENV

__all__ = ["host_store", "StoreHome", "ParentStores", "NamespaceStores", "store_home", "NvrxStore"]

READY_TIMEOUT_S = 120.0  # the server's first store waits for its Python and torch import (loaded host: 10-30 s)
NEW_TIMEOUT_S = 30.0  # a later store: one TCPStore bind in a live process


def host_store(port: int = 0, host: str = "127.0.0.1") -> Any:
    """Host NVRx's store in a process that outlives the ranks (the harness parent); pass its ``.port``
    to the ranks as NVRX_STORE_PORT.

    By default NVRx's rank 0 hosts the store, so a rank-0 death takes it, and with it every rank's
    restart, down. NVRx 0.4.1's rank 0 falls back to connecting as a client when the port is taken,
    which is what this relies on."""
    import torch.distributed as dist  # torch: only where a store is hosted (the parent reads this module early)

    return dist.TCPStore(host, port, is_master=True, wait_for_workers=False)


class StoreHome(Protocol):
    def renew(self) -> tuple[str, int]:
        """Host a fresh store for the next incarnation (the previous one stops); its (host, port)."""

    def close(self) -> None:
        """Stop the current store (and its server process, if any)."""


class ParentStores:
    """NVRx's store as a TCPStore in the parent process, on ``host`` (ranks in the parent's namespace)."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.store: Any = None

    def renew(self) -> tuple[str, int]:
        self.store = host_store(host=self.host)  # the previous one's server stops with its last reference
        return self.host, int(self.store.port)

    def close(self) -> None:
        self.store = None


class NamespaceStores:
    """NVRx's store in a server process inside ``netns``, listening on ``host`` (ranks in namespaces)."""

    def __init__(self, netns: str, host: str, python: str = sys.executable) -> None:
        self.netns, self.host, self.python = netns, host, python
        self.proc: subprocess.Popen[str] | None = None  # started by the first renew(), before incarnation 0
        self._lines: queue.Queue[str] = queue.Queue()
        # A file, not a pipe: nobody reads the server's stderr while it serves, and a full pipe would block it.
        self._err = tempfile.TemporaryFile(mode="w+")

    def _start(self) -> subprocess.Popen[str]:
        root = str(Path(__file__).resolve().parents[3])
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p),
            "TORCH_CPP_LOG_LEVEL": "ERROR",
        }
        argv = ServerHome(self.host, self.netns).command([self.python, "-m", __name__, "--host", self.host])
        proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err, text=True, env=env
        )
        threading.Thread(target=self._read, args=(proc,), daemon=True, name="nvrx-store-out").start()
        return proc

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self._lines.put(line.strip())
        self._lines.put("")  # EOF: the server is gone

    def renew(self) -> tuple[str, int]:
        # The first store waits for the server's start; the parent set-up runs before incarnation 0, so
        # a relaunch finds the server ready and pays one TCPStore bind.
        timeout = NEW_TIMEOUT_S if self.proc is not None else READY_TIMEOUT_S
        if self.proc is None:
            self.proc = self._start()
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write("NEW\n")
            self.proc.stdin.flush()
        except OSError as exc:
            raise RuntimeError(self._dead(f"writing to it failed: {exc}")) from exc
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise RuntimeError(self._dead(f"no new store within {timeout:.0f} s")) from None
        if not line.startswith("PORT "):
            raise RuntimeError(self._dead(f"it answered {line!r}"))
        return self.host, int(line.split()[1])

    def _dead(self, what: str) -> str:
        assert self.proc is not None
        err = ""
        if self.proc.poll() is not None:
            self._err.seek(0)
            err = self._err.read()[-2000:].strip()
        return (
            f"NVRx's store server in namespace {self.netns} ({self.host}) failed: {what}"
            f"{'; exit ' + str(self.proc.returncode) if self.proc.returncode is not None else ''}"
            f"{': ' + err if err else ''}"
        )

    def close(self) -> None:
        self._err.close()
        if self.proc is None:
            return
        with contextlib.suppress(OSError, ValueError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()  # EOF: the server drops its store and exits
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def store_home(run: Any, launcher: Any) -> StoreHome:
    """Where this run's NVRx stores live (``harness.server_home``): a server process in the
    launcher's namespace for servers when its ranks run in network namespaces, else the parent itself."""
    home = server_home(run, launcher)
    if home.netns:
        return NamespaceStores(home.netns, home.host)
    return ParentStores(home.host)


class NvrxStore:
    """NVRx's store, hosted outside the ranks (``nvrx_store``), its address to every rank. A relaunched world
    gets a new one.

    NVRx keys its store by its own iteration number only (barriers, terminated ranks, completion), and a
    relaunched world starts again at iteration 0: on the killed world's store it would read that world's
    keys. So each incarnation's ranks get a fresh store, hosted before they start: in the parent for ranks
    in its namespace, in the topology's bridge namespace on the control network for ranks in namespaces."""

    def __init__(self, run: Any, launcher: Any) -> None:
        self.launcher = launcher
        self.home = store_home(run, launcher)
        self.addr: tuple[str, int] | None = None
        launcher.before_start.append(self.renew)  # hosted as each incarnation's ranks start

    def renew(self, incarnation: int) -> None:
        self.addr = host, port = self.home.renew()
        self.launcher.extra_env.update(
            {STORE_HOST_ENV: host, STORE_PORT_ENV: str(port), "TORCH_CPP_LOG_LEVEL": "ERROR"}
        )

    def row_columns(self) -> dict[str, Any]:
        """Where the last world's NVRx store was (the row says which network the ranks reached it on)."""
        return {"nvrx_store": f"{self.addr[0]}:{self.addr[1]}" if self.addr else None}

    def close(self) -> None:
        self.home.close()


def main(argv: list[str] | None = None) -> int:
    """The server: a fresh TCPStore on ``--host`` per ``NEW`` line of stdin (``PORT <port>`` on stdout)."""
    parser = argparse.ArgumentParser(description="NVRx's store server (one fresh TCPStore per NEW line of stdin)")
    parser.add_argument("--host", required=True)
    args = parser.parse_args(argv)
    import torch.distributed as dist  # late: --help must not pay for torch

    store: Any = None
    for line in sys.stdin:  # blocks; the loop ends at EOF (the parent closed the pipe or died)
        if line.strip() != "NEW":
            print(f"nvrx_store: ignored {line.strip()!r}", file=sys.stderr, flush=True)
            continue
        store = None  # the previous world's server stops with its last reference
        store = dist.TCPStore(
            args.host, 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=60)
        )
        print(f"PORT {store.port}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
