"""Scenario runner: many recoveries in one process, sampling where the memory and the fds go.

``probe`` trains the tiny decoder under a guard with the soak's faults (no hangs: they only cost
time) and, every ``every`` recoveries, records RSS, glibc's heap (``mallinfo2``: in use vs free but
kept), Python's allocated blocks, the Python heap (``tracemalloc``, when ``tracemalloc`` is set; with
``top``, also where it grew), gc object counts of the suspects (stores, futures, recovery events),
c10d's registries and this process's fds by kind. ``keep_events`` sets ``guard.events.keep``;
``unbounded_events`` keeps every RecoveryEvent (as before :class:`accelpact.events.RecoveryLog`);
``ACCELPACT_MALLOC_TRIM=0`` in the ranks' environment turns off :mod:`accelpact.dataplane.heap`'s trim.
"""

from __future__ import annotations

import ctypes
import gc
import os
import socket
import sys
import time
import tracemalloc
from collections.abc import Collection
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch.distributed.distributed_c10d as c10d

from accelpact import testing as fault_testing
from accelpact.guard import attach
from experiments.workloads.fault_schedules import PG_TIMEOUT_S, armed, soak_faults
from experiments.workloads.fsdp_models import batch_for, build, model_config, resources, step_fn_for

if TYPE_CHECKING:
    from accelpact.testing.rank import RankContext

__all__ = ["RUNNER", "probe", "mallinfo", "fd_kinds"]

