"""RecoveryEvent: what one in-memory recovery did and how long each part took; RecoveryLog: the
guard's bounded list of them.

Plain data, JSON-serialisable through ``dataclasses.asdict`` so the harness can write it straight
into its per-rank event log (kind ``recovery``).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["RecoveryEvent", "RecoveryLog", "HealEvent", "RoundClock", "ROUND_PARTS"]

# The parts of one recovery round, in order (detection happens once, before the first round).
ROUND_PARTS = ("agreement", "rebuild", "rebind", "first_collective")


class RoundClock:
    """Times every round of one recovery, the failed ones included, so no second goes unattributed.

    ``start()`` opens a round, ``mark()`` ends each part in ROUND_PARTS order, ``close()`` records the
    round; a round that failed midway is charged up to its failure to the part it was in. Rounds are
    back to back: the first starts at ``t0`` (when the fault was caught: the abort and FSDP reset
    before the first round belong to its agreement), each later one where the previous one ended (the
    abort between rounds), so the rounds cover caught -> ready without a gap.
    """

    def __init__(self, t0: float | None = None) -> None:
        self.rounds: list[dict[str, float]] = []
        self._marks: list[float] | None = None
        self._end = t0  # where the next round starts (None: when start() is called)

    def start(self) -> None:
        self.close()
        self._marks = [self._end if self._end is not None else time.time()]

    def mark(self) -> None:
        if self._marks is not None:
            self._marks.append(time.time())

    def close(self) -> None:
        if self._marks is None:
            return
        marks, self._marks = self._marks, None
        end = self._end = time.time()
        parts: dict[str, float] = {}
        for i, name in enumerate(ROUND_PARTS):
            if i + 1 < len(marks):
                parts[name] = marks[i + 1] - marks[i]
            elif i + 1 == len(marks):
                parts[name] = end - marks[i]
            else:
                parts[name] = 0.0
        self.rounds.append(parts)

    def total(self, part: str) -> float:
        return sum(r[part] for r in self.rounds)


@dataclass
class RecoveryEvent:
    step: int  # the step this rank was attempting when the fault hit
    generation: int  # the data-plane generation the recovery built
    phase: str  # consensus.Phase value of this rank when the fault hit
    fault: dict[str, str]  # {"type": ..., "message": ...} of this rank's fault
    ranks: list[int]  # ranks that reported a fault in this round (all of them: every rank sees one)
    decision: dict[str, Any]  # {"action": "retry"|"roll_forward", "step", "apply_on", "resume_step"}
    t_detected: float  # time.time() when this rank caught the fault
    # caught minus the earliest fault injection any rank of the round reported (when accelpact.testing
    # recorded one; see detection_from), else minus this rank's attempt start
    detection_s: float
    agreement_s: float  # reset + report exchange + decision
    rebuild_s: float  # new process group(s) on the never-used store prefix
    rebind_s: float  # swapping every cached reference
    first_collective_s: float  # the first all-reduce on the new generation
    total_s: float  # caught -> ready to continue (excludes detection)
    rounds: int = 1  # >1 when faults hit during recovery (nested)
    retire_s: float = 0.0  # dropping the old group (its C++ destructor), after the step continued
    reports: list[dict[str, Any]] = field(default_factory=list)
    # How this rank learnt of the fault: "exception" (its own collective raised), later "watchdog" or
    # "interrupt" (a peer's recovery round reached it while it computed).
    detected_by: str = "exception"
    # Every round's own {agreement, rebuild, rebind, first_collective} seconds, failed rounds included;
    # agreement_s ... first_collective_s above are their sums.
    round_times: list[dict[str, float]] = field(default_factory=list)
    # What detection_s counts from: "injection" (the earliest injection reported in the round, on
    # any rank; all ranks share a wall clock on one host) or "attempt_start" (nothing was injected).
    detection_from: str = "attempt_start"
    # Which data-plane path the last round took and why: {"path": "reconfigure" | "rebuild", "why": ...}
    # (accelpact/backends/reconfigure.py). On "reconfigure" the groups are the same objects, rebind_s ~0.
    data_plane: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class HealEvent:
    """What one heal after a lost rank did, as seen by one rank (survivor or replacement).

    Times are wall-clock seconds. A survivor counts from when it caught the fault that revealed the loss
    (``t_detected``); a replacement from its process launch (``t_launch``, when the launcher gave it).
    ``replacement_start_s``: survivor: caught -> every replacement arrived on the control channel;
    replacement: launch -> arrived (the Python + torch start and the control connection).
    ``heal_transfer_s``: the rest up to the first collective: the new generation's rendezvous with the
    replacement, its model build (survivors wait for it), the exchange of heal reports and the load of
    the resume step's state (own snapshot slot, buddy replica, or nothing for a survivor at that step).
    """

    role: str  # "survivor" | "replacement"
    lost_ranks: list[int]
    step: int  # the step this rank was attempting (survivor) / -1 (replacement)
    resume_step: int  # the step every rank runs next
    replayed_steps: int  # committed steps this rank runs again (survivors that committed past S)
    source: str  # where the lost rank(s) were healed from: "own" | "buddy" (| "live" when nothing was lost)
    own_source: str  # where THIS rank's state of S came from: "live" | "own" | "buddy"
    generation: int
    replacement_start_s: float
    heal_transfer_s: float
    total_s: float
    t: float  # when the heal ended (first collective done)
    t_detected: float
    rounds: int = 1  # >1 when a replacement was lost during its heal
    load_s: float = 0.0  # of heal_transfer_s: loading the resume step (restore or fetch + restore)
    bytes_read_from_disk: int = 0  # always 0: a heal never reads a checkpoint file
    # Survivor: each replacement lost on its way in (rank, pid, stage, reason, t_seen, seen_after_s: from
    # the launcher's death notice to this rank reading it); each cost one more wait for the next one.
    replacements_lost: list[dict[str, Any]] = field(default_factory=list)
    # Which data-plane path the heal's rendezvous took and why (as RecoveryEvent.data_plane).
    data_plane: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class RecoveryLog(list[Any]):
    """``guard.events``: the newest ``keep`` RecoveryEvents, oldest first, and how many there were.

    A list, so that reading it is unchanged; bounded, because a week-long job recovers thousands of
    times and each event (every rank's report included) is a few KB of Python heap that nothing reads
    again once a consumer has forwarded it. Forward new events with :meth:`since` and :attr:`total`,
    not with ``len()``: the length stops growing at ``keep``.
    """

    def __init__(self, keep: int = 256) -> None:
        super().__init__()
        if keep < 1:
            raise ValueError(f"RecoveryLog(keep={keep}): keep at least the newest event")
        self.keep = keep
        self.total = 0  # events ever appended (dropped ones included)

    def append(self, event: RecoveryEvent) -> None:
        super().append(event)
        self.total += 1
        if len(self) > self.keep:
            del self[: len(self) - self.keep]

    def since(self, seen: int) -> list[RecoveryEvent]:
        """The events after the first ``seen`` ever appended (those still kept: at most ``keep``)."""
        new = self.total - seen
        return list(self[-new:]) if new > 0 else []
