"""What survivors wait for in a heal, and how a replacement lost on the way ends the wait in seconds.

A heal waits twice for a replacement process (accelpact.recovery.heal has the protocol): for its ARRIVAL
(``{token}/heal/arrived/{rank}``, with its pid) while the launcher starts it, then, after the survivors
wrote its plan, for its JOINING ack (``{token}/heal/joining/{rank}/{pid}``), written just before it enters
the new generation's rendezvous. A gloo rendezvous cannot be interrupted from Python, so the survivors
enter it only once the replacement has committed to it. Either wait ends early when the launcher's death
notice names the replacement's pid; the notice is read BEFORE the ack on every poll, so all survivors
decide alike. A launcher that will not start another replacement says so under
``{token}/heal/abandoned/{rank}`` (:func:`publish_no_replacement`), and at ``HealPolicy.max_rounds``
replacements lost in a row the survivors give up. docs/process_loss.md has the failure modes, measured.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from accelpact.control import notice_auth
from accelpact.detection.liveness import notice_key
from accelpact.errors import RankLostError

if TYPE_CHECKING:
    from accelpact.common.control_client import ControlClient

__all__ = [
    "arrived_key",
    "plan_key",
    "request_key",
    "joining_key",
    "rollcall_key",
    "closed_key",
    "abandoned_key",
    "publish_no_replacement",
    "ReplacementWatch",
]

# How often a waiting survivor reads the lost ranks' death notices (a store round trip per rank): a
# replacement's death is seen within this, far below the control deadline.
NOTICE_POLL_S = 0.1


def request_key(control: ControlClient, rank: int) -> str:
    return control.key("heal", "request", str(rank))


def arrived_key(control: ControlClient, rank: int) -> str:
    return control.key("heal", "arrived", str(rank))


def plan_key(control: ControlClient, rank: int, pid: int) -> str:
    return plan_key_of(control.job_token, rank, pid)


def plan_key_of(job_token: str, rank: int, pid: int) -> str:
    """:func:`plan_key` from the job token alone: the survivors' plan for replacement ``pid`` of ``rank``."""
    return f"{job_token}/heal/plan/{rank}/{pid}"


def joining_key(control: ControlClient, rank: int, pid: int) -> str:
    return control.key("heal", "joining", str(rank), str(pid))


def rollcall_key(control: ControlClient, generation: int, attempt: int, rank: int) -> str:
    return control.key("heal", "rollcall", str(generation), str(attempt), str(rank))


def closed_key(control: ControlClient, rank: int) -> str:
    """Written by a rank's guard at close() after finish(): the run ended there (accelpact.recovery.rejoin and
    accelpact.run's agent read it)."""
    return closed_key_of(control.job_token, rank)


def closed_key_of(job_token: str, rank: int) -> str:
    """:func:`closed_key` from the job token alone (a launcher has no control channel)."""
    return f"{job_token}/heal/closed/{rank}"


def abandoned_key(job_token: str, rank: int) -> str:
    return f"{job_token}/heal/abandoned/{rank}"


def publish_no_replacement(store: Any, job_token: str, rank: int, *, pid: int | None, reason: str) -> None:
    """Tell the survivors that no replacement will come for ``rank`` (the launcher's hook).

    ``pid``: the process of ``rank`` that died last (the one the death notice names); survivors accept
    the message only for a death they have seen, so one about an earlier process is never read.
    ``reason`` ends up in the survivors' RankLostError: say what happened and the fix.
    """
    store.set(abandoned_key(job_token, rank), json.dumps({"pid": pid, "reason": reason, "t": time.time()}).encode())


def peek(control: ControlClient, key: str) -> bytes | None:
    """The value of ``key`` now, or None (never waits)."""
    value: bytes | None = control._call(
        lambda s: s.get(key) if s.check([key]) else None, control._deadline(None), f"peek {key}"
    )
    return value


def notice_of(control: ControlClient, rank: int) -> dict[str, Any] | None:
    """The verified death notice of ``rank`` now (a dict), or None."""
    raw = peek(control, notice_key(control.job_token, rank))
    if raw is None:
        return None
    try:
        return notice_auth.verify(raw, control.job_token)
    except (notice_auth.NoticeRejected, ValueError, KeyError, TypeError):
        return None


