"""The load guard: /proc/stat parsing, the steal share, the one overload line, the row's columns."""

from __future__ import annotations

import math
import time

import pytest

from harness.parent.load_guard import LoadGuard, cores_used, cpu_times, overload_line, steal_share


def test_cpu_times_reads_the_aggregate_line(tmp_path):
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text("cpu  100 0 50 800 10 0 5 35 0 0\ncpu0 50 0 25 400 5 0 2 18 0 0\n")
    assert cpu_times(str(stat)) == (35, 1000)
    assert cpu_times(str(tmp_path / "missing")) is None
    stat.write_text("intr 1 2 3\n")
    assert cpu_times(str(stat)) is None


def test_steal_share():
    assert steal_share((10, 1000), (30, 1200)) == pytest.approx(10.0)
    assert math.isnan(steal_share(None, (1, 2))) and math.isnan(steal_share((5, 100), (5, 100)))


def test_cores_used_is_capped_by_the_host():
    assert cores_used(2, 1, 2) == 2 and cores_used(4, 4, 2) == 2 and cores_used(1, 0, 8) == 1


def test_overload_line_only_above_the_cores():
    assert overload_line(1.9, 2) is None and overload_line(math.nan, 2) is None
    line = overload_line(6.3, 2)
    assert line is not None and "6.3" in line and "2 core" in line and "\n" not in line


def test_guard_records_before_and_during_and_says_it_once():
    loads = iter([1.0, 5.0, 7.0, 3.0] + [3.0] * 1000)
    stats = iter([(0, 1000), (50, 2000)])
    said: list[str] = []
    guard = LoadGuard(
        cores=2, every_s=0.01, loadavg=lambda: next(loads), stat=lambda: next(stats), say=said.append
    ).start()
    deadline = time.time() + 10
    while len(guard.samples) < 3 and time.time() < deadline:
        time.sleep(0.01)
    cols = guard.stop()
    assert cols["load_before"] == 1.0 and cols["load_max"] == 7.0 and cols["cores_used"] == 2
    assert 3.0 <= cols["load_mean"] <= 5.0
    assert cols["steal_pct"] == pytest.approx(5.0)
    assert cols["load_overloaded"] is True and len(said) == 1


def test_guard_stays_quiet_below_the_cores():
    said: list[str] = []
    cols = LoadGuard(cores=2, every_s=0.01, loadavg=lambda: 0.5, stat=lambda: None, say=said.append).start().stop()
    assert said == [] and cols["load_overloaded"] is False and math.isnan(cols["steal_pct"])
