"""The data of the NVRx baseline: settings, per-restart timestamps, the context handed to the training
function, errors, and the guarded import of nvidia-resiliency-ext. ``harness.rank.strategies.nvrx_restart``
runs the wrapper itself. NVRx is imported lazily: this module is cheap to import.
"""

import datetime
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    import torch.distributed as dist

NVRX_VERSION = "0.4.1"
STORE_PORT_ENV = "NVRX_STORE_PORT"
STORE_HOST_ENV = "NVRX_STORE_HOST"  # where the parent hosted it; MASTER_ADDR when unset

T = TypeVar("T")


class NvrxUnavailable(ImportError):
    """nvidia-resiliency-ext cannot be imported; there is deliberately no substitute."""


class NvrxRestartsExhausted(RuntimeError):
    """NVRx gave up: the restart limit was reached, or a rank was lost and the world shrank."""

    def __init__(self, message: str, restarts: "list[RestartRecord]") -> None:
        super().__init__(message)
        self.restarts = restarts


def import_inprocess() -> Any:
    """``nvidia_resiliency_ext.inprocess``, or ``NvrxUnavailable`` naming the fix."""
    try:
        from nvidia_resiliency_ext import inprocess  # lazy: NVRx
    except Exception as exc:  # ImportError, or a broken install failing at import time
        raise NvrxUnavailable(
            f"strategy=checkpoint_restore needs nvidia-resiliency-ext=={NVRX_VERSION} "
            "(pip install -e '.[baselines]'); importing nvidia_resiliency_ext.inprocess failed: "
            f"{type(exc).__name__}: {exc}. There is no substitute: pick another strategy "
            "(strategy=cold_restart or strategy=accelpact) or install the baseline."
        ) from exc
    return inprocess


def _installed_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("nvidia-resiliency-ext")
    except Exception:
        return None


@dataclass(frozen=True)
class NvrxSettings:
    """How NVRx watches and restarts one rank. Defaults suit 2-16 CPU ranks on gloo.

    ``progress_timeout_s`` is NVRx's soft timeout: a rank whose main thread has not run Python for
    that long is interrupted (and hard-killed ``hard_timeout_margin_s`` later). It must exceed the
    process-group timeout and the longest single op (a step of a large model on CPU), or NVRx
    restarts healthy slow ranks.
    """

    store_port: int | None = None  # None: read NVRX_STORE_PORT
    store_host: str | None = None  # None: read NVRX_STORE_HOST, else MASTER_ADDR
    max_restarts: int = 20
    monitor_interval_s: float = 0.25  # monitor thread / monitor process polling; not detection latency
    last_call_wait_s: float = 0.1  # NVRx waits this long after the first report, for other ranks' reports
    heartbeat_interval_s: float = 1.0
    heartbeat_timeout_s: float = 60.0  # a rank silent this long is declared dead
    progress_timeout_s: float = 600.0
    hard_timeout_margin_s: float = 60.0
    store_timeout_s: float = 300.0  # NVRx store connect/rendezvous
    abort_resets_sockets: bool = True  # see module docstring: gloo has no communicator abort
    monitor_log_file: str | None = None  # absolute path, may contain "{rank}"
    monitor_exit_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if self.max_restarts < 0:
            raise ValueError(f"strategy.max_restarts={self.max_restarts}: must be >= 0")
        if self.progress_timeout_s <= max(self.monitor_interval_s, 1.0):
            raise ValueError(
                f"progress_timeout_s={self.progress_timeout_s} must be well above the monitor interval; "
                "make it larger than the process-group timeout"
            )
        if self.heartbeat_interval_s >= self.heartbeat_timeout_s:
            raise ValueError("heartbeat_interval_s must be below heartbeat_timeout_s")
        if self.monitor_log_file is not None and not os.path.isabs(self.monitor_log_file):
            raise ValueError(f"monitor_log_file={self.monitor_log_file!r} must be an absolute path")

    def resolved_port(self) -> int:
        if self.store_port is not None:
            return self.store_port
        raw = os.environ.get(STORE_PORT_ENV)
        if not raw:
            raise ValueError(
                f"NVRx needs its own TCPStore port: set {STORE_PORT_ENV} (the same free port on every rank, "
                "not MASTER_PORT nor any other store's port) or pass NvrxSettings(store_port=...)"
            )
        return int(raw)

    def resolved_host(self) -> str:
        # NVRX_STORE_HOST first: in network namespaces MASTER_ADDR is rank 0's data address, which is not
        # where the parent hosts NVRx's store (harness.parent.strategies.nvrx_store).
        host = self.store_host or os.environ.get(STORE_HOST_ENV) or os.environ.get("MASTER_ADDR")
        if not host:
            raise ValueError(
                f"NVRx's store host is unknown: set {STORE_HOST_ENV} (or MASTER_ADDR) or pass "
                "NvrxSettings(store_host=...)"
            )
        return host


