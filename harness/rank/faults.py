"""Rank side of fault injection: arm this rank's scheduled faults and fire them at their phase.

Every fault is triggered inside the rank at its (step, phase), through ``accelpact.testing``'s
``FaultInjector`` (module hooks for the forward/backward phases, explicit calls or guard phase hooks
for ``clip_allreduce`` / ``vote``), so it lands exactly where the schedule says:

- ``socket_reset``: the rank shuts down its own gloo TCP connections (store ports excluded) and
  writes the ``fault`` event itself.
- ``hang`` / ``kill`` / ``blackhole`` / ``link_down`` / ``tcp_reset``: the rank writes a request file
  ``<run_dir>/faults/request_<i>_rank<R>.json`` and waits for the parent's ack. The parent
  (``harness.faults.driver``) acts from outside (SIGSTOP ... SIGCONT, SIGKILL, a namespace fault),
  records the ``fault`` event with the time it acted, then acks. A hung rank sees the ack once it is
  continued; a killed one never does.

Each fault fires once per run (``FiredMarkers``), also across cold restarts and in-process restarts.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Collection
from typing import Any

from harness.events import EventLog, Fault
from harness.faults import planned, registry
from harness.faults.handshake import ack_path, request_path
from harness.faults.schedule import FiredMarkers, PlannedFault, plan_faults
from harness.schema import RunConfig

# How long a rank waits for the parent to act on its request before it gives up and continues.
ACK_TIMEOUT_S = 60.0
_ACK_POLL_S = 0.002


# Fault points after a step committed, in the loop's own collectives (harness.rank.strategies.base).
BETWEEN_STEPS = ("eval", "checkpoint_save")


class RankFaults:
    """This rank's pending faults. ``install(model)`` once, ``begin_step(step)`` at the top of every
    step, ``maybe_fire(phase)`` before the clip all-reduce and the vote (or ``on_phase`` as a guard hook)."""

    def __init__(
        self, cfg: RunConfig, rank: int, run_dir: str, events: EventLog, exclude_ports: Collection[int]
    ) -> None:
        from accelpact.inject import FaultInjector  # lazy: torch

        self.rank = rank
        self.run_dir = run_dir
        self.events = events
        self.markers = FiredMarkers(run_dir)
        plan = plan_faults(cfg.fault, cfg.train.steps, cfg.checkpoint.interval, cfg.cluster.world_size)
        self.pending: list[PlannedFault] = self.markers.pending(plan, rank)
        self.injector = FaultInjector(exclude_ports=tuple(exclude_ports), on_fire=self._on_fire)
        self._planned: dict[int, PlannedFault] = {}
        # Second firings of nested kinds, by the id of their first: they fire only inside a recovery.
        self._nested: dict[int, Any] = {}
        for fault in self.pending:
            kind = registry.get(fault.kind)
            if kind.where == "rank":
                spec = self.injector.arm(fault.step, fault.phase, kind.rank_action or "reset")
                if kind.nested:
                    self._nested[id(spec)] = self.injector.arm(fault.step, "recovery", kind.rank_action or "reset")
            else:
                # The parent does the work (in _on_fire); the 1 ms stall only records the injection time
                # so accelpact measures detection from the fault, not from the step's start.
                spec = self.injector.arm(fault.step, fault.phase, "stall", stall_s=1e-3)
            self._planned[id(spec)] = fault

    @classmethod
    def for_rank(
        cls, cfg: RunConfig, rank: int, run_dir: str, events: EventLog, exclude_ports: Collection[int]
    ) -> RankFaults | None:
        """None when this run injects nothing (``fault=none``)."""
        if not planned.injects(cfg):
            return None
        return cls(cfg, rank, run_dir, events, exclude_ports)

    def install(self, model: Any) -> None:
        from harness.models import decoder_layers  # lazy: torch

        layers = decoder_layers(model)
        self.injector.install(model, layers[len(layers) // 2])

    def begin_step(self, step: int) -> None:
        self.injector.begin_step(step)

    def maybe_fire(self, phase: str) -> bool:
        return self.injector.maybe_fire(phase)

    def on_phase(self, phase: str, _guard_step: int) -> None:
        """A guard phase hook. The harness's step index (set by ``begin_step``) is used, not the guard's."""
        if phase in ("clip_allreduce", "vote", "post_vote", "recovery"):
            self.injector.maybe_fire(phase)

    def unfired(self, step: int) -> list[str]:
        """Phases of faults armed for ``step`` that have not fired (the strategy skipped their point).

        A nested second firing is not missed when no recovery happened (cold restart): it is dropped."""
        seconds = {id(s) for s in self._nested.values()}
        for spec in [s for s in self.injector.armed if s.step == step and id(s) in seconds]:
            self.injector.disarm(spec)
        # The phases between steps (eval, checkpoint_save) fire after the step: not missed yet.
        return [spec.phase for spec in self.injector.armed if spec.step == step and spec.phase not in BETWEEN_STEPS]

    def remove(self) -> None:
        self.injector.remove()

    # -- firing ------------------------------------------------------------------------------------
    def _on_fire(self, spec: Any) -> None:
        if id(spec) not in self._planned:
            return  # a nested second firing: part of its first one's fault (one event, one marker)
        fault = self._planned[id(spec)]
        if not self.markers.claim(fault.index, self.rank, step=fault.step, phase=fault.phase, kind=fault.kind):
            # Already fired in an earlier incarnation: this one does nothing, nor does its nested second.
            self.injector.disarm(spec)
            second = self._nested.get(id(spec))
            if second is not None:
                self.injector.disarm(second)
            return
        if registry.get(fault.kind).where == "rank":
            self.events.emit(
                Fault,
                fault=fault.kind,
                step=fault.step,
                phase=fault.phase,
                ranks=[self.rank],
                index=fault.index,
                age=fault.age,
                t_inject=spec.fired_at,
                by="rank",
            )
            return
        self._ask_parent(fault)
        action = registry.get(fault.kind).rank_action
        if action:  # the rank's own part, after the parent's (the injector acts on it right after this)
            self.injector.rearm(spec, action, stall_s=spec.stall_s)

    def _ask_parent(self, fault: PlannedFault) -> None:
        req = request_path(self.run_dir, fault.index, self.rank)
        tmp = req.with_suffix(".tmp")
        tmp.write_text(
            json.dumps(
                {
                    "index": fault.index,
                    "kind": fault.kind,
                    "step": fault.step,
                    "phase": fault.phase,
                    "rank": self.rank,
                    "ranks": [self.rank],
                    "age": fault.age,
                    "pid": os.getpid(),
                    "t": time.time(),
                }
            )
        )
        os.replace(tmp, req)
        ack = ack_path(self.run_dir, fault.index, self.rank)
        deadline = time.monotonic() + ACK_TIMEOUT_S
        while not ack.exists():
            if time.monotonic() > deadline:
                print(
                    f"rank {self.rank}: the parent did not act on fault {fault.index} ({fault.kind}) within "
                    f"{ACK_TIMEOUT_S:.0f} s; continuing without it",
                    flush=True,
                )
                return
            time.sleep(_ACK_POLL_S)
