"""Fast unit tests of the NVRx baseline's adapter (harness.rank.strategies.nvrx_restart): settings, the store
port, per-restart records and the fields of the harness's restart event. No rank processes."""

import sys

import pytest


def test_missing_nvrx_names_the_fix(monkeypatch: pytest.MonkeyPatch):
    from harness.rank.strategies import nvrx_restart

    # None in sys.modules makes the import raise ImportError, as on a machine without the package.
    monkeypatch.setitem(sys.modules, "nvidia_resiliency_ext", None)
    monkeypatch.setitem(sys.modules, "nvidia_resiliency_ext.inprocess", None)
    with pytest.raises(nvrx_restart.NvrxUnavailable) as info:
        nvrx_restart.run_with_inprocess_restart(lambda ctx: None, nvrx_restart.NvrxSettings(store_port=1))
    msg = str(info.value)
    assert "strategy=checkpoint_restore needs nvidia-resiliency-ext==0.4.1" in msg
    assert "pip install -e '.[baselines]'" in msg


def test_store_port_is_required(monkeypatch: pytest.MonkeyPatch):
    from harness.rank.strategies.nvrx_restart import STORE_PORT_ENV, NvrxSettings

    monkeypatch.delenv(STORE_PORT_ENV, raising=False)
    with pytest.raises(ValueError, match=STORE_PORT_ENV):
        NvrxSettings().resolved_port()
    monkeypatch.setenv(STORE_PORT_ENV, "4321")
    assert NvrxSettings().resolved_port() == 4321
    assert NvrxSettings(store_port=99).resolved_port() == 99


def test_restart_record_and_event_fields():
    from harness.rank.strategies.nvrx_restart import RestartContext, RestartRecord

    rec = RestartRecord(
        incarnation=1,
        error="RuntimeError: x",
        t_raised=10.0,
        t_detected=10.02,
        t_aborted=10.15,
        t_finalized=10.2,
        t_entered=10.6,
    )
    assert rec.t_began == 10.0
    assert rec.restart_s == pytest.approx(0.6)
    # A rank interrupted by NVRx (it never raised itself) began its restart at detection.
    assert RestartRecord(incarnation=1, t_detected=5.0, t_entered=5.5).t_began == 5.0
    ctx = RestartContext(
        incarnation=1,
        rank=0,
        world_size=2,
        store=None,
        store_prefix="p",
        exclude_ports=(1,),
        t_launch=1.0,
        t_entered=10.6,
        restarts=(rec,),
    )
    fields = ctx.restart_event_fields(t_ready=12.0)
    assert (fields["t_launch"], fields["t_ready"], fields["incarnation"]) == (10.0, 12.0, 1)
    assert fields["nvrx_t_detected"] == 10.02 and fields["nvrx_error"] == "RuntimeError: x"
    first = RestartContext(
        incarnation=0,
        rank=0,
        world_size=2,
        store=None,
        store_prefix="p",
        exclude_ports=(1,),
        t_launch=1.0,
        t_entered=3.0,
        restarts=(),
    )
    assert first.restart_event_fields(t_ready=4.0)["t_launch"] == 1.0


def test_recorder_turns_a_failed_incarnation_into_one_restart_record():
    from harness.rank.strategies.nvrx_restart import _Recorder

    rec = _Recorder()
    rec.entered(0, 1.0)
    assert rec.restarts == [] and rec.incarnations == 1
    try:
        try:
            raise RuntimeError("Connection closed by peer")
        except RuntimeError:
            raise KeyboardInterrupt("stand-in for NVRx's asynchronous RankShouldRestart")  # noqa: B904 - as NVRx raises it
    except BaseException as exc:  # noqa: BLE001
        rec.raised(exc, 2.0)
        rec.raised(exc, 3.0)  # only the first failure of an incarnation counts
    rec.pending.t_detected = 2.1
    rec.entered(1, 4.0)
    [r] = rec.restarts
    assert (r.incarnation, r.t_raised, r.t_detected, r.t_entered) == (1, 2.0, 2.1, 4.0)
    assert r.error.startswith("KeyboardInterrupt: stand-in") and "<- RuntimeError: Connection closed" in r.error
    assert rec.pending.incarnation == 2 and rec.pending.t_raised is None and rec.incarnations == 2


