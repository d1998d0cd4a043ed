"""Each strategy's fixed per-step protection (``Simulation.per_step_tax``, harness.advise.taxes) and GEMINI's
model in the simulator: what the advisor charges besides the heal's chosen cadence."""

from __future__ import annotations

import pytest

from harness.advise.advice import protection_plan
from harness.advise.cost import CPU_HERE, GPU_NODE, Cadence, tax
from harness.advise.taxes import GEMINI_CAPTURE, TORCHFT_QUORUM_S, gemini_capture, torchft_quorum
from harness.fleet.config import ROLLBACK_CHECKPOINT, ROLLBACK_STEP, Cluster
from harness.fleet.sources import llama3_mix
from harness.scale.outcomes import outcome_table
from harness.strategies import simulated
from harness.strategies.spec import Simulation


def test_gemini_capture_is_the_unchecked_unconfirmed_heal_snapshot():
    c = Cluster(step_s=0.5, checkpoint_gb_per_gpu=0.4)
    heal = tax(CPU_HERE, 0.4e9, 0.5, Cadence(1, 1, True))
    gemini = gemini_capture(c, CPU_HERE)
    assert gemini == pytest.approx(tax(CPU_HERE, 0.4e9, 0.5, GEMINI_CAPTURE, checksum=False).fraction)
    assert 0 < gemini < heal.fraction  # no checksum, no wait for the replica
    assert tax(CPU_HERE, 0.4e9, 0.5, GEMINI_CAPTURE, checksum=False).checksum_s == 0.0
    assert gemini_capture(c, GPU_NODE) < gemini  # the DMA hides on a GPU node


def test_torchft_quorum_is_its_measured_8_ms_a_step():
    assert torchft_quorum(Cluster(step_s=2.0), CPU_HERE) == pytest.approx(TORCHFT_QUORUM_S / 2.0)


def test_the_advisor_charges_each_registered_per_step_tax():
    sims = simulated()
    charged = {n for n, s in sims.items() if s.per_step_tax}
    assert {"gemini", "torchft_peer_heal"} <= charged
    c = Cluster(gpus=1024)
    _, _, taxes = protection_plan(c, llama3_mix(), GPU_NODE, ("gemini", "torchft_peer_heal", "cold_restart"))
    assert taxes["gemini"] == pytest.approx(gemini_capture(c, GPU_NODE))
    assert taxes["torchft_peer_heal"] == pytest.approx(torchft_quorum(c, GPU_NODE))
    assert "cold_restart" not in taxes


def test_gemini_reloads_memory_except_after_a_fixed_bug():
    c = Cluster(gpus=1024)
    row = outcome_table(c, ("gemini",))["gemini"]
    cold = outcome_table(c, ("cold_restart",))["cold_restart"]
    for cls in ("transient_network", "hang", "process_crash", "gpu_host_loss"):
        assert row[cls].rollback == ROLLBACK_STEP
        assert row[cls].parts["restore"] < cold[cls].parts["restore"]  # memory, not the disk
    assert "spare" in row["gpu_host_loss"].parts
    assert row["software_bug"].rollback == ROLLBACK_CHECKPOINT
    assert row["software_bug"] == cold["software_bug"]


def test_a_per_step_tax_reference_must_name_a_function():
    with pytest.raises(ValueError, match="module:function"):
        Simulation("harness.scale.outcomes:no_failures", "x", per_step_tax="no_colon")
