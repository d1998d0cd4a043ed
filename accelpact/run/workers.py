"""The rank processes of one attempt: started in their own sessions, reaped, announced dead, replaced, stopped.

This is the one implementation of what a launcher does with its rank processes, shared by both launchers:

- ``accelpact.run``'s agent (accelpact.run.agent) runs a user's torchrun-style script, one agent per node;
- the harness's parent (harness.parent.launcher) runs ``harness.rank.worker`` and adds what a benchmark
  needs on top: parent-side faults, network-namespace hosts, and each strategy's relaunch policy.

What each adds is policy (which death gets a replacement, when the whole group restarts); what they share
is here:

- :func:`spawn`: a rank process in its own session (``killpg`` reaches whatever it starts), output to its log;
- :class:`Workers`: the processes of one attempt by rank, with the dead ones a replacement took over
  from and the idle hot spares; :meth:`Workers.reap` finds the ranks that failed since the last call and
  writes each one's death notice (:class:`Notices`) with the pid that died, once per process, so the
  survivors stop waiting for it within a poll; :meth:`Workers.stop` tears everything down;
- :func:`start_replacement`: the order a replacement is started in: an idle hot spare, else a fork of the
  preloaded template, else a fresh process (the template's reason is kept when it could not fork).

A process here is a ``subprocess.Popen`` or an ``accelpact.run.template.ForkedRank`` (a template's child,
whose exit comes back over the template's pipe): anything with ``pid``, ``poll()`` and ``wait()``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "describe_exit",
    "killpg",
    "spawn",
    "Notices",
    "Workers",
    "start_replacement",
    "TERM_GRACE_S",
    "HOT_SPARE",
    "TEMPLATE",
    "SPAWN",
]

# After SIGTERM, how long a rank may take to exit before SIGKILL (an accelpact rank writes its events first).
TERM_GRACE_S = 5.0
# How a replacement started (the launchers' events and the harness's results use these names).
HOT_SPARE, TEMPLATE, SPAWN = "hot_spare", "template", "spawn"


def describe_exit(code: int) -> str:
    """An exit code as people read it: ``-9 (SIGKILL)`` for a signal, the number otherwise."""
    if code < 0:
        try:
            return f"{code} ({signal.Signals(-code).name})"
        except ValueError:
            return str(code)
    return str(code)


def killpg(pgid: int, sig: int) -> None:
    """Signal a process group that may be gone already (a rank's session ends with it)."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def spawn(
    argv: Sequence[str], env: dict[str, str], log: Path | None, cwd: str | None = None
) -> subprocess.Popen[bytes]:
    """One rank process in its own session, stdin closed, stdout and stderr appended to ``log``
    (None: the launcher's own)."""
    out = open(log, "ab") if log is not None else None
    try:
        return subprocess.Popen(
            list(argv),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT if out is not None else None,
            start_new_session=True,
            cwd=cwd,
        )
    finally:
        if out is not None:
            out.close()  # the child holds its own descriptor


@dataclass
class Notices:
    """Where a launcher tells the survivors about deaths: a store's ``set``, the job token, and who tells.

    ``set`` is a callable rather than a store: the harness sets keys on a store hosted in another network
    namespace through a client of its own."""

    set: Callable[[str, bytes], None]
    token: str
    by: str

    def death(self, rank: int, code: int, pid: int) -> str | None:
        """Write ``rank``'s death notice naming ``pid``; the error when it could not be written (best effort:
        without it the survivors still find out by heartbeat or at their deadline)."""
        from accelpact.detection.liveness import publish_death

        try:
            publish_death(
                self,
                self.token,
                rank,
                by=self.by,
                reason=f"rank {rank} exited with code {describe_exit(code)}",
                pid=pid,
            )
        except Exception as exc:  # noqa: BLE001 - a notice is an accelerator, never a new failure
            return f"could not write the death notice of rank {rank}: {exc}"
        return None

    def no_replacement(self, rank: int, pid: int, reason: str) -> str | None:
        """Tell the survivors waiting to heal ``rank`` that no replacement comes, and why; the error when
        that could not be written (they then stop at their own replacement timeout)."""
        from accelpact.recovery.heal_wait import publish_no_replacement

        try:
            publish_no_replacement(self, self.token, rank, pid=pid, reason=reason)
        except Exception as exc:  # noqa: BLE001 - survivors still stop at their own timeout
            return f"could not tell the survivors that rank {rank} gets no replacement: {exc}"
        return None


