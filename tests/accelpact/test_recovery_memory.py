"""Many recoveries in one process on 2 real gloo ranks: what each recovery leaves behind is bounded.

Not a timing test and not an RSS test (RSS moves with the allocator and the host): it counts the
suspects of the soak's growth per recovery (experiments.recovery_memory): RecoveryEvents kept by the
guard, abandoned generations, c10d's registries, threads and fds, and the Python heap (tracemalloc).
Each must stop growing once the log is full; before the RecoveryLog, guard.events kept every event
(every rank's report with it), and the Python heap grew with it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from accelpact.testing.session import run_session

RUNNER = "experiments.workloads.memory_probe:probe"
FAULTS, KEEP, EVERY = 30, 5, 5


@pytest.mark.slow  # ~30 recoveries under tracemalloc: 90 s on the loaded 2-core host
def test_what_recoveries_leave_behind_is_bounded(tmp_path: Path):
    sc = {
        "name": "probe",
        "faults": FAULTS,
        "every": EVERY,
        "keep_events": KEEP,
        "tracemalloc": True,
        "frames": 1,
        "model": {"layers": 2, "hidden": 64, "inter": 192},
    }
    s = run_session(
        tmp_path, RUNNER, [sc], world_size=2, pg_timeout_s=15.0, control_deadline_s=60.0, barrier=True, timeout_s=900
    )
    for rank, res in enumerate(s.job("probe")):
        samples = res["samples"]
        n = res["recoveries"]
        assert n >= FAULTS - 4, f"rank {rank}: only {n} recoveries"  # hangs are left out of the mix
        # After the log filled up and a warm-up (the first recoveries build caches); after the last.
        first, later = samples[2], samples[-1]
        assert first["recoveries"] >= KEEP and later["recoveries"] >= first["recoveries"] + 3 * EVERY, samples
        assert later["events_kept"] == KEEP and later["objects"]["RecoveryEvent"] <= KEEP, later
        assert later["abandoned"] <= 1, later  # only a generation still within its PG timeout
        assert later["c10d"] == samples[0]["c10d"], (samples[0]["c10d"], later["c10d"])
        assert later["threads"] == first["threads"], (first["threads"], later["threads"])
        assert later["fds_by_kind"] == first["fds_by_kind"], (first["fds_by_kind"], later["fds_by_kind"])
        # Python heap: measured 0.5-1.6 KiB per recovery once the log is full, ~5 KiB with every
        # event kept (the events, every rank's report in each).
        grown_kib = (later["py_traced_mib"] - first["py_traced_mib"]) * 1024
        per = grown_kib / (later["recoveries"] - first["recoveries"])
        assert per < 3.0, f"rank {rank}: the Python heap grew {per:.1f} KiB per recovery ({grown_kib:.0f} KiB)"
