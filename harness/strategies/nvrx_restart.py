"""The ``checkpoint_restore`` baseline: NVIDIA Resiliency Extension (NVRx) in-process restart on gloo/CPU.

``run_with_inprocess_restart(train_fn)`` runs a plain rank training function under
``nvidia_resiliency_ext.inprocess.Wrapper`` (0.4.1). The process stays alive; when ``train_fn`` raises
on any rank (a gloo collective failing after a connection reset, say), NVRx interrupts every rank,
our Abort tears the data plane down, our Finalize runs the user's cleanups, and NVRx calls
``train_fn`` again with the next incarnation. ``train_fn`` is expected to rebuild its process group
on ``ctx.store`` (a never-used prefix per incarnation), rebuild model and optimizer, restore the
newest checkpoint and replay the lost steps: that is what makes this the checkpoint-restore
baseline that AccelPact's in-memory recovery is measured against.

Facts this module is built on (recovery-facts.md section 7, plus reading NVRx 0.4.1's source):

- NVRx needs its own TCPStore (``NVRX_STORE_PORT`` or ``NvrxSettings.store_port``), hosted by rank 0,
  and no process group may exist when the wrapper is entered.
- A TCPStore client serialises its operations: NVRx's monitor thread blocks in
  ``store.wait(..., monitor_interval)`` on the wrapper's client in a loop, so any other use of that
  client from the training thread stalls up to one interval. The process group is therefore
  rendezvoused on a SECOND client connection to the same server (or on a store the caller passes).
- NVRx's stock ``AbortTorchDistributed`` is written for NCCL (it asks every group for its CUDA
  backend) and ``destroy_process_group`` does not interrupt a gloo collective in flight; the
  ``RankShouldRestart`` that NVRx raises asynchronously only lands when the main thread is back in
  Python. A peer blocked in a gloo collective would then sit out the whole process-group timeout.
  Our Abort therefore shuts down this process's own gloo TCP connections first (the gloo analogue of
  ``ncclCommAbort``; store ports are left alone), then destroys every process group.
- NVRx forks a daemonised monitor process per rank (double fork + setsid, so it is not our child)
  that exits on its own within one monitor interval after the wrapper returns; we wait for it and
  terminate it if it lingers, so a finished run leaves nothing behind.

Timestamps surfaced per restart (``RestartRecord``), all ``time.time()`` seconds on one host clock:
``t_raised`` (train_fn's previous incarnation raised on this rank), ``t_detected`` (NVRx's monitor
thread saw an interruption in its store, before its ``last_call_wait``), ``t_aborted`` (our Abort
ran: sockets reset, process groups destroyed), ``t_finalized`` (Finalize ran), ``t_initialized``
(NVRx began the next iteration, after its iteration barrier and a full ``gc.collect()`` loop), and
``t_entered`` (train_fn re-entered). ``RestartContext.restart_event_fields(t_ready)`` turns them into the fields of
the harness's ``restart`` event.
"""

import datetime
import gc
import logging
import os
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Sequence, TypeVar

import torch.distributed as dist

__all__ = [
    "NVRX_VERSION",
    "STORE_PORT_ENV",
    "NvrxUnavailable",
    "NvrxRestartsExhausted",
    "NvrxSettings",
    "RestartRecord",
    "RestartContext",
    "NvrxRun",
    "import_inprocess",
    "run_with_inprocess_restart",
    "host_store",
    "store_ports",
]

NVRX_VERSION = "0.4.1"
STORE_PORT_ENV = "NVRX_STORE_PORT"

T = TypeVar("T")
log = logging.getLogger(__name__)


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
        from nvidia_resiliency_ext import inprocess
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
    store_host: str | None = None  # None: read MASTER_ADDR
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
        host = self.store_host or os.environ.get("MASTER_ADDR")
        if not host:
            raise ValueError("NVRx's store host is unknown: set MASTER_ADDR or pass NvrxSettings(store_host=...)")
        return host


@dataclass
class RestartRecord:
    """One in-process restart as this rank saw it (``incarnation`` is the NEW incarnation)."""

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
    store: dist.Store  # fresh prefix "<token>/nvrx/restart<n>": build this incarnation's process group on it
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
        dist.init_process_group(
            backend, store=self.store, rank=self.rank, world_size=self.world_size, timeout=timeout
        )

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