RUNNER = f"{__name__}:probe"


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (n, ctypes.c_size_t)
        for n in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def mallinfo() -> dict[str, float]:
    """glibc's heap in MiB: ``in_use`` (allocated chunks), ``free`` (free but kept by the arenas), ``mmap``."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    m = libc.mallinfo2()
    return {"heap_in_use_mib": m.uordblks / 2**20, "heap_free_mib": m.fordblks / 2**20, "mmap_mib": m.hblkhd / 2**20}


def fd_kinds(store_ports: Collection[int] = ()) -> dict[str, int]:
    """This process's fds by kind, counted: a TCP socket is "tcp store" (to or from a port in
    ``store_ports``), "tcp listen" or "tcp peer"; other sockets by family, files by path, pipes,
    anon inodes (eventpoll, eventfd) by name. Says which fds a change in the count is made of."""
    ports = set(store_ports)
    out: dict[str, int] = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:["):
            kind = _socket_kind(int(name), ports)
            if kind is None:
                continue
        elif target.startswith("anon_inode:"):
            kind = target
        elif target.startswith("pipe:"):
            kind = "pipe"
        else:
            kind = "file " + target
        out[kind] = out.get(kind, 0) + 1
    return out


def _socket_kind(fd: int, store_ports: set[int]) -> str | None:
    try:
        s = socket.socket(fileno=os.dup(fd))
    except OSError:  # closed while we looked
        return None
    try:
        if s.family not in (socket.AF_INET, socket.AF_INET6):
            return "unix socket" if s.family == socket.AF_UNIX else "other socket"
        if s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            return "tcp listen"
        try:
            remote = s.getpeername()[1]
        except OSError:
            remote = 0
        local = s.getsockname()[1]
        if local in store_ports or remote in store_ports:
            return "tcp store"
        return "tcp peer" if remote else "tcp unconnected"
    except OSError:
        return None
    finally:
        s.close()


def _objects() -> dict[str, int]:
    names = (
        "ProcessGroup",
        "ProcessGroupGloo",
        "Work",
        "TCPStore",
        "PrefixStore",
        "RecoveryEvent",
        "Future",
        "Thread",
        "_Connection",
        "frame",
        "traceback",
        "dict",
        "list",
        "function",
        "cell",
        "tuple",
    )
    counts = dict.fromkeys(names, 0)
    for o in gc.get_objects():
        n = type(o).__name__
        if n in counts:
            counts[n] += 1
    return counts


def _c10d() -> dict[str, int]:
    w = c10d._world
    return {
        "pg_map": len(w.pg_map),
        "pg_names": len(w.pg_names),
        "pg_group_ranks": len(w.pg_group_ranks),
        "pg_backend_config": len(w.pg_backend_config),
        "tags": sum(len(v) for v in w.tags_to_pg.values()),
        "pg_to_tag": len(w.pg_to_tag),
        "pg_coalesce_state": len(w.pg_coalesce_state),
        "pg_default_device": len(getattr(w, "pg_default_device", {}) or {}),
    }


def probe(sc: dict, ctx: RankContext) -> dict:
    """Run ``sc["faults"]`` recoveries; sample every ``sc["every"]`` recoveries (see module docstring)."""
    m = model_config(sc.get("model"))
    model, optimizer, root, middle = build("fsdp2", m, None)
    injector = fault_testing.FaultInjector(exclude_ports=ctx.exclude_ports)
    injector.install(root, middle)
    faults = [f for f in soak_faults(ctx.world_size, sc["faults"]) if f.get("action") != "stall"]
    for f in armed(faults):
        if ctx.rank in f["ranks"]:
            injector.arm(f["step"], f["phase"], f.get("action", "reset"), stall_s=f.get("stall_s", 0.0))
    if sc.get("tracemalloc"):
        tracemalloc.start(sc.get("frames", 8))
    guard = attach(
        model,
        optimizer,
        ctx.control,
        max_grad_norm=1.0,
        pg_timeout=timedelta(seconds=PG_TIMEOUT_S),
        injection_clock=injector.consume_injection_time,
        heartbeat_misses=20,
    )
    guard.phase_hooks.append(injector.on_phase)
    if sc.get("unbounded_events"):  # as before the RecoveryLog: every event kept
        guard.events.keep = 10**9
    elif sc.get("keep_events"):
        guard.events.keep = int(sc["keep_events"])
    step_fn = step_fn_for(model)
    samples: list[dict[str, Any]] = []
    snaps: dict[int, Any] = {}
    every, seen, n_events = int(sc.get("every", 20)), -1, 0
    steps = max(f["step"] for f in faults) + 2
    t0 = time.time()
    if sc.get("steps"):
        steps = int(sc["steps"])
    by_kind = {"clean": [0, 0.0], "recovery": [0, 0.0]}  # steps, glibc in-use growth (MiB) over them
    clean_step_s: list[float] = []
    for step in range(steps):
        before, n_before = mallinfo()["heap_in_use_mib"], guard.events.total
        t_step = time.perf_counter()
        guard.step(step_fn, batch_for(step, ctx.rank, m))
        n_events = guard.events.total
        if n_events == n_before:
            clean_step_s.append(time.perf_counter() - t_step)
        kind = by_kind["recovery" if n_events > n_before else "clean"]
        kind[0] += 1
        kind[1] += mallinfo()["heap_in_use_mib"] - before
        if n_events // every != seen:
            seen = n_events // every
            res = resources(ctx.exclude_ports)
            s = {
                "step": step,
                "recoveries": n_events,
                "t": time.time() - t0,
                **res,
                **mallinfo(),
                "py_blocks": sys.getallocatedblocks(),
                "objects": _objects(),
                "c10d": _c10d(),
                "fds_by_kind": fd_kinds(ctx.exclude_ports),
                "abandoned": len(getattr(guard.backend, "_abandoned", [])),
                "events_kept": len(guard.events),
            }
            if sc.get("tracemalloc"):
                s["py_traced_mib"] = tracemalloc.get_traced_memory()[0] / 2**20
                if sc.get("top"):  # the snapshots themselves are traced: only when asked
                    snaps[n_events] = tracemalloc.take_snapshot()
            samples.append(s)
    out: dict[str, Any] = {
        "samples": samples,
        "recoveries": n_events,
        "by_kind": by_kind,
        "retire_ms": [e.retire_s * 1e3 for e in guard.events],
        "clean_step_ms_median": sorted(clean_step_s)[len(clean_step_s) // 2] * 1e3 if clean_step_s else None,
    }
    if len(snaps) >= 2:
        keys = sorted(snaps)
        first, last = snaps[keys[1] if len(keys) > 2 else keys[0]], snaps[keys[-1]]
        stats = last.compare_to(first, "traceback")
        out["top_growth"] = [
            {
                "kib": st.size_diff / 1024,
                "count": st.count_diff,
                "where": [str(fr) for fr in st.traceback.format()[-12:]],
            }
            for st in stats[:15]
        ]
    guard.close()
    injector.remove()
    return out
