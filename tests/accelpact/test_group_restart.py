"""A group restart resumes where the agent says it does, or says why not (examples/heal_loop.py, accelpact-run).

Three jobs at once, 2 ranks each: a fault-free reference; a job whose rank 1 is SIGKILLed in step 3 with
``--replacement none --max-restarts 1`` (no heal: the agent restarts the whole group, which must restore the
newest snapshot every rank holds and end bit-identical to the reference); and the same job whose killed
rank first deletes the job's snapshots (``--lose-snapshots``): the restarted group must raise
``NoSnapshotToResumeError`` instead of training again from step 0. The pure rule of the token:
test_snapshot_token_unit.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
STEPS = 6


def _launch(name: str, tmp: Path, agent_args: list[str], script_args: list[str]) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    for var in ("ACCELPACT_CONTROL_ADDR", "ACCELPACT_JOB_TOKEN", "ACCELPACT_SNAPSHOT_TOKEN"):
        env.pop(var, None)
    run = tmp / name
    run.mkdir()
    cmd = [
        sys.executable,
        "-m",
        "accelpact.run",
        "--nproc-per-node",
        "2",
        "--rdzv-id",
        f"gr{os.getpid()}{name}",
        "--log-dir",
        str(run / "logs"),
        "--snapshot-root",
        str(run / "shm"),
        *agent_args,
        str(ROOT / "examples" / "heal_loop.py"),
        "--steps",
        str(STEPS),
        "--every",
        "2",
        "--out",
        str(run / "out"),
        *script_args,
    ]
    return subprocess.Popen(cmd, stdout=(run / "agent.log").open("w"), stderr=subprocess.STDOUT, env=env, cwd=ROOT)


def _results(run: Path, rank: int) -> list[dict]:
    lines = (run / "logs" / f"rank{rank}.log").read_text().splitlines()
    return [json.loads(line.split("RESULT ", 1)[1]) for line in lines if line.startswith("RESULT ")]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("group_restart")
    restart = ["--replacement", "none", "--max-restarts", "1"]
    kill = ["--kill-in", "step", "--kill-at", "3"]
    jobs = {"ref": ([], []), "restart": (restart, kill), "lost": (restart, [*kill, "--lose-snapshots"])}
    procs = {n: _launch(n, tmp, a, s) for n, (a, s) in jobs.items()}
    for name, p in procs.items():
        p.wait(timeout=800)
        (tmp / name / "rc").write_text(str(p.returncode))
    return tmp


def test_the_restarted_group_resumes_from_the_newest_snapshot_every_rank_holds(runs):
    run = runs / "restart"
    agent = (run / "agent.log").read_text()
    assert (run / "rc").read_text() == "0", agent[-3000:]
    assert "restarting the whole worker group as attempt 1" in agent
    got = {rank: _results(run, rank) for rank in (0, 1)}
    assert all(len(r) == 1 for r in got.values()), got  # the first attempt's ranks never finished
    restored = {rank: r[0]["restored"] for rank, r in got.items()}
    # Killed in step 3: step 2 was committed everywhere; its snapshot may not have completed on the rank
    # that died mid-step, so the newest step every rank holds is 2 or 1, the same on both, as they report it.
    held = got[0][0]["held"]
    newest = max(set.intersection(*(set(s) for s in held.values())))
    assert restored == {0: newest, 1: newest} and newest in (1, 2), (restored, held)
    for rank, [r] in got.items():
        assert r["restart"] == 1 and r["first_step"] == newest + 1
        assert sorted(map(int, r["losses"])) == list(range(newest + 1, STEPS))
        want = _results(runs / "ref", rank)[0]["losses"]
        assert all(r["losses"][s] == want[s] for s in r["losses"]), rank
        a = torch.load(runs / "ref" / "out" / f"rank{rank}.pt", weights_only=True)["state"]
        b = torch.load(run / "out" / f"rank{rank}.pt", weights_only=True)["state"]
        assert all(torch.equal(a[k], b[k]) for k in a), f"rank {rank} differs from the fault-free run"


def test_a_restarted_group_with_no_snapshot_raises_the_named_error_instead_of_starting_over(runs):
    run = runs / "lost"
    assert (run / "rc").read_text() == "1"
    for rank in (0, 1):
        log = (run / "logs" / f"rank{rank}.log").read_text()
        assert "NoSnapshotToResumeError" in log and "restart 1 was to resume" in log, log[-3000:]
        assert not _results(run, rank)  # nothing trained to the end, from step 0 or elsewhere
