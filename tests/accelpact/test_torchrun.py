"""examples/train_fsdp.py under a real ``torchrun --nproc-per-node 2``: one injected fault, recovered in
memory over torchrun's own store, and bit-identical to a fault-free torchrun run of the same script.
And with ``--snapshots`` under ``--max-restarts 1``: a worker SIGKILLed mid-step, the group restarted
by torchrun, every worker restored from its shared-memory snapshot, bit-identical, no checkpoint file.

Both runs are launched at once (torchrun picks a free MASTER_PORT for each), so the test costs one
torchrun start-up, not two. Failed before this branch: the example did not exist, and under torchrun
``ControlChannel.from_env()`` raised "ACCELPACT_CONTROL_ADDR is not set".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from accelpact.testing.compare import sha256

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "train_fsdp.py"
STEPS, FAULT = 4, "2:vote:reset"


def torchrun(args: list[str], log: Path, launcher: list[str] = (), env_extra: dict | None = None) -> subprocess.Popen:
    """Start ``torchrun --nproc-per-node 2 LAUNCHER examples/train_fsdp.py ARGS`` with this tree's accelpact."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               **(env_extra or {}))
    for name in ("ACCELPACT_CONTROL_ADDR", "ACCELPACT_JOB_TOKEN"):  # torchrun's store, not one of ours
        env.pop(name, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", *launcher, str(EXAMPLE), *args]
    return subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, cwd=ROOT)


def results(log: Path) -> list[dict]:
    return sorted((json.loads(line.split("RESULT ", 1)[1]) for line in log.read_text().splitlines()
                   if line.startswith("RESULT ")), key=lambda r: r["rank"])


def test_example_under_torchrun_recovers_a_fault_bit_identically(tmp_path):
    runs = {"ref": ["--out", str(tmp_path / "ref")],
            "fault": ["--out", str(tmp_path / "fault"), "--fault", FAULT, "--fault-rank", "1"]}
    procs = {name: torchrun(["--steps", str(STEPS), *args], tmp_path / f"{name}.log") for name, args in runs.items()}
    for name, p in procs.items():
        assert p.wait(timeout=240) == 0, f"torchrun {name} failed:\n{(tmp_path / f'{name}.log').read_text()[-4000:]}"

    ref, fault = results(tmp_path / "ref.log"), results(tmp_path / "fault.log")
    assert [r["rank"] for r in fault] == [0, 1] and [r["rank"] for r in ref] == [0, 1]
    # The control channel really is torchrun's store, under torchrun's run id.
    assert all(r["token"].startswith("torchrun-") for r in ref + fault)
    assert all(r["committed_step"] == STEPS - 1 for r in ref + fault)
    assert all(r["events"] == [] for r in ref)
    assert all(len(r["events"]) == 1 and r["events"][0]["step"] == 2 for r in fault), fault

    compared = 0
    for rank in (0, 1):
        a = torch.load(tmp_path / "ref" / f"rank{rank}.pt", weights_only=True)
        b = torch.load(tmp_path / "fault" / f"rank{rank}.pt", weights_only=True)
        assert len(a["losses"]) == len(b["losses"]) == STEPS
        for i, (x, y) in enumerate(zip(a["losses"], b["losses"])):
            assert torch.equal(x, y), f"rank {rank}: loss of step {i} differs"
        assert sorted(a["state"]) == sorted(b["state"])
        for key in a["state"]:
            x, y = a["state"][key], b["state"][key]
            assert torch.equal(x, y) and sha256(x) == sha256(y), f"rank {rank}: {key} differs"
            compared += 1
    assert compared > 100  # every parameter shard and both Adam moments, not a token subset


def _compare(a_dir: Path, b_dir: Path, steps: int) -> int:
    compared = 0
    for rank in (0, 1):
        a = torch.load(a_dir / f"rank{rank}.pt", weights_only=True)
        b = torch.load(b_dir / f"rank{rank}.pt", weights_only=True)
        assert len(a["losses"]) == len(b["losses"]) == steps
        for i, (x, y) in enumerate(zip(a["losses"], b["losses"])):
            assert torch.equal(x, y), f"rank {rank}: loss of step {i} differs"
        assert sorted(a["state"]) == sorted(b["state"])
        for key in a["state"]:
            assert sha256(a["state"][key]) == sha256(b["state"][key]), f"rank {rank}: {key} differs"
            compared += 1
    return compared


SNAP_STEPS, KILL_AT = 8, 5


def test_worker_killed_under_max_restarts_resumes_from_its_snapshot_bit_identically(tmp_path):
    """Rank 1 SIGKILLs itself in the middle of step 5 (first attempt only); torchrun restarts the group;
    both workers restore the newest snapshot every rank holds (step 4) and finish."""
    shm = tmp_path / "shm"
    runs = {"ref": (["--out", str(tmp_path / "ref")], []),
            "killed": (["--out", str(tmp_path / "killed"), "--snapshots", "--kill-at", str(KILL_AT), "--fault-rank", "1"],
                       ["--max-restarts", "1"])}
    procs = {name: torchrun(["--steps", str(SNAP_STEPS), *args], tmp_path / f"{name}.log", launcher,
                            {"ACCELPACT_SNAPSHOT_ROOT": str(shm)})
             for name, (args, launcher) in runs.items()}
    for name, p in procs.items():
        assert p.wait(timeout=280) == 0, f"torchrun {name} failed:\n{(tmp_path / f'{name}.log').read_text()[-4000:]}"
    log = (tmp_path / "killed.log").read_text()
    killed = results(tmp_path / "killed.log")
    # Only the restarted attempt finished; it restored step KILL_AT - 1 from each rank's own snapshot.
    assert [r["restart"] for r in killed] == [1, 1], log[-3000:]
    assert [r["restored"]["step"] for r in killed] == [KILL_AT - 1] * 2, killed
    assert {r["restored"]["source"] for r in killed} == {"own"}
    assert all(r["committed_step"] == SNAP_STEPS - 1 for r in killed)
    assert "SIGKILL" in log or "Signals.SIGKILL" in log or "exitcode: -9" in log, log[-3000:]
    assert _compare(tmp_path / "ref", tmp_path / "killed", SNAP_STEPS) > 100
    # No checkpoint file anywhere (the script has no checkpointing: the resume came from shared memory),
    # and a clean exit left nothing in it.
    assert not [p for p in tmp_path.rglob("*") if p.suffix in (".distcp", ".metadata") or p.name == ".metadata"]
    assert not [p for p in shm.rglob("*") if p.is_file()], sorted(shm.rglob("*"))
