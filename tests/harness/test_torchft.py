"""Tests of ``strategy=torchft`` (harness.strategies.torchft_*): torchft 0.2.0's fault-tolerant HSDP baseline.

Fast: the Lighthouse process (starts, serves, exits on close and when its parent is SIGKILLed), the
parent's per-group restart policy (pure logic, a stub launcher), the row's torchft columns from events,
the identity cut, validation, and one whole run with a kill (the group drops out and heals from a peer).
Slow (whole harness runs, real gloo ranks, real Lighthouse): Ctrl-C and
a killed parent leave no Lighthouse and no rank; each fault kind the harness injects meets torchft's own
recovery (socket_reset: a discarded, retried step; kill: the group drops out and heals from a peer; hang:
a stalled group is dropped and heals) and the run finishes with every rank agreeing.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
from harness_test_helpers import TINY, harness_env, read_row, run_harness, start_harness, worker_processes

from harness.schema import FaultSchedule
from harness.strategies.torchft_config import TorchftConfig

pytest.importorskip("torchft")

TORCHFT = ["strategy=torchft", *TINY]


def _lighthouses(marker_pid: int | None = None) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = " ".join(proc.info.get("cmdline") or [])
        if "harness.parent.strategies.torchft_lighthouse" in cmd and (
            marker_pid is None or f"--parent_pid {marker_pid}" in cmd
        ):
            found.append(proc)
    return found


def _gone(pid: int, timeout: float = 15.0) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


# ----------------------------------------------------------------------------------- fast ----------
def test_lighthouse_serves_and_exits_on_close(tmp_path):
    import socket

    from harness.parent.strategies.torchft_lighthouse import Lighthouse

    log = tmp_path / "lighthouse.log"
    lh = Lighthouse.start(log, "127.0.0.1", 1, 60000, 100, 1000)
    try:
        assert lh.address.startswith("http://127.0.0.1:")
        with socket.create_connection(("127.0.0.1", lh.port), timeout=5):
            pass
        # The Rust server logs "Lighthouse listening" from its own task, after the address is printed: under load
        # (a CI run) a close straight away ended the process before that line was written. Wait for it first.
        deadline = time.time() + 30
        while "Lighthouse listening" not in log.read_text() and time.time() < deadline:
            time.sleep(0.1)
    finally:
        code = lh.close(grace_s=10)
    assert code == 0, "the Lighthouse did not exit on SIGTERM (it had to be SIGKILLed)"
    assert "Lighthouse listening" in log.read_text(), "the Lighthouse's log (its stderr) never got its start line"


def test_lighthouse_dies_with_a_killed_parent(tmp_path):
    script = (
        "import sys, time\nfrom pathlib import Path\n"
        "from harness.parent.strategies.torchft_lighthouse import Lighthouse\n"
        f"lh = Lighthouse.start(Path({str(tmp_path / 'lh.log')!r}), '127.0.0.1', 1, 60000, 100, 1000)\n"
        "print(lh.proc.pid, flush=True)\ntime.sleep(600)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], env=harness_env(), stdout=subprocess.PIPE, text=True)
    try:
        pid = int(parent.stdout.readline())  # type: ignore[union-attr]
        assert psutil.pid_exists(pid)
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        assert _gone(pid), f"the Lighthouse (pid {pid}) outlived its SIGKILLed parent"
    finally:
        if parent.poll() is None:
            parent.kill()


class _StubLauncher:
    def __init__(self) -> None:
        self.token = "tok"
        self.store = SimpleNamespace(set=lambda k, v: self.keys.__setitem__(k, v))
        self.keys: dict[str, bytes] = {}
        self.signalled: list[tuple[int, int]] = []
        self.replacements = 0

    def signal_rank(self, rank: int, sig: int) -> None:
        self.signalled.append((rank, sig))

    def store_setter(self):
        return self.store.set


def _job(world: int, group_size: int, max_restarts: int = 8):
    from harness.parent.strategies.torchft_parent import TorchftJob

    job = TorchftJob.__new__(TorchftJob)  # no Lighthouse process: only the restart policy is under test
    job.run = SimpleNamespace(
        cluster=SimpleNamespace(world_size=world), strategy=SimpleNamespace(max_restarts=max_restarts)
    )
    job.launcher = _StubLauncher()
    job.group_size = group_size
    job.restarts, job._pending = {}, {}
    job.lighthouse = SimpleNamespace(alive=lambda: True)
    return job


def test_a_failed_rank_restarts_its_whole_group_only():
    job = _job(world=4, group_size=2)
    codes = {0: None, 1: None, 2: -9, 3: None}
    assert job.replace_dead(2, -9, codes)
    assert job.launcher.signalled == [(3, signal.SIGKILL)]  # its group mate, as torchrun's agent stops it
    assert job.launcher.keys == {"tok/torchft/g1/gen": b"1"}
    # the mate's own death is part of the same restart: no new generation, nothing else signalled
    assert job.replace_dead(3, -9, {**codes, 3: -9})
    assert job.launcher.keys["tok/torchft/g1/gen"] == b"1" and len(job.launcher.signalled) == 1
    # a later failure of the same group is a new generation
    assert job.replace_dead(2, 1, {0: None, 1: None, 2: 1, 3: None})
    assert job.launcher.keys["tok/torchft/g1/gen"] == b"2"


def test_no_group_restart_once_a_member_of_the_group_finished():
    job = _job(world=4, group_size=2)
    # rank 0 exited 0 (done); its mate failing now cannot restart the group whole: the run ends with it
    assert not job.replace_dead(1, 1, {0: 0, 1: 1, 2: None, 3: None})
    assert job.launcher.signalled == [] and job.launcher.keys == {}


def test_no_restart_beyond_max_restarts_or_without_a_lighthouse():
    job = _job(world=2, group_size=1, max_restarts=1)
    job.launcher.replacements = 1
    assert not job.replace_dead(1, -9, {0: None, 1: -9})
    job = _job(world=2, group_size=1)
    job.lighthouse = SimpleNamespace(alive=lambda: False)
    assert not job.replace_dead(1, -9, {0: None, 1: -9})


def _step(rank, step, participants, groups=2, quorum_s=0.01):
    """A whole step record as a torchft rank writes it (typed events drop a malformed one)."""
    return {
        "kind": "step",
        "rank": rank,
        "t": 100.0 + step,
        "step": step,
        "t_start": 99.5 + step,
        "t_end": 100.0 + step,
        "torchft_participants": participants,
        "torchft_groups": groups,
        "torchft_quorum_s": quorum_s,
    }


def test_columns_say_no_bit_identity_when_a_group_sat_out_steps():
    from harness.strategies.torchft_report import torchft_columns

    events = [_step(0, s, 2 if s < 4 or s > 6 else 1) for s in range(10)]
    events += [
        {
            "kind": "recovery",
            "rank": r,
            "t": 105.0,
            "decision": "retry",
            "torchft_quorum_id": 2,
            "detection_s": 0.5,
            "agreement_s": 0.1,
            "rebuild_s": 0.2,
        }
        for r in (0, 1)
    ]
    events += [
        {"kind": "heal", "rank": 1, "t": 107.0, "role": "replacement", "total_s": 3.0},
        {"kind": "heal", "rank": 0, "t": 107.0, "role": "sender", "total_s": 9.0},
    ]
    cols = torchft_columns(events)
    assert cols["torchft_short_steps"] == 3
    assert cols["bit_identity_note"].startswith("no by design") and "(4-6)" in cols["bit_identity_note"]
    assert cols["torchft_discarded_attempts"] == 1  # one per rank: one discarded step
    assert cols["torchft_retry_recovery_max_s"] == pytest.approx(0.8)
    assert cols["torchft_heals"] == 1 and cols["torchft_heal_max_s"] == 3.0


def test_columns_of_a_run_where_every_group_took_every_step():
    from harness.strategies.torchft_report import torchft_columns

    cols = torchft_columns([_step(r, s, 2) for r in (0, 1) for s in range(5)])
    assert cols["torchft_short_steps"] == 0 and cols["bit_identity_note"] is None
    assert cols["torchft_discarded_attempts"] == 0 and cols["torchft_heals"] == 0


def test_identity_cut_matches_fsdp2_sharding_over_the_world():
    """The local shard FSDP2 gives each rank (FSDPParam._init_sharded_param: its _chunk_with_empty, then a
    narrow of the padded shard, so an empty shard keeps the trailing dims), uneven sizes included."""
    import torch
    from torch.distributed.fsdp._fully_shard._fsdp_common import _chunk_with_empty

    from harness.rank.strategies.torchft_identity import world_chunks

    for rows, world in ((8, 2), (7, 4), (3, 4), (1, 2)):
        t = torch.arange(rows * 3, dtype=torch.float32).reshape(rows, 3)
        chunks = _chunk_with_empty(t, world, dim=0)
        theirs = [
            t.new_zeros(chunks[0].size()).narrow(0, 0, c.size(0) if c.numel() else 0).copy_(c)
            if c.numel()
            else t.new_zeros(chunks[0].size()).narrow(0, 0, 0)
            for c in chunks
        ]
        ours = world_chunks(t, world)
        assert [tuple(c.shape) for c in ours] == [tuple(c.shape) for c in theirs]
        assert all(torch.equal(a, b) for a, b in zip(ours, theirs))


def _run(world: int, group_size: int = 1, fault: str = "none", hosts: int = 0, ranks: tuple[int, ...] = (1,)):
    return SimpleNamespace(
        strategy=TorchftConfig(name="torchft", group_size=group_size),
        cluster=SimpleNamespace(world_size=world, hosts=hosts, replicate=1),
        fault=SimpleNamespace(kind=fault, ranks=list(ranks), schedule=FaultSchedule.at_step),
    )


def test_validation_names_the_fix():
    from harness.app.validate import ConfigError
    from harness.strategies.torchft_check import check_runnable

    check_runnable(_run(4, 2, "kill"))  # HSDP 2x2 is fine
    with pytest.raises(ConfigError, match="strategy.group_size=1"):
        check_runnable(_run(2, 2))  # one group: nothing to fall back on
    # Network namespaces: the Lighthouse runs in the bridge namespace now (harness.server_home).
    check_runnable(_run(2, 1, "host_loss"))
    check_runnable(_run(4, 2, "host_loss", hosts=2))  # host 0 holds group 0 only
    check_runnable(_run(4, 1, "tcp_reset", hosts=2))
    # One host holding a rank of every group: its loss leaves no peer to heal from.
    with pytest.raises(
        ConfigError, match=r"every replica group.*fault.ranks=\[1\] with a host per group: cluster.hosts=2"
    ):
        check_runnable(_run(2, 1, "host_loss", hosts=1))
    with pytest.raises(ConfigError, match=r"kills ranks \[0, 1\]"):
        check_runnable(_run(2, 1, "kill", ranks=(0, 1)))


def test_the_ranks_a_fault_kills_and_the_groups_it_leaves():
    from harness.strategies.torchft_layout import groups_untouched, ranks_lost

    assert ranks_lost([1], 4, 0, whole_host=True) == {1}  # a host per rank
    assert ranks_lost([1], 4, 2, whole_host=True) == {0, 1}  # rank 1's host holds ranks 0-1
    assert ranks_lost([3], 6, 2, whole_host=True) == {3, 4, 5}
    assert ranks_lost([1], 4, 2, whole_host=False) == {1}  # a kill takes the rank only
    assert groups_untouched({0, 1}, 4, 2) == [1]
    assert groups_untouched({0, 1}, 4, 1) == [2, 3]
    assert groups_untouched({1, 2}, 4, 2) == []  # a member of both groups


def test_strategy_servers_run_in_the_bridge_namespace_when_the_ranks_run_in_namespaces():
    from harness.server_home import ServerHome, server_home

    run = SimpleNamespace(cluster=SimpleNamespace(master_addr="127.0.0.1"))
    home = server_home(run, SimpleNamespace(store_netns="ap123456-br", control_host="10.2.255.254"))
    assert home == ServerHome("10.2.255.254", "ap123456-br")
    assert home.command(["python", "-m", "x"]) == ["ip", "netns", "exec", "ap123456-br", "python", "-m", "x"]
    home = server_home(run, SimpleNamespace(store_netns=None, control_host="127.0.0.1"))
    assert home == ServerHome("127.0.0.1") and home.command(["python"]) == ["python"]


# ----------------------------------------------------------------------------------- slow ----------
def _wait_for_step(events_file: Path, step: int, proc: subprocess.Popen, timeout: float = 400) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, proc.communicate()
        if events_file.exists():
            for line in events_file.read_text().splitlines():
                try:
                    if json.loads(line).get("kind") == "step" and json.loads(line)["step"] >= step:
                        return
                except json.JSONDecodeError:
                    continue
        time.sleep(0.2)
    raise AssertionError(f"no step {step} in {events_file} within {timeout} s")


@pytest.mark.slow
@pytest.mark.timeout(1200)  # whole harness runs; a start alone took minutes on the loaded 2-core machine
@pytest.mark.parametrize("how", ["sigint", "sigkill"])
def test_nothing_left_behind_after_ctrl_c_or_a_killed_parent(tmp_path, how):
    run_dir = tmp_path / "run"
    proc = start_harness([*TORCHFT, "train.steps=5000", f"hydra.run.dir={run_dir}"], tmp_path)
    try:
        _wait_for_step(run_dir / "events" / "rank1.jsonl", 1, proc)
        lighthouses = _lighthouses(proc.pid)
        ranks = worker_processes(str(run_dir))
        assert len(lighthouses) == 1 and len(ranks) == 2
        proc.send_signal(signal.SIGINT if how == "sigint" else signal.SIGKILL)
        proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    for p in [*lighthouses, *ranks]:
        assert _gone(p.pid, 30), f"{p.pid} ({' '.join(p.cmdline()[:4])}) outlived the parent's {how}"
    if how == "sigint":
        row = read_row(run_dir)
        assert row["status"] == "failed" and "interrupted" in row["reason"]


def _faulted_run(tmp_path: Path, *args: str) -> dict:
    run_dir = tmp_path / "run"
    res = run_harness([*TORCHFT, "train.steps=14", f"hydra.run.dir={run_dir}", *args], tmp_path, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    row = read_row(run_dir)
    assert row["status"] == "ok" and row["ranks_agree"], row
    assert row["faults"] == 1 and row["steps_done"] == 14
    return row


@pytest.mark.slow
@pytest.mark.timeout(1200)  # whole harness runs; a start alone took minutes on the loaded 2-core machine
def test_socket_reset_discards_and_retries_the_step(tmp_path):
    row = _faulted_run(tmp_path, "fault=socket_reset", "fault.at_step=5")
    assert row["torchft_discarded_attempts"] >= 1 and row["torchft_heals"] == 0
    assert row["badput_detection_s"] > 0 and row["torchft_group_restarts"] == 0


# In the default suite (~35 s): the one whole torchft run there. Every torchft rank once died at the end of
# the run (a finish() signature clash) while all the torchft runs were `slow`, and nothing caught it.
@pytest.mark.timeout(1200)  # whole harness runs; a start alone took minutes on the loaded 2-core machine
def test_kill_drops_the_group_and_heals_it_from_a_peer(tmp_path):
    row = _faulted_run(tmp_path, "fault=kill", "fault.at_step=4")
    assert row["torchft_group_restarts"] == 1 and row["torchft_heals"] == 1 and row["heal_source"] == "peer"
    assert row["torchft_short_steps"] >= 1 and str(row["bit_identity_note"]).startswith("no by design")


@pytest.mark.slow
@pytest.mark.timeout(1200)  # whole harness runs; a start alone took minutes on the loaded 2-core machine
def test_a_stalled_group_is_dropped_and_rejoins(tmp_path):
    row = _faulted_run(tmp_path, "fault=hang", "fault.at_step=4", "fault.outage_s=15", "strategy.timeout_s=5")
    assert row["torchft_discarded_attempts"] >= 1 and row["torchft_short_steps"] >= 1
