"""The ``checkpoint_restore`` baseline: NVIDIA Resiliency Extension (NVRx) in-process restart on gloo/CPU.

``run_with_inprocess_restart(train_fn)`` runs a plain rank training function under
``nvidia_resiliency_ext.inprocess.Wrapper`` (0.4.1). The process stays alive; when ``train_fn`` raises on
any rank, NVRx interrupts every rank, our Abort tears the data plane down (its own gloo sockets first:
NVRx's stock abort is NCCL's and cannot interrupt a gloo collective), our Finalize runs the user's
cleanups, and NVRx calls ``train_fn`` again with the next incarnation. ``train_fn`` rebuilds its process
group on ``ctx.store`` (a never-used prefix per incarnation, on a second store client: NVRx's monitor
thread holds the first), rebuilds model and optimizer, restores the newest checkpoint and replays the lost
steps. Each restart's timestamps are a ``RestartRecord``. docs/harness.md, "The NVRx baseline", has the
facts about NVRx this is built on.
"""

import datetime
import gc
import logging
import os
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch.distributed as dist

__all__ = [
    "NVRX_VERSION",
    "STORE_PORT_ENV",
    "STORE_HOST_ENV",
    "NvrxUnavailable",
    "NvrxRestartsExhausted",
    "NvrxSettings",
    "RestartRecord",
    "RestartContext",
    "NvrxRun",
    "import_inprocess",
    "run_with_inprocess_restart",
    "store_ports",
]

from harness.strategies.checkpoint_restore.nvrx_types import (
    NVRX_VERSION,
    STORE_HOST_ENV,
    STORE_PORT_ENV,
    NvrxRestartsExhausted,
    NvrxRun,
    NvrxSettings,
    NvrxUnavailable,
    RestartContext,
    RestartRecord,
    T,
    _installed_version,
    import_inprocess,
)

log = logging.getLogger(__name__)


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
    from accelpact.inject import reset_own_gloo_sockets  # lazy: torch

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
    import psutil  # lazy: psutil

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
