"""``cluster=slurm`` with 2 nodes on the multi-node Slurm of ``scripts/slurm.sh up``: one rank per node.

``sbatch -N2`` runs the harness parent on the allocation's first node (a network-namespace host); its
ranks are one ``srun`` step over both nodes, gloo on the data network (``GLOO_SOCKET_IFNAME=eth0``), the
control store on node 0's control address (``master_addr=auto``: the first node's name, which
/etc/hosts maps to it). A socket reset on rank 1 is recovered in memory and the final state is
bit-identical to a fault-free run of the same shape, submitted at the same time. No hydra-submitit:
``sbatch --wrap`` runs ``python -m harness`` directly. Skips unless Slurm answers with 2 idle nodes.
"""

from __future__ import annotations

import csv
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from harness_test_helpers import TINY, harness_env

ROOT = Path(__file__).resolve().parents[2]


def _two_nodes() -> tuple[bool, str]:
    if shutil.which("sbatch") is None or shutil.which("sinfo") is None:
        return False, "Slurm is not installed here; `scripts/slurm.sh up` (root) installs and starts it"
    done = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True, timeout=30)
    idle = [ln for ln in done.stdout.splitlines() if ln.split()[-1:] and ln.split()[-1].startswith(("idle", "mixed"))]
    if len(idle) < 2:
        return False, f"needs a Slurm with 2 idle nodes (`scripts/slurm.sh up`); sinfo says {done.stdout.strip()!r}"
    return True, ""


_UP, _WHY = _two_nodes()


def sbatch(name: str, tmp: Path, overrides: list[str]) -> subprocess.Popen:
    run_dir = tmp / name
    argv = [
        sys.executable,
        "-m",
        "harness",
        f"index_path={tmp / 'index.csv'}",
        *TINY,
        "train.steps=8",
        "cluster=slurm",
        "cluster.backend=gloo",
        "cluster.device=cpu",
        "cluster.world_size=2",
        "cluster.nodes=2",
        "strategy=accelpact",
        *overrides,
        f"hydra.run.dir={run_dir}",
    ]
    env = dict(harness_env(), GLOO_SOCKET_IFNAME="eth0")
    cmd = [
        "sbatch",
        "--wait",
        "-N2",
        "--ntasks-per-node=1",
        f"--job-name=ap-{name}",
        f"--output={tmp / name}.out",
        "--wrap",
        " ".join(argv),
    ]
    return subprocess.Popen(cmd, cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.skipif(not _UP, reason=_WHY)
def test_a_two_node_run_recovers_a_reset_bit_identically(tmp_path):
    from harness.identity import compare_runs

    jobs = {
        "ref": sbatch("ref", tmp_path, ["fault=none"]),
        "reset": sbatch("reset", tmp_path, ["fault=socket_reset", "fault.ranks=[1]", "fault.at_step=4"]),
    }
    for name, p in jobs.items():
        out, _ = p.communicate(timeout=850)
        log = (tmp_path / f"{name}.out").read_text() if (tmp_path / f"{name}.out").exists() else ""
        assert p.returncode == 0, f"sbatch {name}: {out}\n{log[-3000:]}"
    with open(tmp_path / "index.csv", newline="") as f:
        rows = {r["fault"]: r for r in csv.DictReader(f)}
    row = rows["socket_reset"]
    assert row["status"] == "ok" and row["cluster"] == "slurm" and row["relaunches"] == "0", row["reason"]
    assert int(row["recoveries"]) >= 1, row  # recovered in memory, not relaunched
    result = compare_runs(tmp_path / "ref", tmp_path / "reset")
    assert result.equal, result.describe()
