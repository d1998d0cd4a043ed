"""harness.events: one typed dataclass per kind, one parser, and no reader that filters on kind strings.

Pure: records are written with EventLog into a temporary run directory and read back."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness import events as ev

ROOT = Path(__file__).resolve().parents[2]

# One record of every kind, with the fields its writer gives (harness and accelpact writers).
WRITTEN = {
    ev.Step: dict(
        step=3, t_start=1.0, t_end=2.0, loss=7.5, tokens=64, incarnation=1, replay=True, snapshot_wait_s=0.01
    ),
    ev.Fault: dict(fault="socket_reset", step=3, phase="vote", ranks=[0], index=0, age=5, by="rank", t_inject=1.5),
    ev.Recovery: dict(
        decision="retry",
        decision_detail={"action": "retry", "step": 3},
        step=3,
        generation=1,
        phase="vote",
        fault={"type": "CommFault", "message": "reset"},
        ranks=[0, 1],
        t_detected=1.6,
        detection_s=0.1,
        agreement_s=0.2,
        rebuild_s=0.01,
        rebind_s=0.001,
        first_collective_s=0.002,
        total_s=0.3,
        rounds=1,
        retire_s=0.02,
        detected_by="exception",
        round_times=[{"agreement": 0.2}],
        detection_from="injection",
        written=2.5,
        t=1.9,
    ),
    ev.Heal: dict(
        role="survivor",
        lost_ranks=[1],
        step=5,
        resume_step=4,
        replayed_steps=1,
        source="own",
        own_source="live",
        generation=2,
        replacement_start_s=1.0,
        heal_transfer_s=0.5,
        total_s=1.5,
        t=9.0,
        t_detected=7.5,
        rounds=1,
        load_s=0.1,
        bytes_read_from_disk=0,
        replacements_lost=[],
        written=9.1,
    ),
    ev.Replacement: dict(
        for_rank=1,
        exit_code=-9,
        dead_pid=10,
        pid=11,
        hot_spare=False,
        start="template",
        template_fallback="",
        template_import_s=3.0,
        t_death_seen=7.6,
        t_spawn=7.7,
        replacement=1,
        incarnation=0,
    ),
    ev.Relaunch: dict(reason="rank 1 exited", incarnation=1, exit_codes={"1": -9}),
    ev.Restart: dict(t_launch=0.5, t_ready=2.5, incarnation=0, replacement=False),
    ev.Restore: dict(from_step=4, t_start=3.0, t_end=3.5, bytes=1000),
    ev.Checkpoint: dict(
        step=4,
        mode="sync",
        t_start=2.0,
        t_end=2.4,
        staging="none",
        wait_s=0.0,
        t_complete=2.4,
        bytes_rank=500,
        bytes_total=1000,
        rss_before=1,
        rss_peak_delta=2,
        complete=True,
        bytes=1000,
    ),
    ev.Eval: dict(step=5, loss=2.5),
    ev.Fallback: dict(
        step=5, reason="RankLostError: rank 1", error="RankLostError", detected_by="notice", generation=2
    ),
    ev.Snapshots: dict(
        slot_bytes=100, count=12, wait_s=0.2, own_shm_bytes=200, replica_shm_bytes=0, replication={"push_mb_s": 3.0}
    ),
}


def test_every_kind_is_written_read_back_and_documented(tmp_path):
    assert set(WRITTEN) == set(ev.KINDS.values())
    with ev.EventLog(tmp_path, 0) as log:
        for cls, fields in WRITTEN.items():
            log.emit(cls, **fields)
        log.emit("toy_step", step=1)  # a plugin's own kind: written, and ignored by the parser
    read = ev.read_file_events(ev.events_path(tmp_path, 0))
    assert [type(e) for e in read] == list(WRITTEN)
    for e, (cls, fields) in zip(read, WRITTEN.items()):
        record = e.to_record()
        for name, value in fields.items():
            assert record[name] == value, (cls.KIND, name)  # declared and extra fields both survive
        assert e.rank == 0 and cls.KIND in ev.__doc__ and f":class:`{cls.__name__}`" in ev.__doc__
    heal = ev.of_type(read, ev.Heal)[0]
    assert heal.lost_ranks == (1,) and heal.extra["replacements_lost"] == []
    assert ev.of_type(read, ev.Fault)[0].t_injected == 1.5


def test_a_misspelt_field_fails_where_it_is_written(tmp_path):
    with ev.EventLog(tmp_path, 0) as log, pytest.raises(TypeError):
        log.emit(ev.Restore, t_start=1.0)  # t_end missing


@pytest.mark.parametrize(
    "record",
    [
        {"kind": "step", "rank": 0, "t": 1.0, "step": 3, "t_start": 2.0},  # torn: no t_end
        {"kind": "step", "rank": 0, "t": 1.0, "step": 3, "t_start": 4.0, "t_end": 3.0},  # ends first
        {"kind": "step", "rank": 0, "t": 1.0, "step": 3, "t_start": 2.0, "t_end": 3.0, "tokens": "50"},
        {"kind": "restore", "rank": 0, "t": 1.0, "t_start": 1.0, "t_end": float("nan")},
        {"kind": "recovery", "rank": 0, "t": 1.0, "detection_s": -0.1},
        {"kind": "fault", "rank": "0", "t": 1.0},
        {"rank": 0, "t": 1.0},  # no kind
    ],
)
def test_malformed_records_are_counted_not_used(record):
    log = ev.parse_records([record, {"kind": "telemetry", "rank": 0, "t": 1.0}])
    assert log.events == [] and log.skipped == 1


def test_readers_never_filter_on_a_kind_string():
    pattern = re.compile(r"""(\bkind\s*[!=]=|\[["']kind["']\]\s*[!=]=|get\(["']kind["']\)\s*[!=]=)""")
    offenders = []
    for package in ("harness", "experiments", "benchmarks"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.parent == ROOT / "harness" / "events":
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if pattern.search(line) and ('"kind"' in line or "'kind'" in line or "kind ==" in line):
                    offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    # Scenario dicts of benchmarks have their own "kind" (what the scenario runs), not an event's.
    offenders = [o for o in offenders if 'sc["kind"]' not in o]
    # A fault config's kind (what a run injects: fault.kind, run.fault.kind) is not an event's either.
    offenders = [o for o in offenders if not re.search(r"\bfault\.kind\s*[!=]=", o)]
    assert not offenders, "filter on typed events (harness.events.of_type) instead:\n" + "\n".join(offenders)
