"""Which strategies and faults this checkout can actually run, on this machine, with this config.

Kept apart from validation on purpose: every shipped experiment must compose and validate even where
its strategy or fault cannot run here (no namespaces, no NVRx); only launching one is refused, before
anything starts, with an error that names what still works. Every rule comes from the strategy's and
the fault's spec; nothing here knows a strategy or fault by name.
"""

from __future__ import annotations

import shutil
from typing import Any

from harness import strategies
from harness.faults import planned
from harness.faults.placement import unmet_need
from harness.faults.schedule import ScheduleError, plan_faults
from harness.faults.spec import FaultSpec
from harness.schema import ConfigError, LinkPlane, RankLaunch, RunConfig

# An outage must outlast the process-group timeout by this much to break a collective (TCP absorbs
# shorter ones: a 3 s silent outage under a 5 s timeout just stalled the collective here).
OUTAGE_MARGIN_S = 2.0


def effective_stall_timeout_s(run: RunConfig) -> float | None:
    """The stall watchdog's timeout for this run, or None when it is off (``strategy.stall_timeout_s``:
    None = auto, 10 s when the PG timeout is longer; 0 = off)."""
    from accelpact.guard import DEFAULT_STALL_TIMEOUT_S  # lazy: torch

    stall = run.strategy.stall_timeout_s
    if stall is None:
        return DEFAULT_STALL_TIMEOUT_S if run.cluster.pg_timeout_s > DEFAULT_STALL_TIMEOUT_S else None
    return stall or None


def check_runnable(run: RunConfig) -> None:
    """Refuse, with one line naming the fix, a run this machine cannot give what its strategy and every
    fault kind it plans need (a trace's kinds: their union, ``harness.faults.planned``)."""
    strategy = strategies.get(run.strategy.name)
    try:
        plan_faults(run.fault, run.train.steps, run.checkpoint.interval, run.cluster.world_size)
    except ScheduleError as exc:
        raise ConfigError(str(exc)) from exc
    specs = planned.specs(run)
    for fault in specs:
        _check_outage(run, strategy, fault)
    remote = [f for f in specs if f.where in ("parent", "netns")]
    if run.cluster.launch == RankLaunch.srun and (remote or run.cluster.hosts):
        what = f"cluster.hosts={run.cluster.hosts}" if run.cluster.hosts else f"fault={remote[0].kind}"
        raise ConfigError(
            f"{what} acts on the ranks from the parent's host (signals, network namespaces), and under "
            f"cluster.launch=srun the ranks are srun tasks on the allocation's nodes; in-process faults work there: "
            f"try `fault=socket_reset`"
        )
    unmet = unmet_need(run)  # e.g. a fault that kills a child-hosted store, where the store is elsewhere
    if unmet is not None:
        raise ConfigError(unmet)
    if run.cluster.launch == RankLaunch.srun:
        if shutil.which("srun") is None:
            raise ConfigError(
                f"cluster={run.cluster.name} starts its ranks with srun, which is not on PATH here: run "
                "it where Slurm's client commands are (this machine, as root: `make slurm-up`), or "
                "try `cluster=local_cpu`"
            )
    netns = [f for f in specs if f.needs_netns]
    if netns and not run.cluster.hosts:
        # A trace's namespace kinds (host_loss, link faults) act on a host: without cluster.hosts every rank
        # would be a host of its own; say so rather than guess.
        if planned.is_trace(run.fault):
            raise ConfigError(
                f"{planned.describe(run)} draws {', '.join(f.kind for f in netns)}, which "
                f"{'need' if len(netns) > 1 else 'needs'} the ranks in network-namespace hosts (root); add "
                "`cluster=local_hosts`"
            )
    if netns or run.cluster.hosts:
        from harness.faults.netns import namespaces_available

        ok, why = namespaces_available()
        if not ok:
            what = planned.describe(run) if netns else f"cluster={run.cluster.name} (cluster.hosts={run.cluster.hosts})"
            raise ConfigError(
                f"{what} runs the ranks in network namespaces, which are unavailable: {why}"
                + ("" if netns else "; try `cluster=local_cpu`")
            )
    if strategy.check is not None:
        strategy.check(run)


def _check_outage(run: RunConfig, strategy: Any, fault: FaultSpec) -> None:
    """An outage must outlast what ends it (the stall watchdog, the strategy's own step timeout or the
    process-group timeout), else TCP absorbs it and nothing breaks."""

    watchdog_s = effective_stall_timeout_s(run) if strategy.recovers_in_memory else None
    if run.fault.link == LinkPlane.control:
        pass  # a control-link outage breaks no collective; it tests the control channel's deadlines
    elif fault.outage and watchdog_s is not None and run.fault.outage_s > watchdog_s:
        pass  # the stall watchdog ends it after watchdog_s, however long the PG timeout
    elif fault.outage and (own := strategy.step_timeout_s(run)) is not None and run.fault.outage_s > own:
        pass  # the strategy's own step timeout ends it (torchft's Manager), however long the PG timeout
    elif fault.outage and run.fault.outage_s <= run.cluster.pg_timeout_s + OUTAGE_MARGIN_S:
        need = run.cluster.pg_timeout_s + OUTAGE_MARGIN_S + 1
        raise ConfigError(
            f"fault={fault.kind} with fault.outage_s={run.fault.outage_s} does not outlast the process-group "
            f"timeout (cluster.pg_timeout_s={run.cluster.pg_timeout_s}) by {OUTAGE_MARGIN_S:.0f} s, so TCP would "
            f"absorb it and nothing would break; set fault.outage_s={need:g} or lower cluster.pg_timeout_s"
            + (
                " (or, under an in-memory strategy, strategy.stall_timeout_s below the outage: the watchdog "
                "then ends it)"
                if strategy.recovers_in_memory
                else ""
            )
        )