def test_store_ports_sees_through_prefix_stores():
    import torch.distributed as dist

    from harness.rank.strategies.nvrx_restart import store_ports

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    assert store_ports(dist.PrefixStore("a/b", dist.PrefixStore("c", store))) == (store.port,)
    assert store_ports(None) == ()


def test_settings_reject_bad_values():
    from harness.rank.strategies.nvrx_restart import NvrxSettings

    with pytest.raises(ValueError, match="max_restarts"):
        NvrxSettings(max_restarts=-1)
    with pytest.raises(ValueError, match="absolute"):
        NvrxSettings(monitor_log_file="rel/{rank}.log")


# ----------------------------------------------------------------------- the rank script ----------


def test_a_lost_process_is_relaunched_an_error_of_its_own_is_not():
    from harness.strategies import relaunch_reason
    from harness.strategies.checkpoint_restore import relaunch_after_lost_process

    # Rank 1 SIGKILLed, rank 0 then torn down by the parent (SIGTERM): the first failure decides.
    why = relaunch_after_lost_process({0: -15, 1: -9}, 1)
    assert why is not None and "rank 1 was lost (exit -9)" in why and "relaunched" in why
    # NVRx gave up on its own (restarts exhausted): a relaunch would fail again.
    assert relaunch_after_lost_process({0: 1, 1: -15}, 0) is None
    assert relaunch_after_lost_process({0: 0, 1: 0}, None) is None
    # Through the registry, within strategy.max_restarts only.
    assert relaunch_reason("checkpoint_restore", {0: -15, 1: -9}, 0, 1, False, 1) == why
    assert relaunch_reason("checkpoint_restore", {0: -15, 1: -9}, 1, 1, False, 1) is None


def test_store_host_env_wins_over_master_addr(monkeypatch: pytest.MonkeyPatch):
    # In network namespaces MASTER_ADDR is rank 0's data address; NVRx's store is elsewhere.
    from harness.rank.strategies.nvrx_restart import STORE_HOST_ENV, NvrxSettings

    monkeypatch.setenv("MASTER_ADDR", "10.1.0.1")
    monkeypatch.delenv(STORE_HOST_ENV, raising=False)
    assert NvrxSettings().resolved_host() == "10.1.0.1"
    monkeypatch.setenv(STORE_HOST_ENV, "10.1.255.254")
    assert NvrxSettings().resolved_host() == "10.1.255.254"
    assert NvrxSettings(store_host="h").resolved_host() == "h"


def test_namespaced_ranks_get_their_nvrx_store_on_the_control_network_not_in_the_parent():
    from types import SimpleNamespace

    from harness.parent.strategies.nvrx_store import NamespaceStores, ParentStores, store_home

    run = SimpleNamespace(cluster=SimpleNamespace(master_addr="127.0.0.1"))
    # Ranks in namespaces (harness.parent.run sets store_netns): the bridge namespace, the control store's host.
    home = store_home(run, SimpleNamespace(store_netns="ap123456-br", control_host="10.2.255.254"))
    assert isinstance(home, NamespaceStores) and (home.netns, home.host) == ("ap123456-br", "10.2.255.254")
    home.close()  # never started: nothing to stop
    # Ranks in the parent's namespace: the parent itself, on the cluster's address.
    home = store_home(run, SimpleNamespace(store_netns=None, control_host="127.0.0.1"))
    assert isinstance(home, ParentStores) and home.host == "127.0.0.1"


def test_namespace_faults_run_with_nvrx_are_allowed_on_the_data_plane_only():
    from types import SimpleNamespace

    from harness.schema import ConfigError, FaultSchedule
    from harness.strategies.checkpoint_restore import NETNS_FAULTS, check_runnable

    def run(kind: str, link: str) -> SimpleNamespace:
        return SimpleNamespace(fault=SimpleNamespace(kind=kind, link=link, schedule=FaultSchedule.at_step))

    assert NETNS_FAULTS == {"host_loss", "tcp_reset", "link_down", "blackhole"}
    for kind in NETNS_FAULTS:
        check_runnable(run(kind, "data"))
    # The control link carries NVRx's own store: a reset there hung NVRx (its client does not reconnect).
    with pytest.raises(ConfigError, match="fault.link=control with strategy=checkpoint_restore is not supported"):
        check_runnable(run("tcp_reset", "control"))
