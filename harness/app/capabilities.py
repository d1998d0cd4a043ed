"""Which strategies and faults this checkout can actually run, on this machine, with this config.

Kept apart from validation on purpose: every shipped experiment must compose and validate even where
its strategy or fault cannot run here (no namespaces, no NVRx); only launching one is refused, before
anything starts, with an error that names what still works.
"""

from __future__ import annotations

from harness import strategies
from harness.app.schema import FaultKind, RunConfig, StrategyName

# Fault kinds wired into the launcher/ranks.
LIVE_FAULTS: set[FaultKind] = set(FaultKind)
# Faults that must outlast the process-group timeout to break a collective (shorter ones are absorbed).
_OUTAGE_FAULTS = {FaultKind.hang, FaultKind.blackhole, FaultKind.link_down}
OUTAGE_MARGIN_S = 2.0


def check_runnable(run: RunConfig) -> None:
    from harness.faults.schedule import NETNS_KINDS, ScheduleError, plan_faults
    from harness.app.validate import ConfigError

    if not strategies.is_available(run.strategy.name.value):
        raise ConfigError(
            f"strategy={run.strategy.name.value} is not implemented in this checkout yet; use `strategy=none`"
        )
    kind = run.fault.kind
    if kind not in LIVE_FAULTS:
        live = ", ".join(sorted(k.value for k in LIVE_FAULTS))
        raise ConfigError(
            f"fault={kind.value} is not implemented in this checkout yet (live: {live}); use `fault=none`"
        )
    try:
        # A comparison's base config is not run itself: its runs (one per age) are checked one by one.
        if not run.compare.enabled:
            plan_faults(run.fault, run.train.steps, run.checkpoint.interval)
    except ScheduleError as exc:
        raise ConfigError(str(exc)) from exc
    if kind in _OUTAGE_FAULTS and run.fault.outage_s <= run.cluster.pg_timeout_s + OUTAGE_MARGIN_S:
        need = run.cluster.pg_timeout_s + OUTAGE_MARGIN_S + 1
        raise ConfigError(
            f"fault={kind.value} with fault.outage_s={run.fault.outage_s} does not outlast the process-group "
            f"timeout (cluster.pg_timeout_s={run.cluster.pg_timeout_s}) by {OUTAGE_MARGIN_S:.0f} s, so TCP would "
            f"absorb it and nothing would break; set fault.outage_s={need:g} or lower cluster.pg_timeout_s"
        )
    if kind in NETNS_KINDS:
        from harness.faults.netns import namespaces_available

        ok, why = namespaces_available()
        if not ok:
            raise ConfigError(f"fault={kind.value} runs the ranks in network namespaces, which are unavailable: {why}")
        if run.strategy.name == StrategyName.checkpoint_restore:
            raise ConfigError(
                f"fault={kind.value} with strategy=checkpoint_restore is not supported: NVRx's store is hosted "
                "outside the ranks' namespaces; use fault=socket_reset, hang or kill with that strategy"
            )
    if run.strategy.name == StrategyName.checkpoint_restore:
        from harness.strategies.nvrx_restart import NvrxUnavailable, import_inprocess

        try:
            import_inprocess()
        except NvrxUnavailable as exc:
            raise ConfigError(str(exc)) from exc
