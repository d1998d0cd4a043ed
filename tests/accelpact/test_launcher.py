"""``python -m accelpact.run`` on one node, 2 ranks, examples/train_heal.py: a SIGKILLed rank is healed in memory
(and HSDP on a 2 x 2 mesh, 4 ranks: the last test).

Seven jobs start at once (one start-up's cost): a fault-free reference, rank 1 SIGKILLed mid-step with
its replacement forked from the template, the same with a spawned replacement, the same with an idle hot
spare taking the rank (``--hot-spares 1``: accelpact.run.spare), the same with survivor 0 arriving 4 s late in the kill step (its
peer's replacement already beats), the same with a link reset inside the heal (``--reset-in-heal``), and the same with
``--replacement none --max-restarts 1`` (no heal: the whole group restarts from its snapshots). Each
healed run must end bit-identical to the reference (every parameter shard and optimizer tensor, and
every loss), with the survivor's pid unchanged, the replacement started the way asked, and no byte
read from disk. Fails without the launcher (the module does not exist), without the death notice (the
survivor waits out the heal's timeouts and the run fails or restarts), or with a replacement that does
not heal (the state differs).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from accelpact.backends import reconfigure

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "train_heal.py"
STEPS, KILL_AT = 6, 3


def launch(name: str, tmp: Path, agent_args: list[str], script_args: list[str], nproc: int = 2) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    for var in ("ACCELPACT_CONTROL_ADDR", "ACCELPACT_JOB_TOKEN", "ACCELPACT_SNAPSHOT_TOKEN"):
        env.pop(var, None)
    cmd = [
        sys.executable,
        "-m",
        "accelpact.run",
        "--nproc-per-node",
        str(nproc),
        "--rdzv-id",
        f"t{os.getpid()}{name}",
        "--log-dir",
        str(tmp / name / "logs"),
        "--snapshot-root",
        str(tmp / "shm"),
        *agent_args,
        str(EXAMPLE),
        "--steps",
        str(STEPS),
        "--out",
        str(tmp / name / "out"),
        *script_args,
    ]
    (tmp / name).mkdir(parents=True)
    return subprocess.Popen(
        cmd, stdout=(tmp / name / "agent.log").open("w"), stderr=subprocess.STDOUT, env=env, cwd=ROOT
    )


def results(run: Path, ranks: tuple[int, ...] = (0, 1)) -> dict[int, list[dict]]:
    """Every RESULT line of each rank's log, in order (a rank's log holds all its processes)."""
    out: dict[int, list[dict]] = {}
    for rank in ranks:
        lines = (run / "logs" / f"rank{rank}.log").read_text().splitlines()
        out[rank] = [json.loads(line.split("RESULT ", 1)[1]) for line in lines if line.startswith("RESULT ")]
    return out


def started_pids(run: Path) -> dict[int, int]:
    """The pids the agent started attempt 0's ranks with (its own line)."""
    m = re.search(r"attempt 0: started ranks \[0, 1\] \(pids \[(\d+), (\d+)\]\)", (run / "agent.log").read_text())
    assert m, (run / "agent.log").read_text()[-3000:]
    return {0: int(m.group(1)), 1: int(m.group(2))}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("launcher")
    kill = ["--kill-at", str(KILL_AT), "--kill-rank", "1"]
    jobs = {
        "ref": ([], []),
        "template": ([], kill),
        "spawn": (["--replacement", "spawn"], kill),
        "hot_spare": (["--hot-spares", "1"], kill),
        "late_survivor": ([], [*kill, "--late-rank", "0", "--late-s", "4"]),
        "heal_reset": ([], [*kill, "--reset-in-heal"]),
        "restart": (["--replacement", "none", "--max-restarts", "1"], kill),
    }
    procs = {n: launch(n, tmp, a, s) for n, (a, s) in jobs.items()}
    for name, p in procs.items():
        assert p.wait(timeout=800) == 0, f"{name} failed:\n{(tmp / name / 'agent.log').read_text()[-4000:]}"
    return tmp


