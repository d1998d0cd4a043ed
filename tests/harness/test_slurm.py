"""cluster=slurm: what a run learns from Slurm's environment, and a real run through sbatch.

- pure (everywhere): node-list expansion, a task's rank from SLURM_PROCID / SLURM_NTASKS /
  SLURM_LOCALID, master_addr=auto -> the allocation's first node, the srun step's shape, the config errors;
- ``slurm`` (a running Slurm, e.g. after ``make slurm-up``): ``python -m harness -m
  hydra/launcher=submitit_slurm cluster=slurm ...`` goes through a real ``sbatch``, its ranks through
  ``srun``, and its row lands in the index; with a socket reset, recovered in memory and bit-identical to
  the sweep's fault-free reference.
"""

from __future__ import annotations

import csv
import dataclasses
import shutil
import subprocess
import sys

import pytest
from harness_test_helpers import TINY, harness_env

from harness.app.validate import ConfigError, check_values
from harness.contract import RankEnv
from harness.schema import ClusterConfig, Device, RankLaunch, RunConfig
from harness.slurm_env import SlurmEnvError, parse_nodelist, rank_identity, resolve_cluster, srun_argv

SLURM = ClusterConfig(
    name="slurm", backend="gloo", device=Device.cpu, world_size=4, nodes=2, launch=RankLaunch.srun, master_addr="auto"
)


def test_node_lists_expand_as_slurm_writes_them():
    assert parse_nodelist("vm") == ["vm"]
    assert parse_nodelist("node[01-03,07],gpu5") == ["node01", "node02", "node03", "node07", "gpu5"]
    assert parse_nodelist("a[8-10]b,c") == ["a8b", "a9b", "a10b", "c"]


def test_a_task_takes_rank_world_size_and_local_rank_from_slurm():
    task = {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1"}
    assert rank_identity(task) == (3, 4, 1)
    assert rank_identity({}) is None
    env = RankEnv.from_environ({**task, "ACCELPACT_CONTROL_ADDR": "node01:29500", "ACCELPACT_JOB_TOKEN": "t"})
    assert (env.rank, env.world_size, env.local_rank, env.control_host) == (3, 4, 1, "node01")
    # The parent's own numbering wins where it gave one (every launcher but srun).
    assert (
        RankEnv.from_environ(
            {**task, "RANK": "0", "WORLD_SIZE": "2", "ACCELPACT_CONTROL_ADDR": "h:1", "ACCELPACT_JOB_TOKEN": "t"}
        ).rank
        == 0
    )


def test_master_addr_is_the_allocations_first_node(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None if name == "scontrol" else f"/usr/bin/{name}")
    job = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "cn[004-005]"}
    assert resolve_cluster(SLURM, job).master_addr == "cn004"
    assert resolve_cluster(dataclasses.replace(SLURM, master_addr="10.1.2.3"), job).master_addr == "10.1.2.3"
    with pytest.raises(SlurmEnvError, match="cluster.nodes=2 but the allocation .* has 1 node.*hydra.launcher.nodes=2"):
        resolve_cluster(SLURM, {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "cn004"})


def test_one_srun_step_spreads_the_ranks_over_the_nodes(tmp_path):
    argv = srun_argv(SLURM, ["python", "-m", "harness.rank.worker", "spec.json"], tmp_path)
    assert argv[0] == "srun" and argv[-4:] == ["python", "-m", "harness.rank.worker", "spec.json"]
    assert {"--nodes=2", "--ntasks=4", "--ntasks-per-node=2", "--kill-on-bad-exit=0"} <= set(argv)
    assert f"--output={tmp_path}/rank%t.log" in argv


def test_nodes_must_divide_the_world_size_and_need_srun():
    run = RunConfig()
    with pytest.raises(ConfigError, match="cluster.nodes=3 must .* divide cluster.world_size=4"):
        check_values(dataclasses.replace(run, cluster=dataclasses.replace(SLURM, nodes=3)))
    with pytest.raises(ConfigError, match="only cluster.launch=srun .* try `cluster=slurm`"):
        check_values(dataclasses.replace(run, cluster=dataclasses.replace(SLURM, launch=RankLaunch.local)))


