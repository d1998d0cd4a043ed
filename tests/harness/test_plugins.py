"""A strategy, a fault kind and a backend registered from THIS module (no harness or accelpact file edited)
run through `python -m harness` and the scale simulator.

This module is itself the plugin: the runs below name it in ``HARNESS_PLUGINS``, so the parent and
every rank import it and it registers, at import time:

- strategy ``toy_plain``: the plain step, plus a ``toy_step`` event per step, and its own relaunch policy;
- strategy ``toy_skips_points``: a step that never reaches the clip/vote fault points (the base class
  must stop it loudly instead of reporting a fault that never fired);
- fault kind ``toy_pause``: applied by the parent, which SIGSTOPs the rank for 0.3 s (well inside the
  process-group timeout, so training just waits) and records the fault with a marker field;
- backend ``toy_gloo``: accelpact's gloo backend under another c10d name (registered with accelpact's
  backend registry, which validation reads, and with c10d, which builds a gloo process group for it);
- ``toy_plain``'s simulation: a mechanism of this module that the scale simulator projects.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch.distributed as dist
from harness_test_helpers import TINY, harness_env, read_row, run_harness

from accelpact import backends
from accelpact.backends import GlooBackend
from harness import strategies
from harness.faults import registry as faults
from harness.faults.registry import FaultSpec
from harness.fleet.config import Cluster, Outcome
from harness.rank.strategies.base import Strategy, forward_backward
from harness.strategies.spec import Simulation, StrategySpec

HERE = Path(__file__).resolve().parent


class ToyPlain(Strategy):
    def run_step(self, step, tokens):
        self.ctx.events.emit("toy_step", step=step)
        return self.plain_step(step, tokens)


class ToySkipsPoints(Strategy):
    def run_step(self, step, tokens):
        loss = forward_backward(self.ctx.model, tokens)
        self.ctx.optimizer.step()
        self.ctx.optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())


def _toy_relaunch(exit_codes, first_failure):
    failed = {r: c for r, c in exit_codes.items() if c not in (0, None)}
    return f"toy relaunch after rank(s) {sorted(failed)}" if failed else None


def _toy_pause(driver, req):
    rank = int(req["rank"])
    driver.signal(rank, signal.SIGSTOP)
    driver.record(req, toy_marker="paused by the toy fault", outage_s=0.3)
    driver.ack(req)
    driver.stop_until(rank, time.time() + 0.3)


def toy_outcome(cluster: Cluster, cls: str) -> Outcome:
    """The toy's recovery in the simulator: a fixed 42 s stop, one step lost, for every failure class."""
    return Outcome("step", {"restart": 42.0}, "toy: a fixed stop")


class ToyGloo(GlooBackend):
    name = "toy_gloo"


def _toy_gloo_group(store, rank, world_size, timeout):
    return dist.ProcessGroupGloo(store, rank, world_size, timeout)


backends.register(ToyGloo)
if "toy_gloo" not in dist.Backend.backend_list:
    dist.Backend.register_backend("toy_gloo", _toy_gloo_group, devices=["cpu"])
strategies.register(
    StrategySpec(
        name="toy_plain",
        rank_class=f"{__name__}:ToyPlain",
        description="test plugin: plain step + toy events",
        label="toy",
        color="tab:purple",
        order=50,
        relaunch=_toy_relaunch,
        simulation=Simulation(f"{__name__}:toy_outcome", "toy (a fixed stop)"),
    )
)
strategies.register(
    StrategySpec(
        name="toy_skips_points",
        rank_class=f"{__name__}:ToySkipsPoints",
        description="test plugin: skips fault points",
        label="toy (skips points)",
        color="tab:brown",
        order=51,
    )
)
faults.register(
    FaultSpec("toy_pause", "test plugin: SIGSTOP the rank for 0.3 s", where="parent", parent_apply=_toy_pause)
)


def _plugin_run(args: list[str], tmp: Path):
    env = harness_env()
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env["PYTHONPATH"]])
    env["HARNESS_PLUGINS"] = Path(__file__).stem
    import subprocess

    from harness_test_helpers import harness_cmd

    return subprocess.run(harness_cmd(args, tmp), cwd=tmp, env=env, capture_output=True, text=True, timeout=300)