@dataclass
class ReplacementWatch:
    """One survivor's record of the processes of each lost rank seen dead since the loss.

    The first pid a rank's notices name is the process that was lost; every later one is a replacement
    lost on its way in (``lost``: what, when seen, how long after the launcher's notice).
    """

    control: ControlClient
    rank: int  # this survivor
    max_losses: int  # replacements lost per rank before giving up (HealPolicy.max_rounds)
    poll_s: float = 0.01
    dead_pids: dict[int, list[int]] = field(default_factory=dict)
    lost: list[dict[str, Any]] = field(default_factory=list)
    _last_scan: float = 0.0

    def scan(self, ranks: set[int], stage: str, arrived: dict[int, int] | None = None) -> set[int]:
        """Read the notices of ``ranks``; the ranks whose (new) dead pid is a replacement's.

        ``arrived``: rank -> the pid whose arrival was seen. A dead pid that is not it died ``before
        arriving``, whatever ``stage`` the caller is in: a template-forked replacement arrives within
        ~0.1 s, so the next one can arrive before the wait for arrivals scanned the notices."""
        self._last_scan = time.monotonic()
        newly = set()
        for r in sorted(ranks):
            notice = notice_of(self.control, r)
            if notice is None or notice.get("pid") is None:
                continue
            pid = int(notice["pid"])
            pids = self.dead_pids.setdefault(r, [])
            if pid in pids:
                continue
            pids.append(pid)
            if len(pids) == 1:
                continue  # the process the heal is for
            now = time.time()
            where = stage if arrived is None or arrived.get(r) == pid else "before arriving"
            self.lost.append(
                {
                    "rank": r,
                    "pid": pid,
                    "stage": where,
                    "reason": str(notice.get("reason", "")),
                    "t_seen": now,
                    "seen_after_s": now - float(notice.get("t", now)),
                }
            )
            newly.add(r)
            self._check_budget(r)
        return newly

    def due(self) -> bool:
        """True once NOTICE_POLL_S has passed since the last scan."""
        return time.monotonic() - self._last_scan >= NOTICE_POLL_S

    def is_dead(self, rank: int, pid: int) -> bool:
        return pid in self.dead_pids.get(rank, ())

    def _check_budget(self, r: int) -> None:
        mine = [e for e in self.lost if e["rank"] == r]
        if len(mine) < self.max_losses:
            return
        raise RankLostError(
            f"rank {self.rank}: the replacement of lost rank {r} was itself lost {len(mine)} times in a row "
            f"(pids {[e['pid'] for e in mine]}; the last: {mine[-1]['reason'] or 'no reason given'}, "
            f"{mine[-1]['stage']}); giving up at HealPolicy.max_rounds={self.max_losses}. Find why rank {r}'s "
            "replacement dies (its log), or raise HealPolicy.max_rounds; restore from a checkpoint.",
            ranks=(r,),
            detected_by="heal",
        )

    def check_abandoned(self, ranks: set[int]) -> None:
        """RankLostError with the launcher's reason when it will start no replacement for one of ``ranks``."""
        for r in sorted(ranks):
            raw = peek(self.control, abandoned_key(self.control.job_token, r))
            if raw is None:
                continue
            try:
                msg = json.loads(raw.decode())
            except (ValueError, UnicodeDecodeError):
                continue
            if msg.get("pid") is not None and not self.is_dead(r, int(msg["pid"])):
                continue  # about a process whose death this heal has not seen (an earlier one)
            raise RankLostError(
                f"rank {self.rank}: no replacement will come for lost rank {r}: {msg.get('reason', '?')}",
                ranks=(r,),
                detected_by="heal",
            )

    def wait_joining(
        self, arrivals: dict[int, int], deadline_s: float, sleep: Callable[[float], None] = time.sleep
    ) -> set[int]:
        """Wait for every arrived replacement's joining ack; the ranks whose replacement died first.

        Empty set: every replacement took its plan (the rendezvous may start). Non-empty: do not
        enter the rendezvous; heal those ranks again with their next replacement.
        """
        deadline = time.monotonic() + deadline_s
        waiting = dict(arrivals)
        lost: set[int] = set()
        while waiting:
            self.scan(set(waiting), "after arriving, before the rendezvous", arrived=arrivals)  # notices, then acks
            for r, pid in list(waiting.items()):
                if peek(self.control, joining_key(self.control, r, pid)) is not None:
                    del waiting[r]
                elif self.is_dead(r, pid):
                    del waiting[r]
                    lost.add(r)
            if not waiting:
                break
            if time.monotonic() >= deadline:
                missing = {r: p for r, p in waiting.items()}
                raise RankLostError(
                    f"rank {self.rank}: the replacement(s) {missing} (rank: pid) arrived but did not take the heal "
                    f"plan within {deadline_s:g} s (the control deadline) and no death notice names them: hung, "
                    "or the control store is unreachable from them; restore from a checkpoint",
                    ranks=tuple(sorted(missing)),
                    detected_by="heal",
                )
            sleep(self.poll_s)
        return lost
