"""NVRx (strategy=checkpoint_restore) with its ranks in network namespaces: where its store lives.

- netns + slow: the store home the parent picks for namespaced ranks (``nvrx_store.store_home``) serves a fresh
  store per incarnation in the bridge namespace; clients in two different rank namespaces, configured by
  the environment a rank gets (NVRX_STORE_HOST / NVRX_STORE_PORT), meet on it. A store hosted in the
  parent at 127.0.0.1 (what NVRx had before) is not reachable from a rank namespace: the control.
- netns + slow: ``fault=host_loss`` through the harness: rank 1's host is lost, the parent relaunches
  every rank (NVRx's in-job restart) on a fresh store, both restore the newest checkpoint, and the run
  ends bit-identical to a fault-free reference. Then ``fault=tcp_reset`` on rank 1's data link: NVRx
  restarts in process (no relaunch), its store untouched on the control link, and ends bit-identical too.
"""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from harness_test_helpers import TINY, read_row, run_harness, worker_processes

REPO = Path(__file__).resolve().parents[2]


def _available() -> tuple[bool, str]:
    from harness.faults.netns import namespaces_available

    return namespaces_available()


_OK, _WHY = _available()

_CLIENT = """
import datetime, os, sys
import torch.distributed as dist
from harness.strategies.checkpoint_restore.nvrx_types import NvrxSettings
t = datetime.timedelta(seconds=30)
if len(sys.argv) > 2:  # the control first: the parent's loopback store, seen from this namespace
    try:
        dist.TCPStore("127.0.0.1", int(sys.argv[2]), is_master=False, timeout=datetime.timedelta(seconds=3))
        print("PARENT-LOOPBACK-REACHED")
    except Exception as exc:
        print("parent loopback unreachable:", type(exc).__name__)
s = NvrxSettings()  # NVRx's store as a rank resolves it
store = dist.TCPStore(s.resolved_host(), s.resolved_port(), is_master=False, timeout=t)
if sys.argv[1] == "set":
    store.set("nvrx-netns-test", b"from-rank-1")
else:
    assert store.get("nvrx-netns-test") == b"from-rank-1"
print("OK", s.resolved_host(), s.resolved_port())
"""


def _client(topo, rank: int, addr: tuple[str, int], op: str, *control: int) -> subprocess.CompletedProcess[str]:
    from harness.strategies.checkpoint_restore.nvrx_types import STORE_HOST_ENV, STORE_PORT_ENV

    # The environment a rank gets: the topology's (MASTER_ADDR is rank 0's data address there) + the store's.
    env = {
        **os.environ,
        **topo.rank_env(rank),
        STORE_HOST_ENV: addr[0],
        STORE_PORT_ENV: str(addr[1]),
        "PYTHONPATH": str(REPO),
        "TORCH_CPP_LOG_LEVEL": "ERROR",
    }
    argv = [sys.executable, "-c", _CLIENT, op, *map(str, control)]
    return subprocess.run(topo.wrap_command(rank, argv), env=env, cwd=REPO, capture_output=True, text=True, timeout=120)


@pytest.mark.slow  # 3 Python + torch starts: 48 s at load 9 here
@pytest.mark.netns
@pytest.mark.skipif(not _OK, reason=_WHY)
def test_namespaced_ranks_reach_nvrx_store_in_the_bridge_namespace_not_at_the_parents_loopback():
    from harness.faults.netns import NetnsTopology, leftovers
    from harness.parent.strategies.nvrx_store import NamespaceStores, ParentStores, store_home

    with NetnsTopology(world_size=2, store_server=False) as topo:  # no control store: one torch start less
        # What harness.parent.run gives the launcher for namespaced ranks: the control store's host.
        ctl = topo.layout.bridge_ctl_addr
        launcher = SimpleNamespace(store_netns=topo.layout.bridge_ns, control_host=ctl)
        run = SimpleNamespace(cluster=SimpleNamespace(master_addr="127.0.0.1"))
        home = store_home(run, launcher)
        # The control: a store hosted in the parent at 127.0.0.1 (NVRx's home before); in a rank namespace
        # 127.0.0.1 is the rank's own loopback.
        parent = ParentStores("127.0.0.1")
        try:
            first = home.renew()
            addr = home.renew()  # a relaunched world's store: a new one, in the same server
            assert addr != first and addr[0] == ctl, (first, addr)
            done = _client(topo, 1, addr, "set", parent.renew()[1])
            assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
            assert "parent loopback unreachable" in done.stdout, done.stdout
            done = _client(topo, 0, addr, "get")  # another host sees rank 1's key: one store
            assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        finally:
            home.close()
            parent.close()
        assert isinstance(home, NamespaceStores) and home.proc.returncode is not None  # stdin EOF ended it
    assert leftovers(topo.prefix) == []


