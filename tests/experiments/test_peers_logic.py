"""experiments.peers' pure parts: the sweep it asks the harness for (the strategies conf/experiment/peers.yaml
names, trials, where the runs go), and the table.md it writes around the comparison's verdict, including
the line for a strategy the harness refused here. The measurement itself is results/peers."""

from __future__ import annotations

from pathlib import Path

from experiments import peers
from experiments.provenance import write_provenance
from harness import strategies


def test_the_sweep_is_the_experiments_strategies_with_trials():
    wanted = peers.swept_strategies()
    assert set(wanted) <= set(strategies.names()), wanted
    assert "accelpact_heal" in wanted and len(wanted) >= 3
    args = peers.sweep_overrides(wanted[:2], 3, Path("/tmp/x/sweep"), quick=False)
    assert args[0] == "experiment=peers" and f"strategy={','.join(wanted[:2])}" in args
    assert "compare.trials=3" in args and "hydra.sweep.dir=/tmp/x/sweep" in args
    assert not set(peers.QUICK) & set(args)
    assert set(peers.QUICK) <= set(peers.sweep_overrides(wanted, 2, Path("/tmp/x/sweep"), quick=True))


def test_the_host_loss_column_sweeps_host_loss_on_hosts_whatever_the_experiment_sweeps():
    """peers.yaml sweeps fault=socket_reset,kill; the host-loss run's overrides come after the experiment's, and
    the later override of a key wins in Hydra's sweep (BasicSweeper.split_arguments), so only host_loss runs."""
    args = peers.sweep_overrides(["accelpact"], 3, Path("/tmp/x/sweep"), quick=False, extra=peers.HOST_LOSS)
    assert args[-len(peers.HOST_LOSS) :] == list(peers.HOST_LOSS)
    assert "fault=host_loss" in args and "cluster=local_hosts" in args


def test_a_refused_strategy_is_named_with_the_harness_reason():
    """GEMINI pairs each rank with a neighbour: on 3 ranks the harness refuses it (whether or not its extra
    is installed), and the experiment keeps that reason; AccelPact runs on 3 ranks."""
    out = peers.refused([strategies.under_test().name, "gemini"], quick=True, extra=["cluster.world_size=3"])
    assert set(out) == {"gemini"} and out["gemini"].startswith("strategy=gemini"), out


def test_table_md_has_the_verdict_the_reason_and_the_provenance(tmp_path):
    sweep, out = tmp_path / "sweep", tmp_path / "out"
    sweep.mkdir()
    (sweep / "table.md").write_text(
        "# comparison\n\n| strategy | age | fault | gain_ci |\n|---|---|---|---|\n"
        "| torchft | 5 | kill | 1.10 [1.02, 1.20] (n=3) |\n"
    )
    (sweep / "table.csv").write_text("strategy,age,fault,gain_ci\n")  # no cells: no plots to draw
    write_provenance(out, "python -m experiments.peers", {"trials": 3})
    peers.write_outputs(out, sweep, {"gemini": "strategy=gemini needs lm-resiliency"}, runtime_s=60.0)
    md = (out / "table.md").read_text()
    assert "| torchft | 5 | kill | 1.10 [1.02, 1.20] (n=3) |" in md
    assert "- `gemini`: strategy=gemini needs lm-resiliency" in md
    assert "python -m experiments.peers" in md and "git" in md
    assert (out / "table.csv").exists()


def test_a_strategy_at_another_pace_whose_gains_disagree_is_called_out():
    """torchft's replica groups stepped ~40% faster than the FSDP reference here: the badput-based gain (at the
    reference's pace) said AccelPact better while the measured gain, the verdict, did not. table.md says so."""
    cells = [
        {
            "strategy": "torchft",
            "age": 5,
            "fault": "kill",
            "step_drift": 0.57,
            "gain_bp_ci": "1.445 [1.443, 1.470]",
            "verdict_bp": "AccelPact better",
            "gain_ci": "0.941 [0.892, 1.010]",
            "verdict": "within noise",
        },
        {
            "strategy": "cold_restart",
            "age": 5,
            "fault": "kill",
            "step_drift": 0.76,
            "gain_bp_ci": "1.7",
            "verdict_bp": "AccelPact better",
            "gain_ci": "1.5",
            "verdict": "AccelPact better",
        },
        {
            "strategy": "gemini",
            "age": 5,
            "fault": "kill",
            "step_drift": 1.02,
            "gain_bp_ci": "1.9",
            "verdict_bp": "AccelPact better",
            "gain_ci": "0.9",
            "verdict": "AccelPact worse",
        },
        {"strategy": "none (reference)", "age": None, "step_drift": 1.0},
    ]
    text = "\n".join(peers.pace_caveat(cells))
    assert "torchft kill age 5: step_drift 0.57" in text and "measured 0.941 [0.892, 1.010] (within noise)" in text
    assert "cold_restart" not in text  # both gains agree
    assert "gemini" not in text  # its pace is the reference's: the disagreement is not a pace effect
    assert peers.pace_caveat(cells[1:]) == []


