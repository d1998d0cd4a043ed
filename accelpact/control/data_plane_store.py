"""The data-plane half of the control channel: a never-used store prefix per data-plane generation.

Each new process-group generation rendezvouses on ``PrefixStore("{token}/dp/gen{n}", <client>)``: a
prefix of the long-lived control store that no earlier generation used (a few ms), instead of a fresh
TCPStore (0.4-0.7 s measured in namespaces, with 5 s outliers). Each generation gets its OWN client
connection: gloo's rendezvous blocks on it without the channel's deadlines, and a client broken by the
fault that ended the previous generation must not break the next one. The next generation's client is
connected in the background ahead of time (``prepare_data_plane``).

``DataPlaneStores`` is a mixin of :class:`accelpact.control.ControlChannel`; it uses the channel's
config, lock, key() and deadline-bounded call plumbing.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Protocol

from accelpact.control.store_client import _Connection, _dist, _first_line, _is_connection_error, _new_client
from accelpact.errors import ControlChannelError

if TYPE_CHECKING:
    import threading
    from collections.abc import Callable

    import torch.distributed

    from accelpact.control.store_client import _Connection


class _StoreAddress(Protocol):
    """What the mixin reads of :class:`accelpact.control.ControlConfig` (a Protocol: channel imports this module)."""

    @property
    def host(self) -> str: ...

    @property
    def port(self) -> int: ...

    @property
    def connect_timeout_s(self) -> float: ...

    @property
    def deadline_s(self) -> float: ...


class _Channel(Protocol):
    """What the mixin uses of :class:`accelpact.control.ControlChannel`."""

    config: _StoreAddress
    rank: int
    connects: int
    _lock: threading.RLock
    _closed: bool
    _spare: tuple[Future[torch.distributed.TCPStore], int] | None
    _dp_generations: set[int]

    @property
    def _addr(self) -> str: ...

    def key(self, *parts: str) -> str: ...

    def _deadline(self, deadline_s: float | None) -> float: ...

    def _run(self, conn: _Connection, fn: Callable[[], Any], deadline: float, what: str) -> Any: ...

    def _start_spare(self) -> None: ...

    def _take_spare(self) -> torch.distributed.TCPStore | None: ...

    def _connect_data_plane_client(self, generation: int) -> torch.distributed.TCPStore: ...


class DataPlaneStores:
    """Hands out one never-used data-plane store per generation (see the module docstring).

    Its methods are typed on ``self: _Channel``: they use the channel's config, lock and plumbing."""

    _spare: tuple[Future[torch.distributed.TCPStore], int] | None
    _dp_generations: set[int]

    def data_plane_store(self: _Channel, generation: int) -> torch.distributed.Store:
        """A never-used ``PrefixStore("{token}/dp/gen{generation}", <fresh client>)`` for that generation's group.

        A fresh client per generation, not the channel's own: gloo's rendezvous blocks on it without
        our deadlines, and a client broken by the fault that ended the previous generation must not
        break the next one. Each generation can be handed out once per channel.
        """
        if generation < 0:
            raise ValueError(f"generation must be >= 0, got {generation}")
        with self._lock:
            if generation in self._dp_generations:
                raise ValueError(
                    f"the data-plane store of generation {generation} was already handed out; a gloo group "
                    f"must be built on a never-used prefix: call advance_generation() and use the new generation"
                )
            self._dp_generations.add(generation)
        client = self._take_spare()
        if client is None:
            client = self._connect_data_plane_client(generation)
        store: torch.distributed.Store = _dist().PrefixStore(self.key("dp", f"gen{generation}"), client)
        return store

    def prepare_data_plane(self: _Channel) -> None:
        """Connect the next generation's data-plane client now, in the background.

        A recovery then starts its rendezvous on an already-open connection instead of paying a
        thread start and a TCP connect on a loaded host. Optional: :meth:`data_plane_store` falls
        back to connecting on the spot. Call it when the process is otherwise idle-ish (the guard
        calls it at attach and after each recovery), never in the middle of a rendezvous.
        """
        with self._lock:
            if self._spare is None and not self._closed:
                self._start_spare()

    def _start_spare(self: _Channel) -> None:
        timeout_s = max(self.config.connect_timeout_s, self.config.deadline_s)
        conn = _Connection(f"accelpact-dataplane-spare-r{self.rank}")
        fut = conn.worker.submit(lambda: _new_client(self.config.host, self.config.port, timeout_s))
        conn.worker.stop()  # the worker exits once the connect returned: no idle thread is left
        self._spare = (fut, self.connects)

    def _take_spare(self: _Channel) -> torch.distributed.TCPStore | None:
        """The spare client if it connected and nothing suggests it is broken, else None."""
        with self._lock:
            spare, self._spare = self._spare, None
        if spare is None:
            return None
        fut, connects_then = spare
        if self.connects != connects_then:
            return None  # the control connection was replaced since: the same event may have hit the spare
        try:
            # Normally connected long ago; one that still hangs is abandoned, not waited for.
            return fut.result(timeout=min(1.0, self.config.connect_timeout_s))
        except Exception:  # noqa: BLE001 - any failure: connect afresh below, under the own deadline
            return None

    def _connect_data_plane_client(self: _Channel, generation: int) -> torch.distributed.TCPStore:
        timeout_s = max(self.config.connect_timeout_s, self.config.deadline_s)
        # Connected on a throwaway worker so that the own deadline holds and a failure here is not
        # mistaken for a broken control connection.
        conn = _Connection(f"accelpact-dataplane-r{self.rank}")
        try:
            client: torch.distributed.TCPStore = self._run(
                conn,
                lambda: _new_client(self.config.host, self.config.port, timeout_s),
                self._deadline(self.config.connect_timeout_s),
                "a data-plane connection",
            )
        except Exception as exc:
            if not _is_connection_error(exc):
                raise
            raise ControlChannelError(
                f"could not open a data-plane connection to control store {self._addr} for generation "
                f"{generation} ({_first_line(exc)}). Is the store host alive?"
            ) from exc
        finally:
            conn.worker.stop()
        return client
