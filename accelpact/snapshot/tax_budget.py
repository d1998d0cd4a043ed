"""The snapshotter's tax budget: measure protection's cost, agree on one cadence with every rank, switch.

With ``SnapshotConfig.max_tax`` set, a rank snapshots at the configured (warm-up) cadence until the decision
step ``D``: the first multiple of ``DECIDE_EVERY`` that is at least ``tax_warmup`` and at least the rank's
first step, a function of step numbers only, so that a replacement that joins during the warm-up decides
at the same step as the others. There every rank sends its measured costs through the control store (a gather, out of band),
every rank computes the same cadence from the same costs (``accelpact.snapshot.cadence``), and all switch
at the same later step. Every rank then writes the decision to the store, so that a replacement, which
joins after it, takes the same cadence instead of measuring again.

Failure modes, each logged: no control store (a single rank decides alone; more ranks keep the warm-up
cadence, since ranks deciding apart would hold no common step); a gather that fails (a rank died at D, the
store was lost): every rank keeps the warm-up cadence and tries again ``DECIDE_EVERY`` steps later. After a
lost store, the ranks that decided write the decision again at their next step, for replacements to find.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from accelpact.common.control_client import ControlClient
from accelpact.snapshot.cadence import CostProbe, Costs, Schedule, choose, combine, predicted_tax

__all__ = ["TaxBudget", "DECIDE_EVERY", "STORE_KEY"]

_log = logging.getLogger("accelpact.snapshot")

DECIDE_EVERY = 8  # decisions fall on multiples of this step, so that every rank picks the same one
STORE_KEY = "snapshot-cadence"
_GATHER_DEADLINE_S = 20.0
_ADOPT_DEADLINE_S = 1.0  # a resumed rank's look for the job's decision: once at its first step, and at D


class TaxBudget:
    """One rank's side of the budgeted cadence (see the module docstring)."""

    def __init__(
        self,
        max_tax: float,
        max_bound: int,
        warmup: int,
        warm: tuple[int, int],
        rank: int,
        world_size: int,
        push_cost: Callable[[], float | None] | None,
    ) -> None:
        self.max_tax, self.max_bound, self.warmup = float(max_tax), int(max_bound), int(warmup)
        self.warm, self.rank, self.world_size = warm, int(rank), int(world_size)
        self.push_cost = push_cost  # the sender's median CPU per push (None: no pushes)
        self.control: ControlClient | None = None
        self.probe = CostProbe()
        self.schedule: Schedule | None = None
        self.decision: dict[str, Any] | None = None  # what was measured and chosen, for the rank's report
        self._decide_at: int | None = None
        self._last: tuple[int, float] | None = None
        self._restored = False
        self._published_generation: int | None = None

    def at(self, step: int) -> tuple[int, int]:
        """(every, push_every) for ``step``."""
        return self.schedule.at(step) if self.schedule is not None else self.warm

    def restored(self) -> None:
        """This rank resumed from a snapshot (a replacement or a restarted group): adopt the job's decision."""
        self._restored = True

    def learn(self) -> None:
        """A replacement about to heal: take the job's recorded cadence now, if there is one."""
        self._restored = True
        if self.schedule is None:
            self._adopt()

    def on_snapshot(self, cpu_s: float) -> None:
        self.probe.add_snapshot(cpu_s, None)

    def on_commit(self, step: int, now: float, generation: int) -> None:
        """Called at every committed step before its snapshot: measure, and decide or adopt when due."""
        if self._last is not None and step == self._last[0] + 1:
            self.probe.add_step(now - self._last[1])
        self._last = (step, now)
        if self.schedule is not None:
            if generation != self._published_generation:  # e.g. after a lost store: tell replacements again
                self._publish(generation)
            return
        if self._decide_at is None:
            self._decide_at = -(-max(self.warmup, step) // DECIDE_EVERY) * DECIDE_EVERY
            if self._restored and self._adopt():
                return
        if step < self._decide_at:
            return
        if self._restored and self._adopt():
            return
        self._decide(step, generation)

    # -- internals -------------------------------------------------------------------------------------

    def _costs(self) -> Costs | None:
        if not self.probe.step_s or not self.probe.snapshot_s:
            return None
        push = self.push_cost() if self.push_cost is not None else None
        if push is not None:
            self.probe.push_s = [push]
        raw = self.probe.costs()
        # The warm-up's steps carried the warm-up cadence's protection; take it out of the step, as if it
        # all competed with training (it does on a CPU-bound host; elsewhere this errs toward sparser).
        spent = predicted_tax(raw, *self.warm) * raw.step_s
        return Costs(raw.snapshot_s, raw.push_s, max(raw.step_s - spent, raw.step_s / 2))

    def _decide(self, step: int, generation: int) -> None:
        mine = self._costs()
        if self.world_size > 1 and self.control is None:
            _log.warning(
                "rank %d: snapshot max_tax needs the control store to agree on a cadence with the other "
                "ranks; keeping every=%d push_every=%d",
                self.rank,
                *self.warm,
            )
            self._decide_at = 1 << 62
            return
        payload = json.dumps(mine.to_list() if mine is not None else None).encode()
        try:
            if self.control is not None and self.world_size > 1:
                raw = self.control.gather(f"{STORE_KEY}/{step}", payload, generation, deadline_s=_GATHER_DEADLINE_S)
                rows = [json.loads(v) for _, v in sorted(raw.items())]
            else:
                rows = [json.loads(payload)]
        except Exception as exc:  # noqa: BLE001 - every rank fails alike; the next decision point retries
            self._decide_at = step + DECIDE_EVERY
            _log.warning(
                "rank %d: the cadence agreement at step %d failed (%s); retrying at %d",
                self.rank,
                step,
                exc,
                self._decide_at,
            )
            return
        costs = [Costs.from_list(r) for r in rows if r is not None]
        if not costs:
            self._decide_at = step + DECIDE_EVERY
            return
        job = combine(costs)
        e, k, fits = choose(job, self.max_tax, self.max_bound, pushes=self.push_cost is not None)
        self.schedule = Schedule.after(step, self.warm, (e, k))
        self.decision = {
            "step": step,
            "costs": job.to_list(),
            "every": e,
            "push_every": k,
            "switch_at": self.schedule.switch_at,
            "tax": predicted_tax(job, e, k),
            "fits": fits,
        }
        log = _log.info if fits else _log.warning
        log(
            "rank %d: snapshot cadence every=%d push_every=%d from step %d: predicted tax %.1f%% (budget %.1f%%%s;"
            " snapshot %.1f ms, push %.1f ms, step %.1f ms)",
            self.rank,
            e,
            k,
            self.schedule.switch_at,
            100 * self.decision["tax"],
            100 * self.max_tax,
            "" if fits else f", not met within a replay bound of {self.max_bound} steps",
            1e3 * job.snapshot_s,
            1e3 * job.push_s,
            1e3 * job.step_s,
        )
        self._publish(generation)

    def _publish(self, generation: int) -> None:
        if self.control is None or self.schedule is None:
            return
        try:
            self.control.set(self.control.key(STORE_KEY), self.schedule.to_text().encode())
            self._published_generation = generation
        except Exception as exc:  # noqa: BLE001 - a replacement then decides anew, and says so
            _log.warning("rank %d: could not record the snapshot cadence in the store: %s", self.rank, exc)

    def _adopt(self) -> bool:
        """A resumed rank takes the job's recorded cadence; False when none is recorded (none was decided)."""
        if self.control is None:
            return False
        try:
            text = self.control.get(self.control.key(STORE_KEY), deadline_s=_ADOPT_DEADLINE_S).decode()
        except Exception:  # noqa: BLE001 - no decision yet: this rank decides with the others
            return False
        self.schedule = Schedule.from_text(text)
        _log.info("rank %d: adopted the job's snapshot cadence %s", self.rank, text)
        return True