def assert_bit_identical(ref: Path, run: Path, ranks: tuple[int, ...] = (0, 1)) -> None:
    for rank in ranks:
        a = torch.load(ref / "out" / f"rank{rank}.pt", weights_only=True)["state"]
        b = torch.load(run / "out" / f"rank{rank}.pt", weights_only=True)["state"]
        assert sorted(a) == sorted(b)
        for key in a:
            assert torch.equal(a[key], b[key]), f"rank {rank}: {key} differs from the fault-free run"
    want = {rank: results(ref, ranks)[rank][-1]["losses"] for rank in ranks}
    got: dict[int, dict] = {rank: {} for rank in ranks}
    for rank, procs in results(run, ranks).items():
        for r in procs:
            got[rank].update(r["losses"])  # the last process to commit a step wins (a replay recomputes it)
    for rank in ranks:  # a killed process printed nothing: its replacement's steps are compared
        assert got[rank] and all(got[rank][s] == want[rank][s] for s in got[rank]), f"rank {rank}: a loss differs"


@pytest.mark.parametrize("how", ["template", "spawn", "hot_spare"])
def test_a_killed_rank_is_healed_in_memory_with_survivors_kept(runs, how):
    run = runs / how
    assert_bit_identical(runs / "ref", run)
    agent = (run / "agent.log").read_text()
    how = how.replace("_", " ")  # the agent's word for it
    assert f"replacement 1 started ({how}," in agent, agent[-3000:]
    assert "restarting the whole worker group" not in agent
    res, pids = results(run), started_pids(run)
    [survivor] = res[0]
    assert survivor["pid"] == pids[0], "the survivor is not the process the agent started"
    assert survivor["replacement"] is None and survivor["restart"] == 0
    assert survivor["losses"] == results(runs / "ref")[0][-1]["losses"], "the survivor's losses differ"
    [heal] = survivor["heals"]
    assert heal["role"] == "survivor" and heal["source"] == "own" and heal["bytes_read_from_disk"] == 0
    [replacement] = res[1]  # the killed process printed nothing; its replacement finished the run
    assert replacement["pid"] != pids[1] and replacement["replacement"] == 1
    assert f"replacement 1 started ({how}, pid {replacement['pid']})" in agent
    [rheal] = replacement["heals"]
    assert rheal["role"] == "replacement" and rheal["own_source"] == "own" and rheal["bytes_read_from_disk"] == 0
    assert replacement["first_step"] == heal["resume_step"] <= KILL_AT
    # torch >= 2.15: the replacement joined the survivors' live groups in place; a fallback says why here.
    path = "reconfigure" if reconfigure.api_available() else "rebind"
    assert heal["data_plane"]["path"] == path and rheal["data_plane"]["path"] == path, (heal, rheal)


def test_a_survivor_that_looks_after_the_replacement_beats_still_heals(runs):
    """Survivor 0 sleeps 4 s after its forward in the kill step: by the time its backward finds the peer gone,
    the agent has published the death notice (naming the killed pid) and the template-forked replacement
    beats under rank 1 with its own pid. The notice still counts, because that beat says "joining"
    (accelpact.detection.liveness.JOINING); without that the survivor ignored the notice as one about an
    earlier process, waited out the control deadline, and the job fell back (rank 0 exited 3)."""
    run = runs / "late_survivor"
    assert_bit_identical(runs / "ref", run)
    agent = (run / "agent.log").read_text()
    assert "replacement 1 started (template," in agent and "restarting the whole worker group" not in agent, agent[
        -3000:
    ]
    res = results(run)
    [survivor] = res[0]
    [heal] = survivor["heals"]
    assert heal["role"] == "survivor" and heal["bytes_read_from_disk"] == 0 and survivor["restart"] == 0
    [replacement] = res[1]
    assert replacement["replacement"] == 1 and replacement["first_step"] == heal["resume_step"]


