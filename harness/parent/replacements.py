"""Replacing a dead rank while the others live on (a strategy that heals in memory): a new process or a hot spare.

``replace_the_dead(launcher, state)``: when the strategy's ``replace_dead`` policy says so for every failed
rank, start a replacement for each: one new worker process for that rank only, under the same job token
(the death notice was written by ``Launcher.poll`` before, so the survivors tell the replacement from the
process it replaces by the pid the notice names), or an idle hot spare assigned the rank.

Hot spares: pre-started rank processes that take the rank of the first death (``strategy.hot_spares``).

A replacement process spends seconds importing torch and transformers before it can heal; a spare has
done that already and waits on the control store. When a rank dies the parent ASSIGNS a spare instead
of starting a process. The protocol is ``accelpact.run``'s (accelpact.run.spare, the same a user's hot
spare follows): the parent writes the spare's key ``{token}/spare/{i}`` with the rank's whole environment
and its log; the spare (``harness.rank.spare``) takes both and becomes a replacement of that rank
(accelpact.recovery.rejoin) at once.

Spares run on the parent's host only: a rank in a network-namespace host runs inside that host's
namespace, and a spare cannot know in advance which host will lose a rank (validation refuses
``strategy.hot_spares`` with ``cluster.hosts`` or a namespace fault).
"""

from __future__ import annotations

import os
import subprocess
import time
from typing import Any

from accelpact.run import HOT_SPARE, describe_exit, spawn
from accelpact.run import spare as spare_protocol
from accelpact.run import start_replacement as start_process
from harness.parent.template import fork_replacement

SPARE_ENV = spare_protocol.SPARE_ENV  # set (to the spare's index + 1): the worker waits for a rank before training


def spare_key(token: str, index: int) -> str:
    return f"{token}/spare/{index}"


class SparePool:
    """The spares of one incarnation: started with the ranks, assigned to dead ranks, killed with them."""

    def __init__(self, wanted: int) -> None:
        self.wanted = wanted
        self.idle: list[tuple[int, subprocess.Popen[bytes]]] = []
        self.used: list[subprocess.Popen[bytes]] = []
        self._next = 0

    def start(self, launcher: Any, incarnation: int) -> None:
        for _ in range(self.wanted):
            index = self._next
            self._next += 1
            env = launcher.rank_environ(0, incarnation, time.time())
            env.update(
                {
                    SPARE_ENV: str(index + 1),
                    spare_protocol.SPARE_KEY_ENV: spare_key(launcher.token, index),
                    "ACCELPACT_AGENT_PID": str(os.getpid()),
                }
            )  # an idle spare exits when the parent is gone
            argv = [launcher.python, "-m", "harness.rank.worker", str(launcher.spec_path)]
            self.idle.append((index, spawn(argv, env, launcher.run_dir / "logs" / f"spare{index}.log")))

    def take(self, launcher: Any, rank: int, replacement: int) -> subprocess.Popen[bytes] | None:
        """A live idle spare, now told to become ``rank`` (None when none is left)."""
        while self.idle:
            index, proc = self.idle.pop(0)
            if proc.poll() is not None:
                self.used.append(proc)
                continue
            # The rank's environment (its launch time is now) and its log: the spare's output goes there.
            value = spare_protocol.assignment(
                launcher.rank_environ(rank, launcher.incarnation, time.time(), replacement),
                str(launcher.log_path(rank)),
            )
            setter = launcher.store_setter()
            assert setter is not None, "a spare needs the control store"
            setter(spare_key(launcher.token, index), value)
            self.used.append(proc)
            return proc
        return None

    def all_procs(self) -> list[Any]:
        return [p for _, p in self.idle] + self.used

    def clear(self) -> None:
        self.idle, self.used = [], []


def replace_the_dead(launcher: Any, state: Any) -> bool:
    """Start a replacement for every failed rank the strategy heals; False when any may not be healed."""
    if launcher.replace_dead is None or not state.failed:
        return False
    codes = launcher._codes()
    if not all(launcher.replace_dead(r, c, codes) for r, c in state.failed.items()):
        for rank, code in sorted(state.failed.items()):
            _no_replacement(launcher, rank, code)
        return False
    for rank, code in sorted(state.failed.items()):
        print(
            f"  rank {rank} exited with code {describe_exit(code)}: starting a replacement "
            f"(heal in memory, replacement {launcher.replacements + 1})",
            flush=True,
        )
        start_replacement(launcher, rank, code)
    return True


def _no_replacement(launcher: Any, rank: int, code: int) -> None:
    """Tell survivors waiting to heal ``rank`` that no replacement comes, and why (once per dead process):
    they stop within a poll instead of at ``strategy.replacement_timeout_s``."""
    pid = launcher.procs[rank].pid
    notices = launcher.workers.notices
    told: set[int] = getattr(launcher, "_told_no_replacement", set())
    launcher._told_no_replacement = told
    if pid in told:
        return
    told.add(pid)
    budget = launcher.run.strategy.max_restarts
    if launcher.replacements >= budget:
        why = (
            f"the harness started {launcher.replacements} replacement(s) in this run and strategy.max_restarts="
            f"{budget} allows no more (rank {rank}'s last process, pid {pid}, exited with code "
            f"{describe_exit(code)}); raise strategy.max_restarts, or see logs/rank{rank}.log for why it dies"
        )
    else:
        why = (
            f"rank {rank} (pid {pid}) exited with code {describe_exit(code)}, and the harness replaces only a rank "
            "killed by a signal while another rank is alive and none has fallen back (a process that failed "
            f"on its own would fail again): see logs/rank{rank}.log"
        )
    err = notices.no_replacement(rank, pid, why) if notices is not None else None
    if err is not None:  # an accelerator, never a new failure (they still time out)
        print(f"launcher: {err}", flush=True)


def start_replacement(launcher: Any, rank: int, code: int) -> None:
    """A new process, or a hot spare, for dead ``rank`` only; the parent-side ``replacement`` event."""
    t_death = time.time()
    dead = launcher.procs[rank]
    launcher.replacements += 1
    n = launcher.replacements
    # A hot spare (already started and imported, it becomes the rank now), else a fork of the replacement
    # template (harness.parent.template), else a fresh process: accelpact.run.workers' order, as for users.
    proc, how, why = start_process(
        rank,
        lambda: launcher.spares.take(launcher, rank, n),
        fork_replacement(launcher, rank, n),
        lambda: launcher.spawn(rank, launcher.incarnation, time.time(), replacement=n),
        lambda msg: print(f"  {msg}", flush=True),
    )
    launcher.workers.replace(rank, proc)
    if launcher._first_failure is not None and launcher._first_failure[0] == rank:
        launcher._first_failure = None
    if launcher.on_replace is not None:
        launcher.on_replace(
            {
                "for_rank": rank,
                "exit_code": code,
                "dead_pid": dead.pid,
                "pid": launcher.procs[rank].pid,
                "hot_spare": how == HOT_SPARE,
                "start": how,
                "template_fallback": why,
                # the template's own imports, paid once at launch (None: no ready template)
                "template_import_s": (launcher.template.ready or {}).get("import_s")
                if launcher.template is not None
                else None,
                "t_death_seen": t_death,
                "t_spawn": time.time(),
                "replacement": launcher.replacements,
                "incarnation": launcher.incarnation,
            }
        )
