"""A completed job never fails: 30 healed jobs under ``accelpact-run``, every one exits 0, nothing left in shm.

examples/heal_loop.py (the docs' loop) on 2 ranks; rank 1 is SIGKILLed in the checkpoint save (``guard.run``)
or in ``guard.finish`` of each job, and healed. In every third job the survivor, rank 0, also aborts at
interpreter exit after it ended the run (SIGABRT, as a C++ thread alive at exit did before
accelpact.shutdown): the agent must report that exit, not replace the rank. Every job must exit 0, with
one replacement only, no group restart, and no snapshot file left under its snapshot root.

Before this, the forced aborts alone failed the test (the agent replaced the finished rank, the replacement
found nothing to heal and the job failed with its snapshots left in shared memory), and a survivor
aborted by itself at exit in about 3 of 55 healed runs. The unit tests of the same behaviour:
test_launcher_units.py (the closed mark stops a replacement) and test_shutdown.py (no abort at exit).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "heal_loop.py"
JOBS, AT_ONCE = 30, 2


def _launch(i: int, tmp: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    for var in ("ACCELPACT_CONTROL_ADDR", "ACCELPACT_JOB_TOKEN", "ACCELPACT_SNAPSHOT_TOKEN"):
        env.pop(var, None)
    place = ("save", "finish")[i % 2]
    abort = ["--abort-at-exit", "0"] if i % 3 == 0 else []
    run = tmp / f"job{i}"
    run.mkdir()
    cmd = [
        sys.executable,
        "-m",
        "accelpact.run",
        "--nproc-per-node",
        "2",
        "--rdzv-id",
        f"end{os.getpid()}x{i}",
        "--log-dir",
        str(run / "logs"),
        "--snapshot-root",
        str(run / "shm"),
        str(EXAMPLE),
        "--steps",
        "5",
        "--every",
        "2",
        "--kill-at",
        "3",
        "--kill-in",
        place,
        *abort,
    ]
    return subprocess.Popen(cmd, stdout=(run / "agent.log").open("w"), stderr=subprocess.STDOUT, env=env, cwd=ROOT)


def test_thirty_healed_jobs_with_a_kill_in_the_save_or_in_finish_all_exit_0(tmp_path):
    failed = []
    for first in range(0, JOBS, AT_ONCE):
        procs = {i: _launch(i, tmp_path) for i in range(first, min(first + AT_ONCE, JOBS))}
        for i, p in procs.items():
            code = p.wait(timeout=600)
            agent = (tmp_path / f"job{i}" / "agent.log").read_text()
            left = [str(f) for f in (tmp_path / f"job{i}" / "shm").rglob("*") if f.is_file()]
            ok = (
                code == 0
                and "replacement 1 started" in agent
                and "replacement 2" not in agent
                and "restarting the whole worker group" not in agent
                and not left
                and (i % 3 != 0 or "exited with code -6 (SIGABRT) after it ended the run" in agent)
            )
            if not ok:
                failed.append((i, code, left[:3], agent[-1500:]))
    assert not failed, f"{len(failed)} of {JOBS} jobs failed: {failed}"
