"""Parent side of fault injection and recovery: act on the ranks' fault requests, decide relaunches.

``FaultDriver.tick()`` runs in the parent's poll loop (``Launcher.tick_hooks``). A rank that reached
the (step, phase) of a parent-side fault wrote ``faults/request_<i>_rank<R>.json`` and waits for the
ack (``harness.faults.rank_side``). The driver then acts from outside the rank and records the ``fault``
event (``events/parent.jsonl``) with the wall time it acted:

- ``hang``: SIGSTOP the rank's process group, ack, SIGCONT it ``fault.outage_s`` later (longer than
  the process-group timeout, so its peers time out). Parent-timed; the rank is stopped at its phase.
- ``kill``: SIGKILL the rank's process group. No ack: the rank is gone.
- ``blackhole`` / ``link_down``: the rank runs in its own network namespace (``NetnsTopology``); the
  fault is applied to its data link, acked, and healed ``fault.outage_s`` later (on a thread).
- ``tcp_reset``: ``ss -K`` on the rank's data-plane sockets, then ack.

``relaunch_reason`` is the relaunch policy: cold_restart relaunches after any rank failure (as a
cluster manager would); accelpact relaunches (falls back to checkpoint restore) only when a rank said
it cannot recover in memory (exit ``EXIT_FALLBACK``) or was killed by a signal. Pure.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

from harness.events import EventLog
from harness.faults.schedule import FAULTS_DIR
from harness.faults.rank_side import ack_path
from harness.app.schema import FaultKind, RunConfig, StrategyName

EXIT_FALLBACK = 75  # mirrors harness.strategies.accelpact.EXIT_FALLBACK (that module imports torch)


def relaunch_reason(
    strategy: str, exit_codes: Mapping[int, Optional[int]], restarts: int, max_restarts: int, interrupted: bool,
    first_failure: Optional[int] = None,
) -> Optional[str]:
    """Why the parent should relaunch every rank now, or None to stop (the run then ends as it is).

    ``first_failure``: the rank that failed first (the others were torn down by the parent)."""
    if interrupted or restarts >= max_restarts:
        return None
    failed = {r: c for r, c in exit_codes.items() if c not in (0, None)}
    if not failed:
        return None
    if strategy == StrategyName.cold_restart.value:
        rank = first_failure if first_failure in failed else min(failed)
        return f"cold restart: rank {rank} exited with {failed[rank]}"
    if strategy == StrategyName.accelpact.value:
        fell_back = sorted(r for r, c in failed.items() if c == EXIT_FALLBACK)
        killed = sorted(r for r, c in failed.items() if c is not None and c < 0)
        if fell_back or killed:
            parts = []
            if killed:
                parts.append(f"rank(s) {killed} killed by a signal")
            if fell_back:
                parts.append(f"rank(s) {fell_back} could not recover in memory")
            return "fallback to checkpoint restore: " + ", ".join(parts)
    return None


@dataclass
class _Hang:
    rank: int
    resume_at: float


@dataclass
class FaultDriver:
    run: RunConfig
    run_dir: Path
    launcher: Any  # harness.parent.launcher.Launcher (signal_rank)
    events: EventLog  # the parent's event log
    topology: Any = None  # harness.faults.netns.NetnsTopology for namespace faults
    handled: set[str] = field(default_factory=set)
    _hangs: list[_Hang] = field(default_factory=list)
    _threads: list[threading.Thread] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def tick(self) -> None:
        now = time.time()
        for hang in list(self._hangs):
            if now >= hang.resume_at:
                self._hangs.remove(hang)
                self._signal(hang.rank, signal.SIGCONT)
        directory = Path(self.run_dir) / FAULTS_DIR
        if not directory.exists():
            return
        for req in sorted(directory.glob("request_*.json")):
            if req.name in self.handled:
                continue
            self.handled.add(req.name)
            try:
                self._act(json.loads(req.read_text()))
            except Exception as exc:  # noqa: BLE001 - recorded; the run goes on and its row says so
                self.errors.append(f"{req.name}: {type(exc).__name__}: {exc}")
                print(f"fault driver: could not inject {req.name}: {exc}", flush=True)

    def _record(self, req: Mapping[str, Any], **extra: Any) -> None:
        self.events.emit("fault", fault=req["kind"], step=req["step"], phase=req["phase"], ranks=[req["rank"]],
                         index=req["index"], age=req.get("age"), by="parent", **extra)

    def _ack(self, req: Mapping[str, Any]) -> None:
        ack_path(self.run_dir, req["index"], req["rank"]).write_text(str(time.time()))

    def _signal(self, rank: int, sig: int) -> None:
        try:
            self.launcher.signal_rank(rank, sig)
        except (ProcessLookupError, KeyError):
            pass

    def _act(self, req: Mapping[str, Any]) -> None:
        kind, rank = FaultKind(req["kind"]), int(req["rank"])
        outage = float(self.run.fault.outage_s)
        if kind == FaultKind.hang:
            self._signal(rank, signal.SIGSTOP)
            self._record(req, outage_s=outage)
            self._ack(req)  # read by the rank once it is continued
            self._hangs.append(_Hang(rank, time.time() + outage))
        elif kind == FaultKind.kill:
            self._record(req)
            self._signal(rank, signal.SIGKILL)
        elif kind == FaultKind.tcp_reset:
            record = self._topology().tcp_reset([rank])
            self._record(req, sockets_reset=record.sockets_reset)
            self._ack(req)
        elif kind in (FaultKind.blackhole, FaultKind.link_down):
            topo = self._topology()
            applied = threading.Event()

            def outage_body() -> None:
                try:
                    with topo.outage(kind.value, [rank]):
                        self._record(req, outage_s=outage)
                        applied.set()
                        topo._closed.wait(outage)  # returns early if the topology is torn down
                except Exception as exc:  # noqa: BLE001
                    self.errors.append(f"{kind.value} on rank {rank}: {exc}")
                finally:
                    applied.set()

            t = threading.Thread(target=outage_body, daemon=True, name=f"fault-{kind.value}-{rank}")
            t.start()
            self._threads.append(t)
            applied.wait(15)
            self._ack(req)
        else:
            raise ValueError(f"fault kind {kind.value} is not injected by the parent")

    def _topology(self) -> Any:
        if self.topology is None:
            raise RuntimeError(f"fault={self.run.fault.kind.value} needs the ranks in network namespaces")
        return self.topology

    def close(self) -> None:
        """Continue any rank still stopped; wait for link faults to heal (they end at teardown)."""
        for hang in self._hangs:
            self._signal(hang.rank, signal.SIGCONT)
        self._hangs.clear()
        for t in self._threads:
            t.join(timeout=1.0)
