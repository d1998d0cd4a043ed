"""Parent side of fault injection: act on the ranks' fault requests.

``FaultDriver.tick()`` runs in the parent's poll loop (``Launcher.tick_hooks``). A rank that reached
the (step, phase) of a parent-side fault wrote ``faults/request_<i>_rank<R>.json`` and waits for the
ack (``harness.rank.faults``). The driver looks up the kind's ``FaultSpec`` and calls its
``parent_apply(driver, request)`` (the built-in ones are in ``harness.faults.kinds``), which acts from
outside the rank, records the ``fault`` event (``events/parent.jsonl``) with the wall time it acted
(:meth:`FaultDriver.record`) and acks (:meth:`FaultDriver.ack`). A killed rank is never acked.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.events import EventLog, Fault
from harness.faults import registry
from harness.faults.handshake import ack_path
from harness.faults.schedule import FAULTS_DIR
from harness.schema import RunConfig


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
    store_host: Any = None  # harness.faults.store_host.ChildStore for fault kinds with store_in_child
    handled: set[str] = field(default_factory=set)
    _hangs: list[_Hang] = field(default_factory=list)
    _threads: list[threading.Thread] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def tick(self) -> None:
        now = time.time()
        for hang in list(self._hangs):
            if now >= hang.resume_at:
                self._hangs.remove(hang)
                self.signal(hang.rank, signal.SIGCONT)
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

    def record(self, req: Mapping[str, Any], **extra: Any) -> None:
        self.events.emit(
            Fault,
            fault=req["kind"],
            step=req["step"],
            phase=req["phase"],
            ranks=[req["rank"]],
            index=req["index"],
            age=req.get("age"),
            by="parent",
            **extra,
        )

    def ack(self, req: Mapping[str, Any]) -> None:
        ack_path(self.run_dir, req["index"], req["rank"]).write_text(str(time.time()))

    def signal(self, rank: int, sig: int) -> None:
        try:
            self.launcher.signal_rank(rank, sig)
        except (ProcessLookupError, KeyError):
            pass

    def _act(self, req: Mapping[str, Any]) -> None:
        spec = registry.get(str(req["kind"]))
        if spec.parent_apply is None:
            raise ValueError(f"fault kind {spec.kind} is not applied by the parent (where={spec.where})")
        spec.parent_apply(self, dict(req))

    def stop_until(self, rank: int, resume_at: float) -> None:
        """Continue ``rank`` (SIGCONT) at wall time ``resume_at``, from the poll loop."""
        self._hangs.append(_Hang(rank, resume_at))

    def in_background(self, name: str, body: Any) -> None:
        """Run ``body()`` on a daemon thread joined at close (link outages that heal later)."""
        t = threading.Thread(target=body, daemon=True, name=name)
        t.start()
        self._threads.append(t)

    def topology_or_fail(self) -> Any:
        if self.topology is None:
            raise RuntimeError(
                f"fault={self.run.fault.kind} needs the ranks in network namespaces (cluster=local_hosts)"
            )
        return self.topology

    def close(self) -> None:
        """Continue any rank still stopped; wait for link faults to heal (they end at teardown)."""
        for hang in self._hangs:
            self.signal(hang.rank, signal.SIGCONT)
        self._hangs.clear()
        for t in self._threads:
            t.join(timeout=1.0)