def test_plugin_strategy_fault_and_backend_run_through_python_m_harness(tmp_path):
    run_dir = tmp_path / "run"
    done = _plugin_run(
        [
            *TINY,
            "train.steps=6",
            "strategy=toy_plain",
            "fault=toy_pause",
            "fault.schedule=at_step",
            "fault.at_step=3",
            "fault.ranks=[1]",
            "fault.phase=vote",
            "cluster.backend=toy_gloo",
            f"hydra.run.dir={run_dir}",
        ],
        tmp_path,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    row = read_row(run_dir)
    assert row["status"] == "ok" and row["strategy"] == "toy_plain" and row["fault"] == "toy_pause"
    assert row["backend"] == "toy_gloo" and row["ranks_agree"]
    assert row["faults"] == 1
    rank_events = [
        json.loads(line) for r in (0, 1) for line in (run_dir / "events" / f"rank{r}.jsonl").read_text().splitlines()
    ]
    assert sorted(e["step"] for e in rank_events if e["kind"] == "toy_step") == sorted(list(range(6)) * 2)
    parent = [json.loads(line) for line in (run_dir / "events" / "parent.jsonl").read_text().splitlines()]
    fired = [e for e in parent if e["kind"] == "fault"]
    assert len(fired) == 1 and fired[0]["fault"] == "toy_pause" and fired[0]["toy_marker"]
    assert fired[0]["step"] == 3 and fired[0]["ranks"] == [1]


@pytest.mark.slow  # default-suite time (issue 19: CI pytest <= 12 min); the plugin run through python -m harness stays
def test_a_strategy_that_skips_a_fault_point_fails_loudly(tmp_path):
    run_dir = tmp_path / "run"
    done = _plugin_run(
        [
            *TINY,
            "train.steps=5",
            "strategy=toy_skips_points",
            "fault=socket_reset",
            "fault.schedule=at_step",
            "fault.at_step=2",
            "fault.phase=vote",
            f"hydra.run.dir={run_dir}",
        ],
        tmp_path,
    )
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    row = read_row(run_dir)
    assert row["status"] == "failed"
    logs = "".join((run_dir / "logs" / f"rank{r}.log").read_text() for r in (0, 1))
    assert "FaultPointMissed" in logs and "without reaching the fault point(s) ['vote']" in logs


def test_unregistered_names_are_refused_with_the_registered_ones(tmp_path):
    done = run_harness([*TINY, "strategy.name=nope"], tmp_path)
    assert done.returncode == 2
    assert "strategy 'nope' is not registered" in done.stderr and "accelpact" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    done = run_harness([*TINY, "fault.kind=nope"], tmp_path)
    assert done.returncode == 2 and "fault.kind='nope' is not registered" in done.stderr


def test_plugin_strategy_runs_through_the_scale_simulator():
    from harness.fleet.sources import llama3_mix
    from harness.scale.outcomes import outcome_table
    from harness.scale.project import project

    assert "toy_plain" in strategies.simulated()
    table = outcome_table(Cluster(gpus=1024), ("none", "toy_plain"))
    assert {o.downtime_s for o in table["toy_plain"].values()} == {42.0}
    ref, toy = project(Cluster(gpus=1024), llama3_mix(), ["none", "toy_plain"], trials=2)
    assert ref.feasible and toy.feasible and toy.best_ettr < ref.best_ettr  # failures cost the toy its stops


def test_plugin_backend_is_validated_like_a_built_in_one():
    from harness.app.validate import cluster_problem
    from harness.machine import probe
    from harness.schema import RunConfig

    run = RunConfig()
    run.cluster.backend = "toy_gloo"
    assert cluster_problem(run, probe(with_gpus=False)) is None
    run.cluster.backend = "toy_nope"
    problem = cluster_problem(run, probe(with_gpus=False))
    assert problem is not None and "toy_gloo" in problem[0] and problem[1] == {"cluster.backend": "gloo"}


def test_registering_a_taken_name_with_another_spec_raises():
    with pytest.raises(ValueError, match="already registered"):
        strategies.register(
            StrategySpec(name="accelpact", rank_class="x:Y", description="", label="", color="", order=0)
        )