def host_store(port: int = 0, host: str = "127.0.0.1") -> dist.TCPStore:
    """Host NVRx's store in a process that outlives the ranks (the harness parent); pass its ``.port``
    to the ranks as NVRX_STORE_PORT.

    By default NVRx's rank 0 hosts the store, so a rank-0 death takes it, and with it every rank's
    restart, down. NVRx 0.4.1's rank 0 falls back to connecting as a client when the port is taken,
    which is what this relies on."""
    return dist.TCPStore(host, port, is_master=True, wait_for_workers=False)


def store_ports(store: dist.Store | None) -> tuple[int, ...]:
    """The TCP port behind a store (through PrefixStores), if any."""
    while store is not None:
        if isinstance(store, dist.TCPStore):
            return (int(store.port),)
        store = getattr(store, "underlying_store", None)
    return ()


class _Recorder:
    """Timestamps shared by the main thread (train_fn, Initialize, Finalize) and NVRx's monitor thread
    (Abort). Plain attribute writes; the GIL is enough."""

    def __init__(self) -> None:
        self.restarts: list[RestartRecord] = []
        self.pending = RestartRecord(incarnation=1)
        self.incarnations = 0
        self.finalizers: list[Callable[[], Any]] = []
        self.monitor_pid: int | None = None

    def entered(self, incarnation: int, t: float) -> None:
        if incarnation > 0:
            rec = self.pending
            rec.incarnation = incarnation
            rec.t_entered = t
            self.restarts.append(rec)
        self.pending = RestartRecord(incarnation=incarnation + 1)
        self.incarnations = incarnation + 1

    def raised(self, exc: BaseException, t: float) -> None:
        if self.pending.t_raised is None:
            self.pending.t_raised = t
            self.pending.error = _describe(exc)


def _describe(exc: BaseException, limit: int = 3) -> str:
    """``Type: message`` of the exception and what it interrupted: NVRx's RankShouldRestart lands
    asynchronously and often replaces the gloo error that was unwinding (its ``__context__``)."""
    parts: list[str] = []
    seen: BaseException | None = exc
    while seen is not None and len(parts) < limit:
        parts.append(f"{type(seen).__name__}: {str(seen)[:300]}")
        seen = seen.__cause__ or seen.__context__
    return " <- ".join(parts)


def _reset_data_plane_sockets(exclude_ports: Sequence[int]) -> int:
    from accelpact.testing import reset_own_gloo_sockets

    return reset_own_gloo_sockets(exclude_ports)


def _destroy_all_process_groups() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _build_hooks(inprocess: Any, recorder: _Recorder, settings: NvrxSettings, exclude: tuple[int, ...], world: int):
    """Initialize / Abort / Finalize as NVRx subclasses (the Wrapper type-checks them)."""
    retry = inprocess.initialize.RetryController(
        max_iterations=settings.max_restarts + 1,
        # FSDP shards over the whole world: a lost rank is not recoverable in place, so give up
        # rather than let NVRx's ShiftRanks continue on a smaller world.
        min_world_size=world,
        min_active_world_size=world,
    )

    class Initialize(inprocess.initialize.Initialize):
        def __call__(self, state: Any) -> Any:
            if state.iteration > 0:
                recorder.pending.t_initialized = time.time()
            if dist.is_initialized():  # a previous incarnation escaped Finalize; never reuse its group
                _destroy_all_process_groups()
            return retry(state)

    class Abort(inprocess.abort.Abort):
        # Runs on NVRx's monitor thread while the main thread may still be inside a collective.
        def __call__(self, state: Any) -> Any:
            recorder.pending.t_detected = recorder.pending.t_detected or time.time()
            if settings.abort_resets_sockets:
                try:
                    _reset_data_plane_sockets(exclude)
                except Exception as exc:  # noqa: BLE001 - the destroy below still runs
                    log.warning("NVRx abort: resetting gloo sockets failed: %r", exc)
            _destroy_all_process_groups()
            recorder.pending.t_aborted = time.time()
            return state

    class Finalize(inprocess.finalize.Finalize):
        def __call__(self, state: Any) -> Any:
            for fn in reversed(recorder.finalizers):
                try:
                    fn()
                except Exception as exc:  # noqa: BLE001 - a failed cleanup must not end the run
                    log.warning("NVRx finalize: cleanup %r failed: %r", fn, exc)
            recorder.finalizers.clear()
            _destroy_all_process_groups()
            recorder.pending.t_finalized = time.time()
            return state

    return Initialize(), Abort(), Finalize()


