"""cluster=local_hosts: ranks in host namespaces with a data network and a separate control network.

- pure: which ranks share a host, its names and addresses; the config errors (everywhere);
- netns: a 4-rank, 2-host topology where a data-link outage of host 1 leaves its control link (the
  store) reachable and a control-link outage leaves its data link reachable;
- netns + slow: ``python -m harness ... cluster=local_hosts fault=link_down`` recovers bit-identical to
  its fault-free reference, and a control-link outage and a reset of every control-link connection are
  survived (status ok, bit-identical too).
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time

import pytest
from harness_test_helpers import TINY, read_row, run_harness

from harness.app.validate import ConfigError, check_values
from harness.faults.addressing import Layout, new_prefix
from harness.schema import ClusterConfig, FaultConfig, LinkPlane, RunConfig


# ---- pure: runs everywhere ----------------------------------------------------------------------------
def test_ranks_share_their_host_namespace_and_addresses():
    lay = Layout(new_prefix(), world_size=4, hosts=2)
    assert [lay.host_of(r) for r in range(4)] == [0, 0, 1, 1]
    assert [lay.local_rank(r) for r in range(4)] == [0, 1, 0, 1]
    assert lay.rank_ns(0) == lay.rank_ns(1) != lay.rank_ns(2) == lay.rank_ns(3)
    assert lay.namespaces == (lay.bridge_ns, f"{lay.prefix}-h0", f"{lay.prefix}-h1")
    assert lay.data_addr(1) == lay.data_addr(0) != lay.data_addr(2)
    assert lay.ctl_addr(3) == lay.ctl_addr(2) != lay.ctl_addr(0)
    assert lay.data_peer(3) == lay.data_peer(2) != lay.data_peer(0)
    assert lay.ranks_of_host(1) == (2, 3)
    # Without hosts: one namespace per rank, as the per-rank link faults always had.
    assert Layout(lay.prefix, world_size=2).namespaces == (lay.bridge_ns, f"{lay.prefix}-r0", f"{lay.prefix}-r1")
    with pytest.raises(ValueError, match="not a multiple of hosts=3"):
        Layout(lay.prefix, world_size=4, hosts=3)


def _run(**changes: object) -> RunConfig:
    run = RunConfig()
    cluster = dataclasses.replace(ClusterConfig(), **{k[8:]: v for k, v in changes.items() if k.startswith("cluster_")})
    fault = dataclasses.replace(FaultConfig(), **{k[6:]: v for k, v in changes.items() if k.startswith("fault_")})
    return dataclasses.replace(run, cluster=cluster, fault=fault)


def test_hosts_must_divide_the_world_size():
    with pytest.raises(ConfigError, match=r"cluster.hosts=3 must be 0 .* divide cluster.world_size=4"):
        check_values(_run(cluster_world_size=4, cluster_hosts=3))
    check_values(_run(cluster_world_size=4, cluster_hosts=2))


def test_a_control_link_fault_needs_a_namespace_fault():
    with pytest.raises(ConfigError, match="fault.link=control .* try `fault=link_down fault.link=control"):
        check_values(_run(fault_kind="socket_reset", fault_link=LinkPlane.control))
    check_values(_run(fault_kind="link_down", fault_link=LinkPlane.control, cluster_hosts=2))


def test_without_namespaces_local_hosts_is_refused_in_one_line(monkeypatch):
    from harness.app import capabilities
    from harness.faults import netns

    monkeypatch.setattr(netns, "namespaces_available", lambda: (False, "network-namespace faults need root"))
    run = _run(cluster_name="local_hosts", cluster_hosts=2, cluster_pg_timeout_s=5.0)
    with pytest.raises(
        ConfigError,
        match=r"^cluster=local_hosts \(cluster.hosts=2\) runs the ranks in network "
        r"namespaces, which are unavailable: .*need root; try `cluster=local_cpu`$",
    ):
        capabilities.check_runnable(run)


# ---- the real thing -------------------------------------------------------------------------------------
def _available() -> tuple[bool, str]:
    from harness.faults.netns import namespaces_available

    return namespaces_available()


_OK, _WHY = _available()

# Connect from inside a namespace to host:port; exit 0 if the TCP handshake completes within 2 s.
_CONNECT = "import socket,sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2).close()"


def _reaches(topo, rank: int, host: str, port: int) -> bool:
    argv = topo.wrap_command(rank, [sys.executable, "-c", _CONNECT, host, str(port)])
    return subprocess.run(argv, capture_output=True, timeout=20).returncode == 0


def _listener(topo, rank: int) -> subprocess.Popen[str]:
    """A TCP listener on rank ``rank``'s host data address (what a gloo peer connects to)."""
    code = (
        "import socket,sys; s=socket.socket(); s.bind((sys.argv[1], 0)); s.listen(8); "
        "print(s.getsockname()[1], flush=True)\nwhile True: s.accept()[0].close()"
    )
    proc = subprocess.Popen(
        topo.wrap_command(rank, [sys.executable, "-c", code, topo.layout.data_addr(rank)]),
        stdout=subprocess.PIPE,
        text=True,
    )
    return proc