@dataclass
class Workers:
    """The rank processes of one attempt (on one node, or one harness run), by global rank."""

    notices: Notices | None = None  # None: no store to tell (deaths are only reaped)
    procs: dict[int, Any] = field(default_factory=dict)
    retired: list[Any] = field(default_factory=list)  # dead processes a replacement took over from
    spares: list[Any] = field(default_factory=list)  # idle hot spares, stopped with the ranks
    noticed: set[int] = field(default_factory=set)  # ranks whose current process was reaped as failed
    say: Callable[[str], None] = field(default=lambda msg: print(msg, file=sys.stderr, flush=True))

    def poll(self) -> tuple[list[int], dict[int, int]]:
        """(ranks running, rank -> exit code of those that exited)."""
        running, exited = [], {}
        for rank, proc in self.procs.items():
            code = proc.poll()
            if code is None:
                running.append(rank)
            else:
                exited[rank] = code
        return running, exited

    def reap(self, exited: dict[int, int] | None = None) -> dict[int, int]:
        """The ranks whose current process failed since the last call (rank -> exit code), each with its
        death notice written once. ``exited``: a :meth:`poll` the caller just made, so both see the same exits."""
        if exited is None:
            _, exited = self.poll()
        new = {r: c for r, c in sorted(exited.items()) if c != 0 and r not in self.noticed}
        for rank, code in new.items():
            self.noticed.add(rank)
            if self.notices is not None:
                err = self.notices.death(rank, code, self.procs[rank].pid)
                if err is not None:
                    self.say(err)
        return new

    def replace(self, rank: int, proc: Any) -> Any:
        """``proc`` is ``rank``'s process now; the dead one is kept to be reaped at the end. Returns it."""
        self.retired.append(self.procs[rank])
        self.procs[rank] = proc
        self.noticed.discard(rank)  # its replacement's own death must be noticed again
        return proc

    def codes(self) -> dict[int, int | None]:
        return {r: p.poll() for r, p in self.procs.items()}

    def signal(self, rank: int, sig: int) -> None:
        """``sig`` to ``rank``'s process group, if it still runs (parent-side faults: SIGSTOP, SIGKILL)."""
        proc = self.procs[rank]
        if proc.poll() is None:
            os.killpg(proc.pid, sig)

    def stop(self, grace_s: float = TERM_GRACE_S) -> None:
        """SIGTERM every live process group (ranks, spares), SIGKILL what is left after ``grace_s``; reap all.

        Also the groups of processes that exited: their children (if any) must not outlive them."""
        everything = [*self.procs.values(), *self.retired, *self.spares]
        live = [p for p in everything if p.poll() is None]
        for p in live:
            killpg(p.pid, signal.SIGCONT)  # a SIGSTOPped rank cannot act on SIGTERM
            killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for p in live:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for p in everything:
            killpg(p.pid, signal.SIGKILL)
            p.wait()
        self.retired, self.spares = [], []


def start_replacement(
    rank: int,
    spare: Callable[[], Any],
    fork: Callable[[], Any] | None,
    spawn_one: Callable[[], Any],
    say: Callable[[str], None],
) -> tuple[Any, str, str]:
    """A process for dead ``rank``: an idle hot spare (``spare()``; None when none is left), else a fork of the
    preloaded template (``fork()``; None: no template), else a fresh process (``spawn_one()``).

    Returns (the process, how: HOT_SPARE | TEMPLATE | SPAWN, why the template was not used: '' when it was,
    or when there was none). A template that cannot fork (not ready, exited, more than one thread, no
    answer) raises ``TemplateUnavailable``; that is said, and a process is spawned."""
    from accelpact.run.template import TemplateUnavailable

    proc = spare()
    if proc is not None:
        return proc, HOT_SPARE, ""
    why = ""
    if fork is not None:
        try:
            return fork(), TEMPLATE, ""
        except TemplateUnavailable as exc:
            why = str(exc)
            say(f"replacement template unusable ({why}): spawning a fresh process for rank {rank}")
    return spawn_one(), SPAWN, why
