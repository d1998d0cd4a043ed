"""Which strategies and faults this checkout can actually run (some arrive in later issues).

Kept apart from validation on purpose: every shipped experiment must compose and validate even
while its strategy or fault is not live yet; only launching one is refused, before anything starts.
"""

from __future__ import annotations

from harness import strategies
from harness.schema import FaultKind, RunConfig

# Fault kinds wired into the launcher/ranks. Issues adding injectors extend this set.
LIVE_FAULTS: set[FaultKind] = {FaultKind.none}


def check_runnable(run: RunConfig) -> None:
    from harness.validate import ConfigError

    if not strategies.is_available(run.strategy.name.value):
        raise ConfigError(
            f"strategy={run.strategy.name.value} is not implemented in this checkout yet; use `strategy=none`"
        )
    if run.fault.kind not in LIVE_FAULTS:
        live = ", ".join(sorted(k.value for k in LIVE_FAULTS))
        raise ConfigError(
            f"fault={run.fault.kind.value} is not implemented in this checkout yet (live: {live}); use `fault=none`"
        )
