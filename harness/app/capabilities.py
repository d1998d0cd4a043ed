"""Which strategies and faults this checkout can actually run, on this machine, with this config.

Kept apart from validation on purpose: every shipped experiment must compose and validate even where
its strategy or fault cannot run here (no namespaces, no NVRx); only launching one is refused, before
anything starts, with an error that names what still works. Every rule comes from the strategy's and
the fault's spec; nothing here knows a strategy or fault by name.
"""

from __future__ import annotations

import shutil

from harness import strategies
from harness.faults import registry as faults
from harness.faults.placement import unmet_need
from harness.faults.schedule import ScheduleError, plan_faults
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
    strategy = strategies.get(run.strategy.name)
    fault = faults.get(run.fault.kind)
    try:
        plan_faults(run.fault, run.train.steps, run.checkpoint.interval)
    except ScheduleError as exc:
        raise ConfigError(str(exc)) from exc
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
    if run.cluster.launch == RankLaunch.srun and (fault.where in ("parent", "netns") or run.cluster.hosts):
        what = f"cluster.hosts={run.cluster.hosts}" if run.cluster.hosts else f"fault={fault.kind}"
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
    if fault.needs_netns or run.cluster.hosts:
        from harness.faults.netns import namespaces_available

        ok, why = namespaces_available()
        if not ok:
            what = (
                f"fault={fault.kind}"
                if fault.needs_netns
                else f"cluster={run.cluster.name} (cluster.hosts={run.cluster.hosts})"
            )
            raise ConfigError(
                f"{what} runs the ranks in network namespaces, which are unavailable: {why}"
                + ("" if fault.needs_netns else "; try `cluster=local_cpu`")
            )
    if strategy.check is not None:
        strategy.check(run)
