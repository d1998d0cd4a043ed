"""The two designs (not built) the simulator expresses, and the table's winner line: a design row is never
the measured winner, and each design changes only what it says it changes."""

from __future__ import annotations

from harness import strategies
from harness.fleet.config import Cluster
from harness.scale import scaling as sc
from harness.scale.heal_measured import HEAL_BUILDS
from harness.scale.outcomes import DESIGN_BUILDS, outcome_table
from harness.scale.project import Projection


def _by_build() -> dict[str, str]:
    return {sim.build: n for n, sim in strategies.simulated().items()}


def test_designs_are_registered_and_labelled_as_designs():
    names = _by_build()
    for build in DESIGN_BUILDS:
        assert build in names
        assert strategies.simulated()[names[build]].label.startswith("design, not built")


def test_grow_replaces_only_the_world_rebuild_after_a_lost_rank():
    names = _by_build()
    heal, grow = names[HEAL_BUILDS[0]], names[DESIGN_BUILDS[0]]
    c = Cluster(gpus=100_000)
    t = outcome_table(c, (heal, grow))
    assert t[heal]["gpu_host_loss"].parts["rebuild"] > 100.0  # the world's communicator at 100k
    assert t[grow]["gpu_host_loss"].parts["rebuild"] < 1.0
    assert t[grow]["gpu_host_loss"].parts["spare"] == t[heal]["gpu_host_loss"].parts["spare"]
    assert t[grow]["transient_network"] == t[heal]["transient_network"]


def test_hsdp_continue_charges_the_failed_group_by_its_share():
    names = _by_build()
    heal, cont = names[HEAL_BUILDS[0]], names[DESIGN_BUILDS[1]]
    c = Cluster(gpus=100_000, replica_gpus=1000)
    t = outcome_table(c, (heal, cont))
    host = t[cont]["gpu_host_loss"]
    assert host.parts["degraded"] < sc.spare_s(c) * 1000 / 100_000 * 1.5 + 1.0
    assert host.downtime_s < t[heal]["gpu_host_loss"].downtime_s / 10
    assert t[cont]["software_bug"] == t[heal]["software_bug"]  # every replica hits a recurring bug


def _p(name: str, ettr: float, ci: float = 0.001) -> Projection:
    return Projection(name, 100_000, True, best_ettr=ettr, best_ci=ci, badput={"gpu_host_loss": 1 - ettr}, driver="x")


def test_winner_line_names_the_best_measured_row_not_a_design():
    from experiments.scale_projection_table import winner_md

    names = _by_build()
    sims = strategies.simulated()
    measured = [n for n, s in sims.items() if not s.fault_free and s.build not in DESIGN_BUILDS]
    rows = [_p(n, 0.5 + 0.01 * i) for i, n in enumerate(measured)]
    rows.append(_p(names[DESIGN_BUILDS[1]], 0.99))
    text = winner_md(rows, 100_000)
    assert f"Winner at 100,000 GPUs, among the strategies whose costs are measured: `{measured[-1]}`" in text
    assert f"Design, not built: `{names[DESIGN_BUILDS[1]]}`" in text