# ---- a real Slurm ---------------------------------------------------------------------------------------
def _slurm_state() -> tuple[bool, str]:
    for tool in ("sbatch", "srun", "sinfo"):
        if shutil.which(tool) is None:
            return (
                False,
                f"Slurm is not installed here ({tool} not on PATH); `make slurm-up` installs and starts it (root)",
            )
    done = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=30)
    if done.returncode != 0 or not any(s.startswith(("idle", "mixed")) for s in done.stdout.split()):
        return (
            False,
            f"no Slurm controller with an idle node answers ({done.stderr.strip() or done.stdout.strip()}); `make slurm-up`",
        )
    try:
        import hydra_plugins.hydra_submitit_launcher  # noqa: F401  (the launcher plugin must be importable)
    except ImportError:
        return False, "hydra-submitit-launcher is not installed: `pip install -e '.[slurm]'` (make slurm-up does)"
    nodes = subprocess.run(["sinfo", "-h", "-o", "%N"], capture_output=True, text=True, timeout=30).stdout
    if "slurm-n" in nodes:
        # Known, not fixed: scripts/slurm.sh's multi-node cluster puts each node in a network namespace, and
        # this run's comparison reference is started by the submitting process (root namespace) through
        # srun onto a node namespace, where the parent's control store does not answer: its ranks waited
        # until the test's 700 s timeout (seen in a clean-clone CI run).
        return False, (
            "the Slurm here is scripts/slurm.sh's multi-node namespace cluster, where the submitting "
            "process's reference run cannot reach its control store; `SLURM_NODES=1 make slurm-up` "
            "for this test"
        )
    return True, ""


_UP, _WHY = _slurm_state()


@pytest.fixture
def cancel_jobs(tmp_path):
    """scancel this test's jobs (submitit's folder is named by job id) if the test ends before they do."""
    yield
    ids = [d.name for d in (tmp_path / "sweep" / ".submitit").glob("*") if d.name.isdigit()]
    if ids:
        subprocess.run(["scancel", *ids], capture_output=True, timeout=30)


@pytest.mark.slurm
@pytest.mark.timeout(700)  # a queued job, a reference through srun and the job itself: ~100 s here
@pytest.mark.skipif(not _UP, reason=_WHY)
def test_a_two_rank_run_through_sbatch_writes_its_row(tmp_path, cancel_jobs):
    from harness.identity import compare_runs

    sweep = tmp_path / "sweep"
    # `-m` goes first: Hydra's parser takes one run of overrides after its flags.
    argv = [
        sys.executable,
        "-m",
        "harness",
        "-m",
        f"index_path={tmp_path / 'index.csv'}",
        "hydra/launcher=submitit_slurm",
        *TINY,
        "train.steps=8",
        "cluster=slurm",
        "cluster.backend=gloo",
        "cluster.device=cpu",
        "cluster.world_size=2",
        "cluster.nodes=1",
        "strategy=accelpact",
        "fault=socket_reset",
        "fault.ranks=[1]",
        "fault.at_step=4",
        f"hydra.sweep.dir={sweep}",
        "hydra.launcher.cpus_per_task=2",
        "hydra.launcher.timeout_min=10",
    ]
    done = subprocess.run(argv, cwd=tmp_path, env=harness_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    jobs = list((sweep / ".submitit").glob("*/*_submission.sh"))
    assert jobs, f"no sbatch submission under {sweep / '.submitit'}"
    with open(tmp_path / "index.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    [row] = [r for r in rows if r["fault"] == "socket_reset"]
    assert row["status"] == "ok" and row["cluster"] == "slurm" and row["world_size"] == "2", row["reason"]
    assert int(row["recoveries"]) >= 1, row
    # The job ran in another process (on another node, on a real cluster): the sweep's comparison table,
    # written at the end by the submitting process, is where it meets the reference.
    with open(sweep / "table.csv", newline="") as f:
        [compared] = [r for r in csv.DictReader(f) if r["strategy"] == "accelpact"]
    assert compared["bit_identical"] in ("yes", "True"), compared
    # The ranks were srun tasks: their logs come from srun's --output, one per task id.
    run_dir = sweep / "0"
    assert (run_dir / "logs" / "rank0.log").exists() and (run_dir / "logs" / "rank1.log").exists()
    result = compare_runs(sweep / "reference", run_dir)
    assert result.equal, result.describe()


def test_without_srun_the_run_is_refused_in_one_line(monkeypatch):
    from harness.app import capabilities

    monkeypatch.setattr(shutil, "which", lambda name: None)
    run = dataclasses.replace(RunConfig(), cluster=dataclasses.replace(SLURM, nodes=1))
    with pytest.raises(ConfigError, match="srun, which is not on PATH here.*make slurm-up"):
        capabilities.check_runnable(run)
    with pytest.raises(SlurmEnvError, match="srun, which is not on PATH"):
        resolve_cluster(SLURM, {})
