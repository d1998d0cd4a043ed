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
    assert strategies.under_test().name in wanted and len(wanted) >= 3
    args = peers.sweep_overrides(wanted[:2], 3, Path("/tmp/x/sweep"), quick=False)
    assert args[0] == "experiment=peers" and f"strategy={','.join(wanted[:2])}" in args
    assert "compare.trials=3" in args and "hydra.sweep.dir=/tmp/x/sweep" in args
    assert not set(peers.QUICK) & set(args)
    assert set(peers.QUICK) <= set(peers.sweep_overrides(wanted, 2, Path("/tmp/x/sweep"), quick=True))


def test_a_refused_strategy_is_named_with_the_harness_reason():
    """GEMINI pairs each rank with a neighbour: on 3 ranks the harness refuses it (whether or not its extra
    is installed), and the experiment keeps that reason; AccelPact runs on 3 ranks."""
    out = peers.refused([strategies.under_test().name, "gemini"], quick=True, extra=["cluster.world_size=3"])
    assert set(out) == {"gemini"} and out["gemini"].startswith("strategy=gemini"), out


def test_table_md_has_the_verdict_the_reason_and_the_provenance(tmp_path):
    sweep, out = tmp_path / "sweep", tmp_path / "out"
    sweep.mkdir()
    (sweep / "table.md").write_text("# comparison\n\n| strategy | age | fault | gain_ci |\n|---|---|---|---|\n"
                                    "| torchft | 5 | kill | 1.10 [1.02, 1.20] (n=3) |\n")
    (sweep / "table.csv").write_text("strategy,age,fault,gain_ci\n")  # no cells: no plots to draw
    write_provenance(out, "python -m experiments.peers", {"trials": 3})
    peers.write_outputs(out, sweep, {"gemini": "strategy=gemini needs lm-resiliency"}, runtime_s=60.0)
    md = (out / "table.md").read_text()
    assert "| torchft | 5 | kill | 1.10 [1.02, 1.20] (n=3) |" in md
    assert "- `gemini`: strategy=gemini needs lm-resiliency" in md
    assert "python -m experiments.peers" in md and "git" in md
    assert (out / "table.csv").exists()
