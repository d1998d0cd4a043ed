"""The ``kill_all`` fault: the whole job dies at once (a software bug, a fatal collective error, an operator's
kill of the job).

When the fault's rank reaches the scheduled (step, phase), the parent:

1. records the ``fault`` event, naming every rank it kills (``killed_ranks``);
2. SIGKILLs every rank (their process groups) in one pass;
3. waits until every one of them has exited, so that the parent's next poll sees the whole job dead: a
   strategy that heals a lost rank in memory must not start a replacement for a rank whose peers are
   merely still dying (there is no survivor to heal it with).

Nothing else is touched: each host's shared memory (its snapshot root) and the disk checkpoints outlive
the processes, as they do on a real machine (tests can make the parent delete some ranks' snapshots too:
``HARNESS_KILL_ALL_LOSE_SNAPSHOTS``, so that no complete, agreeing set survives). What follows is the strategy's relaunch policy: every rank
starts again; AccelPact with snapshots resumes from the newest snapshot every rank holds, the others from
the newest checkpoint (docs/process_loss.md, "A whole-job crash"). No rank is acked: they are dead.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

from harness.faults.snapshot_roots import DEFAULT_BASE, ROOT_ENV

__all__ = ["apply_kill_all", "ALL_DEAD_WITHIN_S", "LOSE_SNAPSHOTS"]

# A SIGKILLed process is gone within milliseconds; a loaded host may take longer to reap it.
ALL_DEAD_WITHIN_S = 10.0
# Fault injection for tests: a comma list of ranks whose snapshots the parent deletes once every rank is
# dead. "R": rank R's own slots and the replica its buddy held, so that the relaunch finds no complete,
# agreeing set of snapshots and must restore the checkpoint from disk; "R:own": its own slots only (what a
# lost host's shared memory takes), so that R resumes from its buddy's replica.
LOSE_SNAPSHOTS = "HARNESS_KILL_ALL_LOSE_SNAPSHOTS"


def apply_kill_all(driver: Any, req: dict) -> None:
    launcher = driver.launcher
    ranks = sorted(launcher.procs)
    lose = [item.strip() for item in os.environ.get(LOSE_SNAPSHOTS, "").split(",") if item.strip()]
    driver.record(req, killed_ranks=ranks, **({"lost_snapshots": lose} if lose else {}))
    for rank in ranks:
        driver.signal(rank, signal.SIGKILL)
    deadline = time.monotonic() + ALL_DEAD_WITHIN_S
    while time.monotonic() < deadline and any(launcher.procs[r].poll() is None for r in ranks):
        time.sleep(0.005)
    if lose:
        _lose_snapshots(launcher, ranks, lose)


def _lose_snapshots(launcher: Any, ranks: list[int], lose: list[str]) -> None:
    """Delete the snapshots ``lose`` names (``LOSE_SNAPSHOTS``) under the run's snapshot token, on every host
    root of the run."""
    roots = {launcher.rank_environ(r, launcher.incarnation, 0.0).get(ROOT_ENV) or DEFAULT_BASE for r in ranks}
    for root in roots:
        job = Path(root) / launcher.snapshot_token
        for item in lose:
            rank, _, only = item.partition(":")
            shutil.rmtree(job / f"rank{int(rank)}", ignore_errors=True)
            if only != "own":
                shutil.rmtree(job / "replica" / f"rank{int(rank)}", ignore_errors=True)