def test_a_link_reset_inside_the_heal_is_retried_in_the_next_generation(runs):
    """Survivor 0 resets its data-plane connections right before the heal's first collective: that collective
    fails on both sides. The survivor goes around its heal loop; the replacement, which used to raise out of
    attach and exit 1 (its agent then restarted the group, or failed the job), joins that next round, and the
    heal completes in memory, bit-identically, with the same two processes (a CI run lost a cross-node job
    this way to a link reset during the replacement's first collective)."""
    run = runs / "heal_reset"
    assert_bit_identical(runs / "ref", run)
    agent = (run / "agent.log").read_text()
    assert "replacement 1 started (template," in agent and "restarting the whole worker group" not in agent, agent[
        -3000:
    ]
    log0 = (run / "logs" / "rank0.log").read_text()
    reset = re.search(r"rank 0: reset (\d+) data-plane connection\(s\) before the heal's first collective", log0)
    assert reset and int(reset.group(1)) > 0, log0[-3000:]
    res, pids = results(run), started_pids(run)
    [survivor] = res[0]
    assert survivor["pid"] == pids[0] and survivor["restart"] == 0
    [heal] = survivor["heals"]
    assert heal["rounds"] >= 2 and heal["lost_ranks"] == [1] and heal["bytes_read_from_disk"] == 0, heal
    [replacement] = res[1]  # one replacement process: it was not replaced again
    assert "replacement 2 started" not in agent, agent[-3000:]
    [rheal] = replacement["heals"]
    assert rheal["role"] == "replacement" and rheal["rounds"] >= 2 and rheal["generation"] == heal["generation"], rheal
    assert replacement["first_step"] == heal["resume_step"] <= KILL_AT


def test_without_a_heal_the_group_restarts_from_its_snapshots(runs):
    run = runs / "restart"
    assert_bit_identical(runs / "ref", run)
    agent = (run / "agent.log").read_text()
    assert "a heal is impossible (rank 1 (pid" in agent and "--replacement=none" in agent, agent[-3000:]
    assert "restarting the whole worker group as attempt 1" in agent
    res = results(run)
    for rank in (0, 1):
        last = res[rank][-1]
        assert last["restart"] == 1 and last["restored"] is not None and last["restored"]["source"] == "own"
        assert last["heals"] == []


@pytest.fixture(scope="module")
def hsdp_runs(tmp_path_factory) -> Path:
    """HSDP on a 2 x 2 mesh (replicate x shard), 4 ranks: a fault-free run and rank 1 SIGKILLed mid-step."""
    tmp = tmp_path_factory.mktemp("launcher_hsdp")
    jobs = {"ref": [], "kill": ["--kill-at", str(KILL_AT), "--kill-rank", "1"]}
    procs = {n: launch(n, tmp, [], ["--hsdp", "2", *s], nproc=4) for n, s in jobs.items()}
    for name, p in procs.items():
        assert p.wait(timeout=800) == 0, f"{name} failed:\n{(tmp / name / 'agent.log').read_text()[-4000:]}"
    return tmp


def test_hsdp_2x2_a_killed_rank_is_healed_in_memory(hsdp_runs):
    """Rank 1's replacement needs its replicate group (1, 3), which survivor 0 does not hold: the plan is
    every survivor's groups (accelpact.recovery.heal_groups), and the replacement builds its mesh from
    them (ticket.device_mesh). Fails when the plan is one survivor's list (the replacement finds no group
    (1, 3) and the heal ends in a restart), or when attach refuses a 2-D mesh with heal=."""
    ranks = (0, 1, 2, 3)
    run = hsdp_runs / "kill"
    assert_bit_identical(hsdp_runs / "ref", run, ranks)
    agent = (run / "agent.log").read_text()
    assert "replacement 1 started (template," in agent and "restarting the whole worker group" not in agent, agent[
        -3000:
    ]
    res = results(run, ranks)
    for rank in (0, 2, 3):
        [survivor] = res[rank]
        assert survivor["replacement"] is None and survivor["restart"] == 0
        [heal] = survivor["heals"]
        assert heal["role"] == "survivor" and heal["bytes_read_from_disk"] == 0
    [replacement] = res[1]
    [rheal] = replacement["heals"]
    assert replacement["replacement"] == 1 and rheal["role"] == "replacement" and rheal["bytes_read_from_disk"] == 0
    path = "reconfigure" if reconfigure.api_available() else "rebind"
    assert rheal["data_plane"]["path"] == path, rheal