@dataclass
class RestartRecord:
    """One in-process restart as this rank saw it (``incarnation`` is the NEW incarnation).

    Timestamps are ``time.time()`` seconds on one host clock: ``t_raised`` (the previous incarnation's
    train_fn raised on this rank), ``t_detected`` (NVRx's monitor thread saw an interruption in its store,
    before its ``last_call_wait``), ``t_aborted`` (our Abort ran: sockets reset, process groups destroyed),
    ``t_finalized`` (Finalize ran), ``t_initialized`` (NVRx began the next iteration, after its iteration
    barrier and a full ``gc.collect()`` loop) and ``t_entered`` (train_fn re-entered).
    ``RestartContext.restart_event_fields(t_ready)`` turns them into the ``restart`` event's fields.
    """

    incarnation: int
    error: str | None = None  # repr of what the previous incarnation raised on this rank
    t_raised: float | None = None
    t_detected: float | None = None
    t_aborted: float | None = None
    t_finalized: float | None = None
    t_initialized: float | None = None  # NVRx's next iteration began (after its barrier and gc)
    t_entered: float | None = None

    @property
    def t_began(self) -> float:
        """When the restart began on this rank: the earliest sign of the fault."""
        stamps = (self.t_raised, self.t_detected, self.t_aborted, self.t_finalized, self.t_initialized, self.t_entered)
        times = [t for t in stamps if t]
        return min(times) if times else float("nan")

    @property
    def restart_s(self) -> float:
        """From the fault showing on this rank to train_fn running again (NVRx's own overhead)."""
        return (self.t_entered or float("nan")) - self.t_began

    def as_dict(self) -> dict[str, Any]:
        return {
            "incarnation": self.incarnation,
            "error": self.error,
            "t_raised": self.t_raised,
            "t_detected": self.t_detected,
            "t_aborted": self.t_aborted,
            "t_finalized": self.t_finalized,
            "t_initialized": self.t_initialized,
            "t_entered": self.t_entered,
            "t_began": self.t_began,
            "restart_s": self.restart_s,
        }


@dataclass
class RestartContext:
    """What ``train_fn`` gets on every (re)entry."""

    incarnation: int  # 0 on the first call, +1 per in-process restart
    rank: int
    world_size: int
    store: "dist.Store"  # fresh prefix "<token>/nvrx/restart<n>": build this incarnation's process group on it
    store_prefix: str
    exclude_ports: tuple[int, ...]  # store ports a socket-reset fault must leave alone
    t_launch: float  # when run_with_inprocess_restart was called (the launch of incarnation 0)
    t_entered: float
    restarts: tuple[RestartRecord, ...]  # every restart so far, oldest first
    call_wrapper: Any = field(repr=False, default=None)  # NVRx's CallWrapper (ping(), atomic())
    _finalizers: list[Callable[[], Any]] = field(default_factory=list, repr=False)

    @property
    def previous(self) -> RestartRecord | None:
        """The restart that led to this incarnation (None for incarnation 0)."""
        return self.restarts[-1] if self.restarts else None

    def init_process_group(self, timeout: datetime.timedelta, backend: str = "gloo") -> None:
        """Build this incarnation's default process group on its own store prefix."""
        import torch.distributed as dist  # lazy: torch

        dist.init_process_group(backend, store=self.store, rank=self.rank, world_size=self.world_size, timeout=timeout)

    def add_finalizer(self, fn: Callable[[], Any]) -> None:
        """Run ``fn`` (last added first) if this incarnation is torn down by a restart, e.g. to stop
        an async checkpoint writer. Runs after the process groups are gone; errors are logged."""
        self._finalizers.append(fn)

    def restart_event_fields(self, t_ready: float) -> dict[str, Any]:
        """Fields for the harness's ``restart`` event, once this incarnation is ready to train
        (process group, model, optimizer built and checkpoint restored)."""
        prev = self.previous
        fields: dict[str, Any] = {
            "t_launch": self.t_launch if prev is None else prev.t_began,
            "t_ready": t_ready,
            "incarnation": self.incarnation,
            "in_process": True,
        }
        if prev is not None:
            fields.update({f"nvrx_{k}": v for k, v in prev.as_dict().items() if k.startswith("t_")})
            fields["nvrx_restart_s"] = prev.restart_s
            fields["nvrx_error"] = prev.error
        return fields


@dataclass
class NvrxRun(Generic[T]):
    """What ``run_with_inprocess_restart`` returns on this rank."""

    value: T | None  # train_fn's return value (None on a rank NVRx kept inactive)
    restarts: list[RestartRecord]
    incarnations: int
    monitor_pid: int | None
    monitor_exit: str  # "exited", "terminated" (we had to), or "unknown" (pid never seen)
    nvrx_version: str | None
    t_launch: float
    t_end: float
