"""torchft's simulated row takes its per-failure costs from the committed measured runs
(results/scale_projection/torchft_runs.csv): the survivors' stop and the failed group's start and heal."""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

import pytest

from harness import strategies
from harness.fleet.config import Cluster
from harness.scale import scaling as sc
from harness.scale.outcomes import outcome_table

CSV = Path(__file__).resolve().parents[2] / "results" / "scale_projection" / "torchft_runs.csv"
BUILD = "harness.scale.outcomes:replica_drops_and_peer_heals"


def _median(key: str) -> float:
    with CSV.open() as fh:
        return statistics.median(float(r[key]) for r in csv.DictReader(fh) if r["status"] == "ok")


def test_costs_come_from_the_measured_runs():
    names = [n for n, sim in strategies.simulated().items() if sim.build == BUILD]
    assert names, "no simulated strategy models torchft's replica drop"
    c = Cluster(gpus=16384, replica_gpus=1024)
    for name in names:
        host = outcome_table(c, (name,))[name]["gpu_host_loss"]
        assert host.parts["agreement"] == pytest.approx(_median("torchft_retry_recovery_max_s"))
        replica = (
            _median("heal_process_start_s")
            + sc.comm_init_s(1024)
            + _median("heal_transfer_s")
            + sc.heal_remote_s(c)
            + sc.spare_s(c)
        )
        assert host.parts["degraded"] == pytest.approx(replica * 1024 / 16384)
        assert "outside reference" not in strategies.simulated()[name].label


def test_collect_reads_the_row_and_the_replacement_heal(tmp_path):
    from harness.scale.torchft_measured import collect

    (tmp_path / "events").mkdir()
    (tmp_path / "row.csv").write_text(
        "run_id,status,torchft_retry_recovery_max_s,heal_process_start_s,load_mean\nr1,ok,0.7,25.0,7.5\n"
    )
    (tmp_path / "goodput.json").write_text('{"faults": [{"kind": "kill", "step": 10}]}')
    # As the harness writes them (every record has t and rank); torchft's heal adds its own to_step.
    (tmp_path / "events" / "rank0.jsonl").write_text(
        '{"kind": "heal", "t": 1.0, "rank": 0, "role": "sender", "heal_transfer_s": 9.0}\n'
        '{"kind": "step", "t": 2.0, "rank": 0, "step": 1, "start": 1.5, "end": 2.0}\n'
    )
    (tmp_path / "events" / "rank1.jsonl").write_text(
        '{"kind": "heal", "t": 3.0, "rank": 1, "role": "replacement", "heal_transfer_s": 0.5, "to_step": 25}\n'
    )
    row = collect(tmp_path)
    assert (row["run_id"], row["torchft_retry_recovery_max_s"], row["heal_process_start_s"]) == ("r1", "0.7", "25.0")
    assert (row["fault_kind"], row["fault_step"], row["heal_transfer_s"], row["healed_at_step"]) == (
        "kill",
        10,
        0.5,
        25,
    )
    assert row["git_sha"] == ""  # a column the row lacks stays blank, never invented
