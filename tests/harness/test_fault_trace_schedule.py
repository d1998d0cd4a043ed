"""fault=mixed: a seeded trace as the fault schedule (harness.faults.planned, harness.faults.schedule), the
union of what its kinds need from the parent, and the config errors. Pure logic: no process starts."""

from __future__ import annotations

import pytest

from harness.app.capabilities import check_runnable
from harness.app.config import compose, to_run_config
from harness.app.validate import ConfigError, check_values
from harness.faults import planned
from harness.faults.placement import StoreHome, placement, unmet_need
from harness.faults.schedule import ScheduleError, plan_faults
from harness.fleet.trace import draw_trace
from harness.parent import template
from harness.schema import FaultConfig, FaultSchedule


def _run(*overrides: str):
    return to_run_config(compose(["experiment=smoke", "fault=mixed", *overrides]))


def _trace_fault(seed: int = 0, faults: float = 10.0) -> FaultConfig:
    return FaultConfig(kind=planned.TRACE_KIND, schedule=FaultSchedule.trace, seed=seed, trace_faults=faults)


def test_each_trace_event_becomes_one_planned_fault_of_its_kind_step_and_rank():
    fault = _trace_fault(seed=1)
    plan = plan_faults(fault, 300, 20, world_size=2)
    trace = draw_trace("llama3", steps=300, faults=10, seed=1, world_size=2)
    assert len(plan) == len(trace.events) > 3
    assert [(p.step, p.kind, p.ranks) for p in plan] == [(e.step, e.kind, (e.rank,)) for e in trace.events]
    assert [p.index for p in plan] == list(range(len(plan)))
    assert {p.phase for p in plan} == {fault.phase.value}
    assert [p.age for p in plan] == [e.step % 20 for e in trace.events]
    assert len({p.kind for p in plan}) > 1  # seed 1 draws several kinds: each planned fault keeps its own


def test_the_same_seed_gives_the_same_plan_and_another_seed_another():
    a = plan_faults(_trace_fault(seed=3), 300, 0, world_size=2)
    assert a == plan_faults(_trace_fault(seed=3), 300, 0, world_size=2)
    assert a != plan_faults(_trace_fault(seed=4), 300, 0, world_size=2)


def test_the_trace_draws_ranks_over_the_world():
    ranks = {p.ranks[0] for p in plan_faults(_trace_fault(seed=0, faults=40), 300, 0, world_size=4)}
    assert ranks == {0, 1, 2, 3}


def test_the_reference_of_a_trace_run_injects_nothing():
    fault = _trace_fault()
    fault.kind = "none"
    assert plan_faults(fault, 300, 20, world_size=2) == []


def test_planned_kinds_are_the_traces_kinds():
    run = _run("fault.seed=1", "train.steps=300", "cluster=local_hosts")
    trace = draw_trace("llama3", steps=300, faults=10, seed=1, world_size=2)
    assert planned.planned_kinds(run.fault, 300, 2) == tuple(sorted({e.kind for e in trace.events}))
    assert [s.kind for s in planned.specs(run)] == list(planned.planned_kinds(run.fault, 300, 2))


def test_the_parent_takes_the_union_of_the_kinds_needs():
    # seed 3 over 300 steps: host_loss (namespaces, kills ranks), kill and socket_reset
    run = _run("fault.seed=3", "train.steps=300", "cluster=local_hosts", "strategy=accelpact_heal")
    kinds = set(planned.planned_kinds(run.fault, 300, 2))
    assert {"host_loss", "kill", "socket_reset"} <= kinds
    assert planned.injects(run) and planned.needs_netns(run)
    assert placement(run).namespaces and placement(run).store == StoreHome.bridge_namespace
    assert template.wanted(run)  # a rank kill in the trace: the heal's replacements fork from a template


def test_a_store_loss_in_the_trace_puts_the_store_in_a_child():
    run = _run("fault.seed=1", "train.steps=300")  # seed 1 draws control_store_loss and host_loss
    assert "control_store_loss" in planned.planned_kinds(run.fault, 300, 2)
    assert placement(run).namespaces  # host_loss: namespaces win, and the store cannot be killed there
    why = unmet_need(run)
    assert why is not None and "fault.seed" in why and "\n" not in why


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (("fault.schedule=at_step",), "fault.schedule=trace"),
        (("fault.mix=bogus",), "fault.mix"),
        (("fault.trace_faults=0",), "fault.trace_faults"),
        (("fault.trace_faults=500", "train.steps=100"), "fault.trace_faults"),
    ],
)
def test_bad_trace_configs_are_refused_in_one_line_naming_the_fix(overrides, needle):
    with pytest.raises(ConfigError) as err:
        check_values(_run(*overrides))
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_a_single_kind_under_schedule_trace_names_fault_mixed():
    run = to_run_config(compose(["experiment=smoke", "fault=kill", "fault.schedule=trace"]))
    with pytest.raises(ConfigError, match="fault=mixed"):
        check_values(run)
    with pytest.raises(ScheduleError, match="fault=mixed"):
        plan_faults(run.fault, run.train.steps, 0, 2)


def test_namespace_kinds_in_the_trace_need_local_hosts():
    run = _run("fault.seed=3", "train.steps=300", "strategy=cold_restart")  # draws host_loss, cluster=local_cpu
    check_values(run)
    with pytest.raises(ConfigError, match="cluster=local_hosts") as err:
        check_runnable(run)
    assert "host_loss" in str(err.value) and "\n" not in str(err.value)