def _monitor_detection_patch(inprocess: Any, recorder: _Recorder) -> Callable[[], None]:
    """Stamp ``t_detected`` when NVRx's monitor thread sees the interruption (before last_call_wait).

    NVRx has no hook there: MonitorThread.run loops on ``store.wait_for_interrupted(interval)`` and
    goes on to wait ``last_call_wait`` and abort when it returns without raising. Wrap that method on
    the store class for the duration of the call. Returns the undo."""
    cls = inprocess.store.StoreMixin
    original = cls.wait_for_interrupted

    def wait_for_interrupted(self: Any, timeout: datetime.timedelta) -> Any:
        out = original(self, timeout)  # raises DistStoreError on a quiet interval
        if recorder.pending.t_detected is None:
            recorder.pending.t_detected = time.time()
        return out

    cls.wait_for_interrupted = wait_for_interrupted

    def undo() -> None:
        cls.wait_for_interrupted = original

    return undo


def _reap_monitor(pid: int | None, timeout_s: float) -> str:
    """Wait for NVRx's daemonised monitor process to exit; terminate it if it lingers.

    It is not our child (double fork + setsid), so we cannot waitpid it: poll, and count a zombie
    (exited, its new parent has not reaped it yet) as exited."""
    if pid is None:
        return "unknown"
    import psutil

    def gone(proc: "psutil.Process") -> bool:
        try:
            return proc.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    try:
        proc = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return "exited"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if gone(proc):
            return "exited"
        time.sleep(0.05)
    log.warning("NVRx monitor process %d still alive %.0f s after the run; terminating it", pid, timeout_s)
    try:
        proc.terminate()
        proc.wait(5)
    except psutil.TimeoutExpired:
        proc.kill()
    except psutil.NoSuchProcess:
        pass
    return "terminated"


