"""A TCPStore client driven from its own worker thread: the plumbing under the control channel.

The control channel (accelpact.control) must stop waiting at its OWN deadline even when a store
call never returns (during a blackhole a store ``wait(timeout)`` is not honoured), so every store
call runs on a worker thread and a stalled connection is abandoned whole, client and thread. This
module holds that worker, the connection pair, and the few predicates that tell a broken
connection from a store that merely answered "not yet".
"""

from __future__ import annotations

import datetime
import queue
import socket
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from accelpact import shutdown

if TYPE_CHECKING:
    import torch.distributed

# Private to accelpact.control: no public names.
__all__: list[str] = []


class _Worker:
    """One daemon thread that runs store calls, so that the caller can stop waiting at its deadline.

    Daemon, and not a ThreadPoolExecutor, because a worker stuck in a call to a stalled server must
    never keep the interpreter from exiting.
    """

    def __init__(self, name: str):
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()
        shutdown.register(self)  # a call returning while the interpreter finalizes would abort it

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            fn, fut = item
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn())
            except BaseException as exc:  # handed to the caller, which decides
                fut.set_exception(exc)

    def submit(self, fn: Callable[[], Any]) -> Future[Any]:
        fut: Future[Any] = Future()
        self._queue.put((fn, fut))
        return fut

    def stop(self) -> None:
        self._queue.put(None)

    def stop_for_exit(self, deadline: float) -> threading.Thread | None:
        """Stop (an idle worker exits at once; a busy one after its call) and wait until ``deadline``."""
        self._queue.put(None)
        return shutdown.join_until(self._thread, deadline)


class _Connection:
    """One TCPStore client and the worker thread that runs its calls; replaced whole, never repaired."""

    def __init__(self, name: str):
        self.worker = _Worker(name)
        self.store: torch.distributed.TCPStore | None = None


def _dist() -> Any:
    """The torch.distributed module."""
    import torch.distributed as dist  # lazily: importing torch costs seconds

    return dist


def _is_wait_timeout(exc: BaseException) -> bool:
    """The store answered 'not yet' (a wait ran out), as opposed to a broken connection."""
    dist = _dist()
    return isinstance(exc, dist.DistStoreError) and "timeout" in str(exc).lower()


def _is_connection_error(exc: BaseException) -> bool:
    dist = _dist()
    return isinstance(exc, dist.DistError) and not _is_wait_timeout(exc)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


class _StoreRefused(Exception):
    """Nothing listens at the store's address (or its host name does not resolve): no retry can help."""


def _probe(host: str, port: int, timeout_s: float, *, first: bool) -> None:
    """Raise _StoreRefused if host:port refuses a TCP connection (or, on the ``first`` connection, if
    host does not resolve: a typo; later, a resolver hiccup may pass).

    A TCPStore client retries a refused connection until its whole timeout (30 s by default) and then
    prints a C++ stack trace; a refusal is final (the server's keys died with it), so a plain socket
    looks first. Anything else (no answer, unreachable) is left to the caller's own deadline.
    """
    final: tuple[type[OSError], ...] = (ConnectionRefusedError, socket.gaierror) if first else (ConnectionRefusedError,)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return
    except final as exc:
        what = "refused the connection" if isinstance(exc, ConnectionRefusedError) else "does not resolve"
        raise _StoreRefused(f"{what} ({type(exc).__name__}: {exc.strerror or exc})") from None
    except OSError:
        return


def _new_client(
    host: str, port: int, timeout_s: float, *, probe: bool = False, first: bool = False
) -> torch.distributed.TCPStore:
    """A TCPStore client; with ``probe``, a refused address raises _StoreRefused at once (see _probe)."""
    dist = _dist()
    if probe:
        _probe(host, port, timeout_s, first=first)
    client: torch.distributed.TCPStore = dist.TCPStore(
        host, port, None, False, timeout=datetime.timedelta(seconds=timeout_s), wait_for_workers=False
    )
    return client
