"""Real fault injection for tests and for the harness: socket resets, stalls and dead ranks.

Usable with or without a guard. A plain training loop calls ``injector.begin_step(step)`` at the top
of every step and ``injector.maybe_fire(phase, step)`` before its clip all-reduce / vote; a guarded
loop gets both for free through ``guard.phase_hooks.append(injector.on_phase)``. The forward and
backward phases are caught by module hooks that run immediately before the intended collective.

Faults are real: a reset shuts down this process's own gloo TCP connections (every peer blocked on
them fails in milliseconds), a stall sleeps inside the step (a hang), an exit kills the process
without cleanup (a dead rank). The wall time of each injection is recorded so the guard can measure
detection time from the moment of the fault, not from the moment it noticed.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Iterable

__all__ = [
    "PHASES",
    "ACTIONS",
    "FaultSpec",
    "FaultInjector",
    "reset_own_gloo_sockets",
    "tcp_socket_inodes",
    "last_injection_time",
    "consume_injection_time",
]

# Phases a fault can be armed at, in the order they happen within one step.
PHASES: tuple[str, ...] = (
    "forward_allgather_first",
    "forward_allgather_middle",
    "backward_reduce_scatter",
    "clip_allreduce",
    "vote",
    "post_vote",  # the vote completed on this rank, optimizer.step not yet applied
    "recovery",  # only with a guard: after the new generation is built, before its first collective
)
# reset: shut down own gloo connections (the next collective fails on every rank);
# reset_raise: the same, and fail right here with a CommFault, as a collective that failed on this
#   rank after its data got through would (the only way to make the vote complete on some ranks only);
# stall: sleep stall_s seconds (a hang); exit: os._exit (a dead rank).
ACTIONS: tuple[str, ...] = ("reset", "reset_raise", "stall", "exit")

_last_injection: float | None = None


def last_injection_time() -> float | None:
    """time.time() of the newest injection in this process, or None."""
    return _last_injection


def consume_injection_time(not_before: float) -> float | None:
    """Return and forget the newest injection time if it happened at or after ``not_before``."""
    global _last_injection
    t, _last_injection = _last_injection, None
    return t if t is not None and t >= not_before else None


# --- socket discovery through /proc (Linux) -------------------------------------------------------


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


# Sockets are classified by asking each one (a few syscalls on a dup'ed fd), never by parsing
# /proc/net/tcp: the kernel builds that file by walking its whole TCP hash table, which took 30 ms
# per read under load here and sat three times on the recovery path.
_INET = (socket.AF_INET, socket.AF_INET6)


def _port(addr: object) -> int:
    return addr[1] if isinstance(addr, tuple) and len(addr) >= 2 else 0


def _tcp_ports(fd: int) -> tuple[int, int] | None:
    """(local_port, remote_port) of a non-listening TCP socket fd, None for anything else.

    Asks the socket itself through a dup'ed descriptor (a few syscalls) rather than parsing
    /proc/net/tcp. A socket that is not connected (never, or reset) reports remote port 0.
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
    """
    wanted = set(inodes)
    n = 0
    for inode, fd in _socket_inode_to_fd().items():
        if inode not in wanted:
            continue
        try:
            dup = os.dup(fd)
        except OSError:
            continue
        s = socket.socket(fileno=dup)
        try:
            s.shutdown(socket.SHUT_RDWR)
            n += 1
        except OSError:
            pass  # not connected (a listener) or already gone
        finally:
            s.close()
    return n


def reset_own_gloo_sockets(exclude_ports: Collection[int]) -> int:
    """Reset every TCP connection of this process except those on ``exclude_ports`` (the stores).

    Returns how many sockets were shut down. Pass the control store's port and the port of any
    TCPStore the process groups were initialised from, or the stores break too.
    """
    return shutdown_sockets(tcp_socket_inodes(exclude_ports))


# --- the injector ------------------------------------------------------------------------------------


@dataclass
class FaultSpec:
    """One armed, one-shot fault."""

    step: int
    phase: str
    action: str = "reset"
    stall_s: float = 0.0
    fired_at: float | None = None

    def __post_init__(self) -> None:
        if self.phase not in PHASES:
            raise ValueError(f"unknown fault phase {self.phase!r}; choose one of {PHASES}")
        if self.action not in ACTIONS:
            raise ValueError(f"unknown fault action {self.action!r}; choose one of {ACTIONS}")
        if self.action == "stall" and self.stall_s <= 0:
            raise ValueError("a 'stall' fault needs stall_s > 0 (seconds to hang)")


@dataclass
class FaultInjector:
    """Arms one-shot faults at (step, phase) and fires them from module hooks or explicit calls.

    ``exclude_ports`` are the store ports a reset must leave alone. ``on_fire`` (optional) is called
    with the spec just before the fault acts, e.g. to write a ``fault`` event.
    """

    exclude_ports: Collection[int] = ()
    on_fire: Callable[[FaultSpec], None] | None = None
    armed: list[FaultSpec] = field(default_factory=list)
    fired: list[FaultSpec] = field(default_factory=list)
    step: int = -1
    _handles: list[Any] = field(default_factory=list, repr=False)

    def arm(self, step: int, phase: str, action: str = "reset", *, stall_s: float = 0.0) -> FaultSpec:
        spec = FaultSpec(step, phase, action, stall_s)
        self.armed.append(spec)
        return spec

    def begin_step(self, step: int) -> None:
        """Tell the injector which step is running (the module hooks need it)."""
        self.step = step

    def on_phase(self, phase: str, step: int) -> None:
        """A guard phase hook: ``guard.phase_hooks.append(injector.on_phase)``."""
        if phase == "step_start":
            self.begin_step(step)
        else:
            self.maybe_fire(phase, step)

    def maybe_fire(self, phase: str, step: int | None = None) -> bool:
        """Fire the fault armed at (step, phase), if any; True when one fired."""
        step = self.step if step is None else step
        for spec in self.armed:
            if spec.step == step and spec.phase == phase:
                self.armed.remove(spec)
                self._fire(spec)
                return True
        return False

    def _fire(self, spec: FaultSpec) -> None:
        global _last_injection
        spec.fired_at = time.time()
        _last_injection = spec.fired_at
        self.fired.append(spec)
        if self.on_fire is not None:
            self.on_fire(spec)
        if spec.action in ("reset", "reset_raise"):
            reset_own_gloo_sockets(self.exclude_ports)
            if spec.action == "reset_raise":
                from accelpact.errors import CommFault

                raise CommFault(f"injected connection reset at step {spec.step}, phase {spec.phase}",
                                phase=spec.phase)
        elif spec.action == "stall":
            time.sleep(spec.stall_s)
        elif spec.action == "exit":
            os._exit(17)  # no cleanup, like a crash: peers see their connections drop

    # -- module hooks for the forward / backward phases --

    def install(self, first_module: Any, middle_module: Any) -> None:
        """Install hooks on the root FSDP module (``first_module``) and a middle decoder block.

        - forward_allgather_first: a forward pre-hook prepended before the root's FSDP pre-forward,
          so it runs right before the first all-gather of the step.
        - forward_allgather_middle: the same on the middle block, right before its all-gather.
        - backward_reduce_scatter: a gradient hook on the middle block's input *as FSDP passes it on*
          (after FSDP's pre-forward wrapped it), which fires after the block's backward compute and
          right before FSDP's post-backward reduce-scatter of that block.
        """
        self._handles.append(
            first_module.register_forward_pre_hook(self._make_pre("forward_allgather_first"), prepend=True)
        )
        self._handles.append(
            middle_module.register_forward_pre_hook(self._make_pre("forward_allgather_middle"), prepend=True)
        )
        self._handles.append(
            middle_module.register_forward_pre_hook(self._grad_hook_installer, with_kwargs=True)
        )

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _make_pre(self, phase: str) -> Callable[..., None]:
        def hook(module: Any, args: Any) -> None:
            self.maybe_fire(phase)

        return hook

    def _grad_hook_installer(self, module: Any, args: tuple, kwargs: dict) -> None:
        import torch

        if not torch.is_grad_enabled():
            return None
        if not any(s.step == self.step and s.phase == "backward_reduce_scatter" for s in self.armed):
            return None  # only pay for the hook on the step it can fire
        for t in list(args) + list(kwargs.values()):
            if isinstance(t, torch.Tensor) and t.requires_grad:
                t.register_hook(self._grad_hook)
                return None
        return None

    def _grad_hook(self, grad: Any) -> None:
        self.maybe_fire("backward_reduce_scatter")
        return None
