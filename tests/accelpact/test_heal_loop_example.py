"""The docs' whole loop (examples/heal_loop.py) under ``accelpact-run``: a kill in each place heals bit-identically.

Six jobs on 2 ranks, three at a time: a fault-free reference, and rank 1 SIGKILLed in a step, in the
evaluation (``guard.run``), in the checkpoint save (``guard.run``), in ``guard.finish`` and in the final
save after it. Each healed job must exit 0 with one replacement and no group restart, end with every
rank's parameter shards and optimizer tensors equal to the reference's, commit the same losses and
evaluations, leave the final checkpoint the reference wrote, and leave nothing in its snapshot root.
The faster tests of the pieces: test_guard_run.py (the region rule), test_launcher.py (the heal under the
launcher).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[2]
PLACES = ("step", "eval", "save", "finish", "final_save")


def _launch(name: str, tmp: Path, script_args: list[str]) -> subprocess.Popen:
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
        f"hl{os.getpid()}{name}",
        "--log-dir",
        str(run / "logs"),
        "--snapshot-root",
        str(run / "shm"),
        str(ROOT / "examples" / "heal_loop.py"),
        "--steps",
        "8",
        "--every",
        "4",
        "--kill-at",
        "3",
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
    tmp = tmp_path_factory.mktemp("heal_loop")
    jobs = {"ref": [], **{p: ["--kill-in", p] for p in PLACES}}
    names = list(jobs)
    for first in range(0, len(names), 3):
        procs = {n: _launch(n, tmp, jobs[n]) for n in names[first : first + 3]}
        for name, p in procs.items():
            p.wait(timeout=900)
            (tmp / name / "rc").write_text(str(p.returncode))
    return tmp


@pytest.mark.parametrize("place", PLACES)
def test_a_rank_killed_there_is_healed_bit_identically(runs, place):
    run, ref = runs / place, runs / "ref"
    agent = (run / "agent.log").read_text()
    assert (run / "rc").read_text() == "0", agent[-3000:]
    assert "replacement 1 started" in agent and "replacement 2" not in agent, agent[-3000:]
    assert "restarting the whole worker group" not in agent
    for rank in (0, 1):
        a = torch.load(ref / "out" / f"rank{rank}.pt", weights_only=True)["state"]
        b = torch.load(run / "out" / f"rank{rank}.pt", weights_only=True)["state"]
        assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a), f"rank {rank} differs"
        [want] = _results(ref, rank)
        got = _results(run, rank)[-1]  # rank 1: its replacement's
        assert got["losses"].items() <= want["losses"].items() and got["lr"] == want["lr"]
        assert got["evals"].items() <= want["evals"].items()
    assert torch.equal(
        torch.load(ref / "out" / "checkpoint_final_save.pt"), torch.load(run / "out" / "checkpoint_final_save.pt")
    )
    assert not [f for f in (run / "shm").rglob("*") if f.is_file()], "snapshots left after the job ended"
