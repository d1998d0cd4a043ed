"""The parent's side of the replacement template (``strategy.replacement_start=template``).

``ReplacementTemplate.start(launcher)`` starts ``python -m harness.rank.template`` (harness.rank.template:
the protocol and why a fork from it is safe) next to the ranks of a run that can heal a killed rank.
``fork(...)`` asks it for one replacement process and returns a ``ForkedRank``, which the launcher keeps
in ``procs`` like the ``Popen`` of a spawned rank (``pid``, ``poll``, ``wait``): the template, not this
process, is the replacement's parent, so exit codes come back over the pipe. Anything that makes the
template unusable (not ready yet, exited, refused the fork, no answer) raises ``TemplateUnavailable``
with the reason; the caller then spawns a fresh process and records why. The pipe client itself is
``accelpact.run.template`` (shared with accelpact's launcher for users' scripts).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# The pipe client (fork requests, exit reports, readiness) is shared with accelpact.run.
from accelpact.run import (  # noqa: F401 - re-exported for the harness and its tests
    FORK_REPLY_S,
    READY_WAIT_S,
    ForkedRank,
    TemplateClient,
    TemplateUnavailable,
)


def wanted(run: Any) -> bool:
    """Start a template for this run? When a killed rank is healed by a replacement process: snapshots on,
    a planned fault (any of a trace's) that kills ranks but not all of them (after ``kill_all`` nobody is left to heal with: every rank
    is relaunched), ranks started by this parent (an srun step's ranks live on other nodes), and
    ``strategy.replacement_start=template``."""
    from harness.faults import planned
    from harness.schema import RankLaunch, ReplacementStart
    from harness.strategies.snapshot_config import snapshots_of

    st = run.strategy
    return (
        st.replacement_start == ReplacementStart.template
        and snapshots_of(st) is not None
        and any(f.kills_ranks and not f.kills_all for f in planned.specs(run))
        and run.cluster.launch == RankLaunch.local
    )


def fork_replacement(launcher: Any, rank: int, replacement: int) -> Callable[[], ForkedRank] | None:
    """How to fork a replacement for dead ``rank`` from the launcher's template (None: it has none); the
    fork raises TemplateUnavailable with the reason, and the caller spawns (accelpact.run.workers)."""
    template: ReplacementTemplate | None = launcher.template
    if template is None:
        return None

    def fork() -> ForkedRank:
        env = launcher.rank_environ(rank, launcher.incarnation, time.time(), replacement)
        netns = launcher.netns_of(rank) if launcher.netns_of is not None else None
        return template.fork(env, launcher.spec_path, launcher.log_path(rank), os.getcwd(), netns)

    return fork


class ReplacementTemplate(TemplateClient):
    """The harness's template of one run (``python -m harness.rank.template``), on accelpact.run's client."""

    @classmethod
    def start(cls, launcher: Any) -> ReplacementTemplate:
        env = launcher.rank_environ(0, launcher.incarnation, time.time())
        # numpy's OpenBLAS starts its thread pool at import unless told one thread; a template with a
        # second thread could not fork (measured: 2 threads after `import numpy` with no setting). The
        # ranks' training math is torch's, which starts its pool in the child, after the fork.
        env.setdefault("OPENBLAS_NUM_THREADS", "1")
        log = open(Path(launcher.run_dir) / "logs" / "template.log", "ab")
        try:
            proc = subprocess.Popen(
                [launcher.python, "-m", "harness.rank.template", str(launcher.spec_path)],
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                start_new_session=True,
                cwd=os.getcwd(),
            )
        finally:
            log.close()
        return cls(proc, time.time())

    def fork(  # type: ignore[override]
        self,
        env: dict[str, str],
        spec: Path,
        log: Path,
        cwd: str,
        netns: str | None,
    ) -> ForkedRank:
        """A replacement process forked from the template (raises TemplateUnavailable with the reason)."""
        return super().fork({"env": env, "spec": str(spec), "log": str(log), "cwd": cwd, "netns": netns})