# ---- through the harness ---------------------------------------------------------------------------
SHRINK = [*TINY, "train.steps=10", "checkpoint=sync", "checkpoint.interval=4"]
FAULT_STEP = 6  # a checkpoint after step 3; rank 1's host is lost during step 6


@pytest.mark.slow
@pytest.mark.netns
@pytest.mark.timeout(900)  # three harness runs of 30-150 s each on this loaded 2-core host
@pytest.mark.skipif(not _OK, reason=_WHY)
def test_host_loss_and_a_data_link_reset_under_nvrx_end_bit_identical(tmp_path):
    from harness.events import read_events
    from harness.faults.addressing import BRIDGE_HOST
    from harness.faults.netns import list_prefixes
    from harness.identity import compare_runs

    before = set(list_prefixes())
    ref_dir, run_dir = tmp_path / "reference", tmp_path / "host_loss"
    done = run_harness([*SHRINK, "strategy=none", "fault=none", f"hydra.run.dir={ref_dir}"], tmp_path, timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    done = run_harness(
        [
            *SHRINK,
            "strategy=checkpoint_restore",
            "fault=host_loss",
            "fault.ranks=[1]",
            f"fault.at_step={FAULT_STEP}",
            f"hydra.run.dir={run_dir}",
        ],
        tmp_path,
        timeout=450,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    row = read_row(run_dir)
    assert row["status"] == "ok", row["reason"]
    assert row["relaunches"] == 1 and "NVRx in-job restart: rank 1 was lost (exit -9)" in row["relaunch_reasons"]
    # The relaunched world's store: in the bridge namespace, on the control network (10.x.y.254).
    host = ipaddress.ip_address(row["nvrx_store"].rsplit(":", 1)[0])
    assert host in ipaddress.ip_network("10.0.0.0/8") and int(str(host).rsplit(".", 1)[1]) == BRIDGE_HOST, host
    events = read_events(run_dir)
    [fault] = [e for e in events if e["kind"] == "fault"]
    assert fault["host_ranks"] == [1]
    restores = [e for e in events if e["kind"] == "restore"]
    assert {e["rank"] for e in restores} == {0, 1} and {e["from_step"] for e in restores} == {3}
    assert row["replayed_steps"] == FAULT_STEP - 4 and row["badput_restart_s"] > 0
    result = compare_runs(ref_dir, run_dir)
    assert result.equal, result.describe()

    rst_dir = tmp_path / "tcp_reset"
    done = run_harness(
        [
            *SHRINK,
            "strategy=checkpoint_restore",
            "fault=tcp_reset",
            "fault.ranks=[1]",
            f"fault.at_step={FAULT_STEP}",
            f"hydra.run.dir={rst_dir}",
        ],
        tmp_path,
        timeout=450,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    row = read_row(rst_dir)
    assert row["status"] == "ok" and row["relaunches"] == 0, row["reason"]
    restarts = [e for e in read_events(rst_dir) if e["kind"] == "restart" and e["incarnation"] > 0]
    assert restarts and all(e["in_process"] for e in restarts), restarts  # NVRx's own restart, same processes
    assert row["replayed_steps"] == FAULT_STEP - 4
    result = compare_runs(ref_dir, rst_dir)
    assert result.equal, result.describe()
    assert worker_processes(str(tmp_path)) == []
    assert set(list_prefixes()) <= before, "a run left namespaces behind"
