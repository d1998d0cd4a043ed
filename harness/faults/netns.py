"""Real link faults through network namespaces: blackhole, link down and TCP reset on a rank's data plane.

``NetnsTopology`` builds, for one job, a bridge namespace plus one namespace per rank (or, with ``hosts=N``,
per host of ``world_size / N`` ranks). Each gets two veth links into the bridge namespace: ``eth0``, the
data plane (gloo is pinned to it; faults hit only it), and ``ctl0``, the control channel, whose store
runs in the bridge namespace so it keeps answering while the data plane is down (a ``plane="control"``
fault acts on ``ctl0`` instead). A blackhole is a ``tbf`` qdisc and a TCP reset is ``ss -K``, since this
kernel has no netem and no iptables; ``outage_s`` must outlast the PG timeout by about 2 s to break a
collective (docs/design.md, "Faults as each rank sees them").

Safety: every address lives in 10.0.0.0/8 inside namespaces this job created, with no route out and the
root namespace untouched. Teardown always happens (context exit, atexit, SIGINT/SIGTERM) and checks that
nothing with the job's prefix is left; ``cleanup_stale(prefix)`` does the same for a SIGKILLed job (CLI:
``python -m harness.faults.netns list | leftovers PREFIX | cleanup PREFIX``).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from harness.faults.addressing import (
    CTL_BRIDGE,
    CTL_IF,
    DATA_BRIDGE,
    DATA_IF,
    Layout,
    new_prefix,
)
from harness.faults.netns_host import (
    TAG_ENV,
    NetnsError,
    _ip_batch,
    _run,
    cleanup_stale,
    leftovers,
    list_prefixes,
    main,
    namespaces_available,
)
from harness.faults.snapshot_roots import ROOT_ENV, host_root, snapshot_base
from harness.faults.store_server import start_in_namespace

__all__ = [
    "TAG_ENV",
    "LinkCut",
    "LinkFault",
    "NetnsError",
    "NetnsTopology",
    "cleanup_stale",
    "leftovers",
    "list_prefixes",
    "namespaces_available",
]

PLANES = ("data", "control")  # which of a host's links a fault acts on
_TBF_BLACKHOLE = ("tbf", "rate", "8bit", "burst", "1", "limit", "1")


class LinkCut(str, Enum):
    """How a link is cut: the primitives. Which fault kind uses which is the fault registry's business
    (``harness.faults.kinds``); this module never dispatches on a fault kind."""

    BLACKHOLE = "blackhole"  # tbf on both ends: every packet dropped, the link stays up
    DOWN = "link_down"  # ip link set down on the host's side


def _blackhole(lay: Layout, rank: int, inner: str, peer: str, on: bool) -> None:
    op, qdisc = ("add", _TBF_BLACKHOLE) if on else ("del", ())
    # Both ends: the host's link drops what it sends, the bridge-side peer what it receives.
    _run(["tc", "-n", lay.rank_ns(rank), "qdisc", op, "dev", inner, "root", *qdisc])
    _run(["tc", "-n", lay.bridge_ns, "qdisc", op, "dev", peer, "root", *qdisc])


def _link_down(lay: Layout, rank: int, inner: str, peer: str, on: bool) -> None:
    _run(["ip", "-n", lay.rank_ns(rank), "link", "set", inner, "down" if on else "up"])


_CUTS: dict[LinkCut, Callable[[Layout, int, str, str, bool], None]] = {
    LinkCut.BLACKHOLE: _blackhole,
    LinkCut.DOWN: _link_down,
}


@dataclass(frozen=True)
class LinkFault:
    """One injected link fault, with wall-clock (``time.time()``) start and heal times."""

    kind: str
    ranks: tuple[int, ...]
    t_start: float
    t_end: float
    sockets_reset: int = 0  # tcp_reset only: how many sockets ss -K destroyed
    plane: str = "data"


_LIVE: set[NetnsTopology] = set()
_LIVE_LOCK = threading.Lock()
_PREVIOUS_HANDLERS: dict[int, object] = {}


def _teardown_all() -> None:
    with _LIVE_LOCK:
        live = list(_LIVE)
    for topo in live:
        topo.teardown()


def _on_signal(signum: int, frame: object) -> None:
    _teardown_all()
    previous = _PREVIOUS_HANDLERS.pop(signum, signal.SIG_DFL)
    signal.signal(signum, previous)  # type: ignore[arg-type]
    if callable(previous):
        previous(signum, frame)  # e.g. default_int_handler raises KeyboardInterrupt
    elif previous == signal.SIG_DFL:
        os.kill(os.getpid(), signum)  # die of the signal as the process would have


def _install_handlers() -> None:
    if threading.current_thread() is not threading.main_thread():
        return  # only the main thread may set handlers; atexit and __exit__ still cover this owner
    for signum in (signal.SIGINT, signal.SIGTERM):
        current = signal.getsignal(signum)
        if current is not _on_signal and current != signal.SIG_IGN:
            _PREVIOUS_HANDLERS[signum] = current
            signal.signal(signum, _on_signal)


atexit.register(_teardown_all)


# --------------------------------------------------------------------------------------------------
# The topology


class NetnsTopology:
    """A job's namespaces, links, control store server and link faults. Use as a context manager.

    >>> with NetnsTopology(world_size=2) as topo:                      # doctest: +SKIP
    ...     procs = [subprocess.Popen(topo.wrap_command(r, argv), env={**os.environ, **topo.rank_env(r)})
    ...              for r in range(2)]
    ...     topo.blackhole([1], outage_s=timeout + 3)
    """

    def __init__(
        self,
        world_size: int,
        prefix: str | None = None,
        hosts: int | None = None,
        store_server: bool = True,
        python: str = sys.executable,
        server_start_timeout_s: float = 60.0,
    ) -> None:
        self.layout = Layout(prefix or new_prefix(), world_size, hosts)
        self.prefix = self.layout.prefix
        self.world_size = world_size
        self.faults: list[LinkFault] = []
        self._want_server = store_server
        self._python = python
        self._server_timeout_s = server_start_timeout_s
        self._server: subprocess.Popen[str] | None = None
        self._control_addr: tuple[str, int] | None = None
        self._stdin_lock = threading.Lock()
        self._closed = threading.Event()
        self._up = False
        self._snapshot_base = snapshot_base()

    # -- lifecycle
    def __enter__(self) -> NetnsTopology:
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.teardown()

    def up(self) -> None:
        """Build the namespaces and links, then start the control store server."""
        ok, why = namespaces_available()
        if not ok:
            raise NetnsError(why)
        if self._up:
            return
        with _LIVE_LOCK:
            _LIVE.add(self)
        _install_handlers()
        self._up = True
        try:
            self._build()
            if self._want_server:
                self._start_server()
        except BaseException:
            self.teardown()
            raise

    def _build(self) -> None:
        lay = self.layout
        for name in lay.namespaces:
            _run(["ip", "netns", "add", name])
        br = lay.bridge_ns
        lines = ["link set lo up"]
        for bridge, addr in ((DATA_BRIDGE, lay.bridge_data_addr), (CTL_BRIDGE, lay.bridge_ctl_addr)):
            lines += [
                f"link add name {bridge} type bridge",
                f"addr add {addr}/24 dev {bridge}",
                f"link set {bridge} up",
            ]
        heads = [lay.ranks_of_host(h)[0] for h in range(lay.n_hosts)]  # one rank names each host's links
        for r in heads:
            ns = lay.rank_ns(r)
            # Both veth ends are created straight into namespaces: the root namespace never holds one.
            for peer, inner in ((lay.data_peer(r), DATA_IF), (lay.ctl_peer(r), CTL_IF)):
                bridge = DATA_BRIDGE if inner == DATA_IF else CTL_BRIDGE
                lines += [
                    f"link add name {peer} type veth peer name {inner} netns {ns}",
                    f"link set {peer} master {bridge}",
                    f"link set {peer} up",
                ]
        _ip_batch(br, lines)
        for r in heads:
            _ip_batch(
                lay.rank_ns(r),
                [
                    "link set lo up",
                    f"addr add {lay.data_addr(r)}/24 dev {DATA_IF}",
                    f"addr add {lay.ctl_addr(r)}/24 dev {CTL_IF}",
                    f"link set {DATA_IF} up",
                    f"link set {CTL_IF} up",
                ],
            )

    def _start_server(self) -> None:
        self._server, self._control_addr = start_in_namespace(
            self.layout.bridge_ns, self.layout.bridge_ctl_addr, self.prefix, self._python, self._server_timeout_s
        )

    def teardown(self) -> list[str]:
        """Stop faults and the store server, kill every process in the namespaces, delete them.

        Idempotent and safe from signal handlers and atexit. Returns what is left with the prefix
        (empty on success) and warns on stderr if anything is."""
        if self._closed.is_set():
            return []
        self._closed.set()  # wakes fault threads early; they skip their heal once the namespaces are gone
        with _LIVE_LOCK:
            _LIVE.discard(self)
        if not self._up:
            return []
        if self._server is not None:
            with contextlib.suppress(OSError):
                if self._server.stdin:
                    self._server.stdin.close()  # EOF: the server exits on its own
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._server.wait(timeout=2)
        cleanup_stale(self.prefix)
        left = leftovers(self.prefix)
        if left:
            print(
                f"[netns] teardown of {self.prefix} left: {left}; "
                f"run `python -m harness.faults.netns cleanup {self.prefix}`",
                file=sys.stderr,
            )
        return left

    # -- what the launcher needs
    def store_set(self, key: str, value: bytes) -> None:
        """Set ``key`` on the control store from the root namespace (a line on the server's stdin)."""
        if self._server is None or self._server.stdin is None:
            raise NetnsError("no control store server: build the topology with store_server=True and enter it")
        with self._stdin_lock:
            self._server.stdin.write(f"SET {key} {value.hex()}\n")
            self._server.stdin.flush()

    @property
    def control_addr(self) -> tuple[str, int]:
        """(host, port) of the control store server, reachable from every rank over ``ctl0``."""
        if self._control_addr is None:
            raise NetnsError("no control store server: build the topology with store_server=True and enter it")
        return self._control_addr

    def wrap_command(self, rank: int, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside rank ``rank``'s namespace."""
        return ["ip", "netns", "exec", self.layout.rank_ns(rank), *argv]

    def rank_env(self, rank: int) -> dict[str, str]:
        """Environment for rank ``rank`` (merge into the launcher's): gloo pinned to the data plane,
        MASTER_ADDR on rank 0's data address, the control store address on the control link, LOCAL_RANK
        the rank's index on its host."""
        env = {
            "LOCAL_RANK": str(self.layout.local_rank(rank)),
            "GLOO_SOCKET_IFNAME": DATA_IF,
            "MASTER_ADDR": self.layout.data_addr(0),
            "ACCELPACT_DATA_ADDR": self.layout.data_addr(rank),
            # The replica server binds here: the control link, never the data plane the faults hit.
            "ACCELPACT_REPLICA_ADDR": self.layout.ctl_addr(rank),
            # The buddy of a rank is the same local rank on the next host (accelpact.snapshot.replica).
            "LOCAL_WORLD_SIZE": str(self.layout.ranks_per_host),
            # Each host its own shared-memory directory: host_loss deletes exactly this one.
            ROOT_ENV: str(self.snapshot_root(self.layout.host_of(rank))),
            TAG_ENV: self.prefix,
        }
        if self._control_addr is not None:
            env["ACCELPACT_CONTROL_ADDR"] = f"{self._control_addr[0]}:{self._control_addr[1]}"
        return env

    def snapshot_root(self, host: int) -> Path:
        """The snapshot root (its "shared-memory directory") of ``host`` (harness.faults.snapshot_roots)."""
        return host_root(self.layout.host_ns(host), self._snapshot_base)

    # -- faults
    @contextlib.contextmanager
    def outage(self, cut: LinkCut | str, ranks: Sequence[int], plane: str = "data") -> Iterator[None]:
        """Cut the ``plane`` link of ``ranks``' hosts (``cut``: how) on entry, heal it on exit; record a
        LinkFault. With several ranks per host the whole host is cut.

        For fault kinds and tests that hold a fault until something happens rather than for a fixed time."""
        cut = LinkCut(cut)
        ranks = self._check_ranks(ranks)
        targets = self._host_heads(ranks, plane)
        t_start = time.time()
        try:
            for r in targets:
                self._cut(cut, r, on=True, plane=plane)
            yield
        finally:
            if not self._closed.is_set():
                for r in targets:
                    self._cut(cut, r, on=False, plane=plane)
            self.faults.append(LinkFault(cut.value, ranks, t_start, time.time(), plane=plane))

    def _host_heads(self, ranks: Sequence[int], plane: str) -> list[int]:
        """One rank per distinct host (a host's link is cut once however many of its ranks are named)."""
        if plane not in PLANES:
            raise ValueError(f"plane must be one of {PLANES}, got {plane!r}")
        hosts = sorted({self.layout.host_of(r) for r in ranks})
        return [self.layout.ranks_of_host(h)[0] for h in hosts]

    def _cut(self, cut: LinkCut, rank: int, on: bool, plane: str = "data") -> None:
        lay = self.layout
        inner, peer = (DATA_IF, lay.data_peer(rank)) if plane == "data" else (CTL_IF, lay.ctl_peer(rank))
        _CUTS[cut](lay, rank, inner, peer, on)

    def blackhole(self, ranks: Sequence[int], outage_s: float) -> LinkFault:
        """Drop every data-plane packet of ``ranks`` for ``outage_s`` s, then heal. Blocks; returns the record."""
        return self.hold(LinkCut.BLACKHOLE, ranks, outage_s)

    def link_down(self, ranks: Sequence[int], outage_s: float) -> LinkFault:
        """``ip link set eth0 down`` on ``ranks`` for ``outage_s`` s, then up again. Blocks."""
        return self.hold(LinkCut.DOWN, ranks, outage_s)

    def tcp_reset(self, ranks: Sequence[int], plane: str = "data") -> LinkFault:
        """Destroy every TCP socket of ``ranks``' hosts on ``plane`` (``ss -K``; the kernel sends the peer a
        reset). The other plane's sockets are on another subnet and are left alone."""
        ranks = self._check_ranks(ranks)
        subnet = self.layout.data_subnet if plane == "data" else self.layout.ctl_subnet
        t_start = time.time()
        killed = 0
        for r in self._host_heads(ranks, plane):
            out = _run(
                ["ip", "netns", "exec", self.layout.rank_ns(r), "ss", "-K", "-t", "-n", "dst", subnet],
                check=False,
            ).stdout
            killed += sum(1 for line in out.splitlines()[1:] if line.strip())
        record = LinkFault("tcp_reset", ranks, t_start, time.time(), sockets_reset=killed, plane=plane)
        self.faults.append(record)
        return record

    def start(self, fault: Callable[..., LinkFault], *args: Any, **kwargs: Any) -> Future[LinkFault]:
        """Run a blocking fault of this topology (``topo.blackhole``, ...) on a background thread; the future
        holds its record once healed."""
        future: Future[LinkFault] = Future()

        def body() -> None:
            try:
                future.set_result(fault(*args, **kwargs))
            except BaseException as e:  # surfaced through the future
                future.set_exception(e)

        name = getattr(fault, "__name__", "fault")
        threading.Thread(target=body, daemon=True, name=f"{self.prefix}-{name}").start()
        return future

    def hold(self, cut: LinkCut | str, ranks: Sequence[int], outage_s: float, plane: str = "data") -> LinkFault:
        """Cut the link for ``outage_s`` seconds (less if the topology is torn down first), then heal. Blocks."""
        cut = LinkCut(cut)
        if outage_s <= 0:
            raise ValueError(
                f"{cut.value} needs outage_s > 0 (longer than the PG timeout + ~2 s to break a collective)"
            )
        with self.outage(cut, ranks, plane=plane):
            self._closed.wait(outage_s)  # returns early if the topology is torn down
        return self.faults[-1]

    def _check_ranks(self, ranks: Sequence[int]) -> tuple[int, ...]:
        ranks = tuple(int(r) for r in ranks)
        if not ranks:
            raise ValueError("a link fault needs at least one rank")
        for r in ranks:
            self.layout.rank_ns(r)  # raises on a rank outside the topology
        if self._closed.is_set() or not self._up:
            raise NetnsError("the topology is not up: enter it (with NetnsTopology(...) as topo) first")
        return ranks


if __name__ == "__main__":
    sys.exit(main())