def test_every_strategy_runs_on_the_same_hsdp_mesh_with_torchfts_groups_as_its_replicate_dimension():
    """experiment=peers composes to HSDP 2x2 for each swept strategy, torchft's groups of 2 are the replicate
    dimension, torchft runs at its own default heartbeat and Manager timeout, every replacement spawns, and
    AccelPact here is accelpact_heal."""
    from harness.app.config import compose, to_run_config
    from harness.app.validate import check_values
    from harness.strategies.torchft_config import torchft_config

    for name in peers.swept_strategies():
        run = to_run_config(compose(["experiment=peers", f"strategy={name}", "fault.at_age=5"]))
        check_values(run)
        assert (run.cluster.world_size, run.cluster.replicate) == (4, 2), name
        assert run.strategy.replacement_start.value == "spawn", name
        assert run.compare.ours == "accelpact_heal" and run.compare.trials >= 5
        if name == "torchft":
            ft = torchft_config(run.strategy)
            assert (ft.group_size, ft.heartbeat_timeout_ms, ft.timeout_s) == (2, 5000, 60.0)


def test_table_md_lists_what_differs_for_each_swept_strategy(tmp_path):
    wanted = peers.swept_strategies()
    missing = [s for s in wanted if not strategies.get(s).unequal]
    assert not missing, f"say what differs for {missing} in their StrategySpec.unequal"
    sweep, out = tmp_path / "sweep", tmp_path / "out"
    sweep.mkdir()
    (sweep / "table.md").write_text("# comparison\n\nverdict\n")
    write_provenance(out, "python -m experiments.peers", {"trials": 5})
    peers.write_outputs(out, sweep, {}, runtime_s=60.0, swept=["torchft", "gemini"])
    md = (out / "table.md").read_text()
    assert "could not equalise" in md and "HSDP 2x2" in md
    assert "- `torchft` (torchft): " + "; ".join(strategies.get("torchft").unequal) + "." in md
    assert "- `gemini`" in md and "- `cold_restart`" not in md  # only the strategies that ran


def test_a_cell_off_pace_over_its_whole_interval_gets_its_strategys_reason():
    """A drift whose interval lies outside 0.9-1.1 is named with the registry's reason; one whose interval
    reaches into 0.9-1.1 is noise, and a strategy the registry cannot explain says so."""
    from experiments.peers import pace_reasons

    cells = [
        {
            "strategy": "accelpact_heal",
            "age": 18,
            "fault": "kill",
            "step_drift_lo": 1.15,
            "step_drift_hi": 1.3,
            "step_drift_ci": "1.2 [1.15, 1.30] (n=5)",
        },
        {
            "strategy": "cold_restart",
            "age": 5,
            "fault": "kill",
            "step_drift_lo": 0.7,
            "step_drift_hi": 0.95,
            "step_drift_ci": "0.8 [0.70, 0.95] (n=5)",
        },
        {
            "strategy": "checkpoint_restore",
            "age": 5,
            "fault": "kill",
            "step_drift_lo": 0.6,
            "step_drift_hi": 0.8,
            "step_drift_ci": "0.7 [0.60, 0.80] (n=5)",
        },
    ]
    text = "\n".join(pace_reasons(cells))
    assert "`accelpact_heal` (kill age 18: 1.2 [1.15, 1.30] (n=5)): its per-step snapshot" in text
    assert "cold_restart" not in text
    assert "`checkpoint_restore` (kill age 5: 0.7 [0.60, 0.80] (n=5)): not explained by these runs." in text
    assert pace_reasons(cells[1:2]) == []
