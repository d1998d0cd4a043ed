"""Wait for the data-plane link to come back before rebuilding a generation on it.

Measured in network namespaces (docs/detection.md): during a link_down, the rank whose link is down
fails its rebuild at once (ENETUNREACH) and starts a new round, while its peer, the listening side of
gloo's connect, waits up to 5x the PG timeout (50 s for a 10 s timeout) before failing: a 13 s outage
cost 60 s. So, once the ranks agreed, each rank first waits, within the recovery deadline, until every
data-plane peer address answers at the TCP level again, and only then rebuilds.

A probe is a TCP connect to port 9 of the peer's address: a refusal (RST) or an accept both mean the
path works; ENETUNREACH / EHOSTUNREACH or no answer within ``probe_s`` means it does not. No listener
is needed on the peer, and nothing touches the data plane's own sockets.
"""

from __future__ import annotations

import errno
import socket
import time
from collections.abc import Collection, Iterable

__all__ = ["peer_addresses", "reachable", "wait_reachable"]

_PROBE_PORT = 9  # discard: normally closed, so a working path answers with a refusal at once
_UNREACHABLE = {errno.ENETUNREACH, errno.EHOSTUNREACH, errno.ENETDOWN, errno.EHOSTDOWN, errno.ETIMEDOUT}


def peer_addresses(inodes: Iterable[int]) -> set[str]:
    """The distinct remote IP addresses of this process's sockets with these inodes (loopback excluded)."""
    from accelpact.common.sockets import open_sockets

    out: set[str] = set()
    for s in open_sockets(inodes):
        try:
            host = s.getpeername()[0]
        except OSError:  # not connected (any more)
            continue
        if not (host.startswith("127.") or host == "::1"):
            out.add(host)
    return out


def reachable(host: str, probe_s: float = 0.3) -> bool:
    """True when a TCP connect to ``host`` gets any answer (accept or refusal) within ``probe_s``."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(probe_s)
        try:
            s.connect((host, _PROBE_PORT))
            return True
        except ConnectionRefusedError:
            return True
        except TimeoutError:
            return False
        except OSError as exc:
            return exc.errno not in _UNREACHABLE


def wait_reachable(hosts: Collection[str], deadline_s: float, pause_s: float = 0.1) -> float:
    """Block until every host is reachable or ``deadline_s`` passed; returns the seconds waited."""
    t0 = time.monotonic()
    pending = set(hosts)
    while pending:
        pending = {h for h in pending if not reachable(h)}
        if not pending or time.monotonic() - t0 >= deadline_s:
            break
        time.sleep(pause_s)
    return time.monotonic() - t0
