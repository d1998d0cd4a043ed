"""The torch 2.15 reconfigure variant takes its costs from results/reconfigure/raw.json: the heal's
size-independent parts x the measured 2.15/2.13 heal ratio, and no rebind after a transient fault."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from harness import strategies
from harness.fleet.config import Cluster
from harness.scale.heal_measured import HEAL_BUILDS, HEAL_PARTS
from harness.scale.outcomes import outcome_table

RAW = Path(__file__).resolve().parents[2] / "results" / "reconfigure" / "raw.json"


def _names() -> tuple[str, str]:
    sims = strategies.simulated()
    by_build = {sim.build: n for n, sim in sims.items()}
    assert set(HEAL_BUILDS) <= set(by_build), "both heal variants must be registered"
    return by_build[HEAL_BUILDS[0]], by_build[HEAL_BUILDS[1]]


def test_heal_parts_scale_by_the_measured_ratio():
    d = json.loads(RAW.read_text())
    ratio = statistics.median(t["death_to_resumed_s"] for t in d["heal/2.15"]) / statistics.median(
        t["death_to_resumed_s"] for t in d["heal/2.13"]
    )
    rebind, reconf = _names()
    c = Cluster(gpus=1024)
    table = outcome_table(c, (rebind, reconf))
    for cls in ("process_crash", "gpu_host_loss"):
        for part in HEAL_PARTS:
            if cls == "gpu_host_loss" and part == "detection":
                continue  # the heartbeat rule's floor, the same for both
            assert table[reconf][cls].parts[part] == pytest.approx(table[rebind][cls].parts[part] * ratio)
        # What grows with the job is the same: the communicator build is not changed by reconfigure.
        assert table[reconf][cls].parts["rebuild"] == table[rebind][cls].parts["rebuild"]


def test_transient_fault_rebinds_nothing():
    rebind, reconf = _names()
    table = outcome_table(Cluster(gpus=1024), (rebind, reconf))
    assert table[reconf]["transient_network"].parts["rebind"] < table[rebind]["transient_network"].parts["rebind"] / 2
    assert "projected" not in strategies.simulated()[reconf].label
