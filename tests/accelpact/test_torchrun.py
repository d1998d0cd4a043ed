"""examples/train_fsdp.py under a real ``torchrun --nproc-per-node 2``: one injected fault, recovered in
memory over torchrun's own store, and bit-identical to a fault-free torchrun run of the same script.

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


def torchrun(args: list[str], log: Path) -> subprocess.Popen:
    """Start ``torchrun --nproc-per-node 2 examples/train_fsdp.py ARGS`` with this tree's accelpact."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    for name in ("ACCELPACT_CONTROL_ADDR", "ACCELPACT_JOB_TOKEN"):  # torchrun's store, not one of ours
        env.pop(name, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(EXAMPLE), *args]
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