@pytest.mark.netns
@pytest.mark.skipif(not _OK, reason=_WHY)
@pytest.mark.parametrize("plane", ["data", "control"])
def test_a_host_link_outage_cuts_one_plane_and_spares_the_other(plane):
    from harness.faults.netns import NetnsTopology, leftovers

    with NetnsTopology(world_size=4, hosts=2) as topo:
        lay = topo.layout
        assert sorted(set(lay.rank_ns(r) for r in range(4))) == sorted(lay.host_namespaces)
        store_host, store_port = topo.control_addr
        listener = _listener(topo, 0)
        try:
            data_port = int(listener.stdout.readline())
            data0 = lay.data_addr(0)
            assert _reaches(topo, 3, data0, data_port) and _reaches(topo, 3, store_host, store_port)
            with topo.outage("link_down", [3], plane=plane):
                # Both ranks of host 1 lose the cut plane; the other plane still answers.
                for rank in (2, 3):
                    assert _reaches(topo, rank, data0, data_port) == (plane == "control")
                    assert _reaches(topo, rank, store_host, store_port) == (plane == "data")
                assert _reaches(topo, 1, data0, data_port)  # host 0's own ranks are untouched
            t0 = time.monotonic()
            while not (_reaches(topo, 3, data0, data_port) and _reaches(topo, 3, store_host, store_port)):
                assert time.monotonic() - t0 < 10, "the link did not come back after the heal"
            assert topo.faults[-1].plane == plane and topo.faults[-1].ranks == (3,)
        finally:
            listener.kill()
            listener.wait()
    assert leftovers(topo.prefix) == []


# ---- through the harness, as the README's command ------------------------------------------------------
BASE = [*TINY, "train.steps=10", "cluster=local_hosts", "cluster.hosts=2", "fault.ranks=[1]", "fault.at_step=5"]


def _harness(tmp_path, name: str, extra: list[str]):
    run_dir = tmp_path / name
    done = run_harness([*BASE, *extra, f"hydra.run.dir={run_dir}"], tmp_path, timeout=500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return run_dir, read_row(run_dir)


@pytest.fixture
def no_new_namespaces():
    """Whatever happens to the runs (a pytest timeout SIGKILLs the harness before its teardown), remove
    the namespaces of this test's jobs; fail if a run that ended normally left any."""
    from harness.faults.netns import cleanup_stale, list_prefixes

    before = set(list_prefixes())
    left: list[str] = []
    yield left
    for prefix in set(list_prefixes()) - before:
        left.append(prefix)
        cleanup_stale(prefix)


@pytest.mark.slow
@pytest.mark.netns
@pytest.mark.timeout(900)  # four harness runs of about 60-80 s each on this loaded machine
@pytest.mark.skipif(not _OK, reason=_WHY)
def test_harness_data_link_fault_recovers_bit_identical_and_control_link_fault_is_survived(tmp_path, no_new_namespaces):
    from harness.events import read_events
    from harness.faults.netns import list_prefixes
    from harness.identity import compare_runs

    before = set(list_prefixes())
    ref_dir, ref = _harness(tmp_path, "reference", ["strategy=none", "fault=none"])
    # The data-link outage (8 s) must outlast the PG timeout to break a collective: 5 s, set here (the
    # cluster's own 60 s keeps the fault-free reference from timing out on a loaded host).
    data_dir, data = _harness(tmp_path, "data", ["strategy=accelpact", "fault=link_down", "cluster.pg_timeout_s=5"])
    assert data["status"] == "ok" and data["relaunches"] == 0 and data["recoveries"] >= 1, data["reason"]
    [fault] = [e for e in read_events(data_dir) if e["kind"] == "fault"]
    assert fault["link"] == "data"
    result = compare_runs(ref_dir, data_dir)
    assert result.equal, result.describe()

    # The control link of rank 1's host goes down for 8 s mid-run: training needs no store traffic per
    # step, so the run goes on; it must end ok, bit-identical, with no fallback to a restart.
    ctl_dir, ctl = _harness(tmp_path, "control", ["strategy=accelpact", "fault=link_down", "fault.link=control"])
    assert ctl["status"] == "ok" and ctl["relaunches"] == 0 and not ctl.get("fallback_reason"), ctl["reason"]
    [fault] = [e for e in read_events(ctl_dir) if e["kind"] == "fault"]
    assert fault["link"] == "control"
    result = compare_runs(ref_dir, ctl_dir)
    assert result.equal, result.describe()
    # A reset of every control-link connection of host 1 (the store clients: control channel, heartbeat):
    # they reconnect at their next call; nothing else notices.
    rst_dir, rst = _harness(tmp_path, "control_reset", ["strategy=accelpact", "fault=tcp_reset", "fault.link=control"])
    assert rst["status"] == "ok" and rst["relaunches"] == 0 and not rst.get("fallback_reason"), rst["reason"]
    [fault] = [e for e in read_events(rst_dir) if e["kind"] == "fault"]
    assert fault["link"] == "control" and fault["sockets_reset"] >= 1
    result = compare_runs(ref_dir, rst_dir)
    assert result.equal, result.describe()
    assert set(list_prefixes()) <= before, "a run left namespaces behind"