def run_with_inprocess_restart(
    train_fn: Callable[[RestartContext], T],
    settings: NvrxSettings | None = None,
    *,
    token: str = "run",
    pg_store: dist.Store | None = None,
    exclude_ports: Sequence[int] = (),
    rank: int | None = None,
    world_size: int | None = None,
) -> NvrxRun[T]:
    """Run ``train_fn`` on this rank under NVRx in-process restart; call on every rank.

    ``train_fn(ctx)`` must build its process group on ``ctx.store`` (``ctx.init_process_group``),
    never catch ``BaseException`` (NVRx interrupts it with one), and be restartable: rebuild model and
    optimizer, restore the newest checkpoint, replay. Any ``Exception`` it raises on any rank
    restarts every rank, up to ``settings.max_restarts`` times.

    ``pg_store``: the store process groups rendezvous on (default: a second client of NVRx's own
    store). ``exclude_ports``: other ports a socket reset must leave alone (the harness's control
    store, say). ``rank``/``world_size`` default to the RANK/WORLD_SIZE environment variables, which
    NVRx reads.
    """
    inprocess = import_inprocess()
    settings = settings or NvrxSettings()
    if dist.is_initialized():
        raise RuntimeError(
            "a process group already exists: NVRx in-process restart must own the process groups; "
            "build them inside train_fn with ctx.init_process_group()"
        )
    if rank is not None:
        os.environ["RANK"] = str(rank)
    if world_size is not None:
        os.environ["WORLD_SIZE"] = str(world_size)
    missing = [k for k in ("RANK", "WORLD_SIZE") if k not in os.environ]
    if missing:
        # NVRx's State.from_env silently defaults to rank 0 of 1; never let that happen.
        raise ValueError(f"set {' and '.join(missing)} (or pass rank=/world_size=) before run_with_inprocess_restart")
    world = int(os.environ["WORLD_SIZE"])
    port = settings.resolved_port()
    host = settings.resolved_host()
    exclude = tuple(sorted({port, *store_ports(pg_store), *exclude_ports}))

    t_launch = time.time()
    recorder = _Recorder()
    initialize, abort, finalize = _build_hooks(inprocess, recorder, settings, exclude, world)
    s = datetime.timedelta
    soft = s(seconds=settings.progress_timeout_s)
    hard = soft + s(seconds=settings.hard_timeout_margin_s)
    barrier = hard + s(seconds=max(60.0, settings.heartbeat_timeout_s))
    wrapper = inprocess.Wrapper(
        store_kwargs={
            "host_name": host,
            "port": port,
            "world_size": world,
            "timeout": s(seconds=settings.store_timeout_s),
        },
        initialize=initialize,
        abort=abort,
        finalize=finalize,
        monitor_thread_interval=s(seconds=settings.monitor_interval_s),
        monitor_process_interval=s(seconds=settings.monitor_interval_s),
        heartbeat_interval=s(seconds=settings.heartbeat_interval_s),
        heartbeat_timeout=s(seconds=settings.heartbeat_timeout_s),
        progress_watchdog_interval=s(seconds=1),
        soft_timeout=soft,
        hard_timeout=hard,
        barrier_timeout=barrier,
        completion_timeout=barrier,
        last_call_wait=s(seconds=settings.last_call_wait_s),
        monitor_process_logfile=settings.monitor_log_file,
    )
    own_pg_store: list[dist.Store] = []

    def wrapped(call_wrapper=None):  # annotation set below: NVRx injects its CallWrapper by annotation
        n = call_wrapper.iteration
        t_entered = time.time()
        recorder.entered(n, t_entered)
        if recorder.monitor_pid is None:
            recorder.monitor_pid = call_wrapper.monitor_process.process_monitor_proc.pid
        base = pg_store
        if base is None:
            if not own_pg_store:
                # A second client of NVRx's server: NVRx's monitor thread keeps its own client busy.
                own_pg_store.append(
                    dist.TCPStore(host, port, world, is_master=False, timeout=s(seconds=settings.store_timeout_s))
                )
            base = own_pg_store[0]
        prefix = f"{token}/nvrx/restart{n}"
        ctx = RestartContext(
            incarnation=n,
            rank=int(os.environ["RANK"]),
            world_size=int(os.environ["WORLD_SIZE"]),
            store=dist.PrefixStore(prefix, base),
            store_prefix=prefix,
            exclude_ports=exclude,
            t_launch=t_launch,
            t_entered=t_entered,
            restarts=tuple(recorder.restarts),
            call_wrapper=call_wrapper,
            _finalizers=recorder.finalizers,
        )
        try:
            return train_fn(ctx)
        except BaseException as exc:  # RankShouldRestart too: stamp, then let NVRx handle it
            recorder.raised(exc, time.time())
            raise

    wrapped.__annotations__ = {"call_wrapper": inprocess.CallWrapper}
    undo = _monitor_detection_patch(inprocess, recorder)
    value: T | None = None
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="logging not initialized")
            value = wrapper(wrapped)()
    except inprocess.exception.RestartAbort as exc:
        last = recorder.pending.error or "unknown"
        raise NvrxRestartsExhausted(
            f"NVRx gave up after {len(recorder.restarts)} restart(s) (strategy.max_restarts="
            f"{settings.max_restarts}, world size must stay {world}): {exc}; last error on this rank: {last}",
            list(recorder.restarts),
        ) from exc
    finally:
        undo()
        # Every rank passed NVRx's completion barrier (or gave up): no peer is in a collective now.
        _destroy_all_process_groups()
        own_pg_store.clear()
        gc.collect()
        monitor_exit = _reap_monitor(recorder.monitor_pid, settings.monitor_exit_timeout_s)
    return NvrxRun(
        value=value,
        restarts=list(recorder.restarts),
        incarnations=recorder.incarnations,
        monitor_pid=recorder.monitor_pid,
        monitor_exit=monitor_exit,
        nvrx_version=_installed_version(),
        t_launch=t_launch,
        t_end=time.time(),
    )
