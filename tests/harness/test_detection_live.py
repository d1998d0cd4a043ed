"""Fast detection in real harness runs: a SIGKILLed rank under strategy=accelpact is reported to the
survivor by the parent's death notice (waitpid), not at the recovery deadline, and the row says how."""

from __future__ import annotations

import pytest
from harness_test_helpers import TINY, read_row, run_harness

from harness.events import read_events

NOTICE_BOUND_S = 2.0  # the bound with the harness parent (a loaded 2-core host included)


@pytest.mark.slow  # default-suite time (issue 19: CI pytest <= 12 min); death detection stays covered by test_detection_dead
def test_kill_is_seen_through_the_parents_notice_within_bound(kill_fallback_run):
    # A SIGKILLed rank 1 under accelpact with snapshots off (no heal): the run is shared with
    # test_strategies (tests/harness/conftest.py). Its recovery deadline is 5 s, so a survivor that
    # waited it out instead of reading the notice would miss the bound below.
    done, run_dir = kill_fallback_run.done, kill_fallback_run.run_dir
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    row = read_row(run_dir)
    assert row["status"] == "ok" and row["fallback"] is True and row["relaunches"] == 1
    events = read_events(run_dir)
    [kill] = [e for e in events if e["kind"] == "fault"]
    [fallback] = [e for e in events if e["kind"] == "fallback"]
    assert fallback["rank"] == 0 and fallback["detected_by"] == "notice", fallback
    latency = fallback["t"] - kill["t"]
    assert 0 < latency <= NOTICE_BOUND_S, f"survivor fell back {latency:.2f} s after the SIGKILL"
    assert row["detected_by"] == "notice"
    assert 0 < row["detection_latency_s"] <= NOTICE_BOUND_S


def test_store_server_sets_a_key_from_a_stdin_line(tmp_path):
    # Namespace runs: the parent writes notices through the bridge-namespace server's stdin.
    import datetime
    import subprocess
    import sys

    import torch.distributed as dist
    from harness_test_helpers import harness_env

    server = subprocess.Popen(
        [sys.executable, "-m", "harness.faults.store_server", "--host", "127.0.0.1"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=harness_env(),
        cwd=tmp_path,
    )
    try:
        _, host, port = server.stdout.readline().split()
        value = b'{"rank": 1}'
        server.stdin.write(f"SET tok/dead/1 {value.hex()}\nSET bad line\n")
        server.stdin.flush()
        client = dist.TCPStore(host, int(port), None, False, timeout=datetime.timedelta(seconds=20))
        client.wait(["tok/dead/1"], datetime.timedelta(seconds=20))
        assert client.get("tok/dead/1") == b'{"rank": 1}'
    finally:
        server.stdin.close()
        server.wait(timeout=20)


def test_stall_timeout_at_or_above_the_pg_timeout_is_refused_in_one_line(tmp_path):
    done = run_harness(
        [*TINY, "strategy=accelpact", "cluster.pg_timeout_s=30", "strategy.stall_timeout_s=30"], tmp_path, timeout=120
    )
    assert done.returncode != 0
    err = [line for line in (done.stdout + done.stderr).splitlines() if "stall_timeout_s" in line]
    assert err and "strategy.stall_timeout_s=15" in err[0], done.stdout[-2000:] + done.stderr[-2000:]


def test_blackhole_shorter_than_the_pg_timeout_is_allowed_with_the_watchdog():
    from harness.app.capabilities import check_runnable
    from harness.app.validate import ConfigError
    from harness.schema import RunConfig
    from harness.strategies.snapshot_config import AccelpactConfig

    run = RunConfig(strategy=AccelpactConfig(name="accelpact"))
    run.fault.kind, run.fault.at_step = "blackhole", 3
    run.cluster.pg_timeout_s, run.fault.outage_s, run.train.steps = 120.0, 8.0, 10
    run.strategy.stall_timeout_s = 3.0
    try:
        check_runnable(run)
    except ConfigError as exc:
        assert "namespaces" in str(exc), exc  # only the machine may refuse it, never the outage length
    run.strategy.stall_timeout_s = 0  # watchdog off: TCP would absorb it, refused as before
    import pytest

    with pytest.raises(ConfigError, match="absorb"):
        check_runnable(run)
