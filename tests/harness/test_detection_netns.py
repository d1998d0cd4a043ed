"""Real link outages in network namespaces, ended by the stall watchdog, never by the PG timeout.

- a blackhole of 8 s with a 120 s PG timeout (TCP alone would sit it out and more): completes
  bit-identical, with the recovery's badput (detection + agreement + rebuild + rebind + first
  collective) within outage + 3 s;
- a link_down of 13 s with a 10 s PG timeout: completes bit-identical within outage + 3 s of the fault.
Each run is compared with a fault-free reference of the same config.
"""

from __future__ import annotations

import pytest
from harness_test_helpers import TINY, read_row, run_harness

from harness.events import read_events
from harness.identity import compare_runs

try:
    from harness.faults.netns import namespaces_available

    _OK, _WHY = namespaces_available()
except Exception as exc:  # noqa: BLE001 - reported as the skip reason
    _OK, _WHY = False, str(exc)

pytestmark = [pytest.mark.netns, pytest.mark.slow, pytest.mark.skipif(not _OK, reason=_WHY)]

BASE = [*TINY, "train.steps=10", "strategy=accelpact", "fault.ranks=[1]", "fault.at_step=5"]
MARGIN_S = 3.0


def _run(tmp_path, name: str, extra: list[str]):
    run_dir = tmp_path / name
    done = run_harness([*BASE, *extra, f"hydra.run.dir={run_dir}"], tmp_path, timeout=500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return run_dir, read_row(run_dir)


def _recovery_window(run_dir) -> tuple[float, float]:
    events = read_events(run_dir)
    [fault] = [e for e in events if e["kind"] == "fault"]
    ends = [e["t"] for e in events if e["kind"] == "recovery"]
    assert ends, "no recovery happened"
    return fault["t"], max(ends)


@pytest.mark.parametrize(
    "kind,outage_s,pg_timeout_s,stall_s", [("blackhole", 8.0, 120.0, 3.0), ("link_down", 13.0, 10.0, 3.0)]
)
def test_outage_is_recovered_soon_after_the_link_returns(tmp_path, kind, outage_s, pg_timeout_s, stall_s):
    ref_dir, ref = _run(tmp_path, "reference", ["strategy=none", "fault=none", f"cluster.pg_timeout_s={pg_timeout_s}"])
    run_dir, row = _run(
        tmp_path,
        kind,
        [
            f"fault={kind}",
            f"fault.outage_s={outage_s}",
            f"cluster.pg_timeout_s={pg_timeout_s}",
            f"strategy.stall_timeout_s={stall_s}",
        ],
    )
    assert row["status"] == "ok" and row["relaunches"] == 0 and row["recoveries"] >= 1, row["reason"]
    t_fault, t_done = _recovery_window(run_dir)
    assert t_done - t_fault <= outage_s + MARGIN_S, f"recovered {t_done - t_fault:.1f} s after a {outage_s} s outage"
    stall = sum(row[f"badput_{k}_s"] for k in ("detection", "agreement", "rebuild", "rebind"))
    assert stall <= outage_s + MARGIN_S, f"stall badput {stall:.1f} s for a {outage_s} s outage"
    result = compare_runs(ref_dir, run_dir)
    assert result.equal, result.describe()
