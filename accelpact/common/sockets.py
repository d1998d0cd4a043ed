"""This process's TCP sockets: find them and reset them, never touching listeners or store ports.

Production code: the gloo backend resets its own data-plane connections with these helpers when a
fault is detected (so peers blocked on them fail in milliseconds instead of at the PG timeout), and
accelpact.testing's fault injector uses the same helpers to inject a real connection reset.

Linux only (``/proc/self/fd``). Sockets are classified by asking each one through a dup'ed
descriptor (a few syscalls), never by parsing ``/proc/net/tcp``: the kernel builds that file by
walking its whole TCP hash table, which took 30 ms per read under load and sat three times on the
recovery path.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Collection, Iterable, Iterator

__all__ = ["tcp_socket_inodes", "shutdown_sockets", "reset_own_gloo_sockets"]

_INET = (socket.AF_INET, socket.AF_INET6)


def _socket_inode_to_fd() -> dict[int, int]:
    out: dict[int, int] = {}
    fd_dir = "/proc/self/fd"
    for name in os.listdir(fd_dir):
        try:
            target = os.readlink(f"{fd_dir}/{name}")
        except OSError:  # closed while we looked
            continue
        if target.startswith("socket:["):
            out[int(target[8:-1])] = int(name)
    return out


def _port(addr: object) -> int:
    return addr[1] if isinstance(addr, tuple) and len(addr) >= 2 else 0


def _tcp_ports(fd: int) -> tuple[int, int] | None:
    """(local_port, remote_port) of a non-listening TCP socket fd, None for anything else.

    A socket that is not connected (never, or reset) reports remote port 0.
    """
    try:
        dup = os.dup(fd)
    except OSError:  # closed while we looked
        return None
    try:
        s = socket.socket(fileno=dup)
    except OSError:
        os.close(dup)
        return None
    try:
        if s.family not in _INET or s.type != socket.SOCK_STREAM:
            return None
        if s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            # Never touch a listener: shutting down gloo's listening socket makes its accept() loop
            # throw gloo::EnforceNotMet and std::terminate the whole process.
            return None
        local = _port(s.getsockname())
        try:
            remote = _port(s.getpeername())
        except OSError:  # not connected
            remote = 0
        return local, remote
    except OSError:
        return None
    finally:
        s.close()


def tcp_socket_inodes(exclude_ports: Collection[int] = ()) -> dict[int, int]:
    """This process's TCP sockets except listeners and excluded ports, as inode -> fd."""
    excluded = set(exclude_ports)
    out: dict[int, int] = {}
    for inode, fd in _socket_inode_to_fd().items():
        ports = _tcp_ports(fd)
        if ports is None:
            continue  # a unix / udp socket, a listener, or closed meanwhile
        local, remote = ports
        if local in excluded or remote in excluded:
            continue
        out[inode] = fd
    return out


def shutdown_sockets(inodes: Iterable[int]) -> int:
    """shutdown(SHUT_RDWR) the sockets with these inodes if this process still has them open.

    shutdown acts on the connection, not on the descriptor, so a dup'ed descriptor is enough and
    the owner (gloo) keeps its fd: its next read or write fails and it reports a clean error.
    Returns how many sockets were shut down.
    """
    n = 0
    for s in open_sockets(inodes):
        try:
            s.shutdown(socket.SHUT_RDWR)
            n += 1
        except OSError:
            pass  # not connected (a listener) or already gone
    return n


def open_sockets(inodes: Iterable[int]) -> Iterator[socket.socket]:
    """Each socket of this process with one of these inodes that is still open, as a socket object
    on a dup'ed descriptor (closed after the caller's loop body; the owner keeps its own fd)."""
    wanted = set(inodes)
    for inode, fd in _socket_inode_to_fd().items():
        if inode not in wanted:
            continue
        try:
            dup = os.dup(fd)
        except OSError:  # closed while we looked
            continue
        s = socket.socket(fileno=dup)
        try:
            yield s
        finally:
            s.close()


def reset_own_gloo_sockets(exclude_ports: Collection[int]) -> int:
    """Reset every TCP connection of this process except those on ``exclude_ports`` (the stores).

    Returns how many sockets were shut down. Pass the control store's port and the port of any
    TCPStore the process groups were initialised from, or the stores break too.
    """
    return shutdown_sockets(tcp_socket_inodes(exclude_ports))
