"""CI's host-speed probe (.ci/host_speed.py): the /proc/stat arithmetic it prints beside the suite time."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("host_speed", ROOT / ".ci" / "host_speed.py")
host_speed = importlib.util.module_from_spec(_spec)
sys.modules["host_speed"] = host_speed  # dataclasses look their module up while the class is made
_spec.loader.exec_module(host_speed)  # type: ignore[union-attr]


def test_shares_split_busy_steal_and_idle_of_all_cores():
    # user nice system idle iowait irq softirq steal: 100 s wall on 2 cores = 20000 jiffies.
    before = host_speed.parse_cpu_line("cpu  1000 0 200 5000 100 0 50 10 0 0", wall=0.0)
    after = host_speed.parse_cpu_line("cpu  11000 0 2200 11000 200 0 1050 1010 0 0", wall=100.0)
    span, busy, steal = host_speed.shares(before, after)
    assert span == 100.0
    assert busy == pytest.approx(13000 / 20100) and steal == pytest.approx(1000 / 20100)


def test_a_line_that_is_not_the_cpu_total_or_a_sample_out_of_order_is_refused():
    with pytest.raises(ValueError, match="aggregate cpu line"):
        host_speed.parse_cpu_line("cpu0 1 2 3 4 5 6 7 8", wall=0.0)
    same = host_speed.parse_cpu_line("cpu  1 0 1 1 0 0 0 0", wall=5.0)
    with pytest.raises(ValueError, match="not later"):
        host_speed.shares(same, same)


def test_sample_then_share_on_this_host(tmp_path: Path):
    script = str(ROOT / ".ci" / "host_speed.py")
    subprocess.run([sys.executable, script, "sample", str(tmp_path / "a")], check=True)
    sum(range(2_000_000))  # some CPU time between the samples
    subprocess.run([sys.executable, script, "sample", str(tmp_path / "b")], check=True)
    out = subprocess.run(
        [sys.executable, script, "share", str(tmp_path / "a"), str(tmp_path / "b")],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert out.startswith("host cpu over ") and "% busy" in out and "% steal" in out
