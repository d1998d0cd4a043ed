"""A negative control for the comparison: AccelPact plus 2 s of sleep in every recovery, as a plugin.

    PYTHONPATH=examples HARNESS_PLUGINS=negative_control python -m harness \
        strategy=accelpact,accelpact_slow_recovery fault.at_age=5

registers strategy ``accelpact_slow_recovery`` through the plugin mechanism (``harness.plugins``; no
harness file names it). Its ranks run plain AccelPact, except that every in-memory recovery sleeps
``SLEEP_S`` once the new process group is built, before its first collective (the guard's "recovery"
phase hook). The sleep is inside the recovery, so it is measured as recovery badput (rebind), exactly as
a slower recovery would be. A comparison must then find AccelPact better than this strategy, with an
interval that excludes equality: if it does not, the comparison cannot see a real 2 s loss.
benchmarks/bench_negative_control.py runs that check.
"""

from __future__ import annotations

import dataclasses
import time

from harness import strategies
from harness.rank.strategies.accelpact import AccelPactStep
from harness.strategies.accelpact import SPEC as ACCELPACT

NAME = "accelpact_slow_recovery"
SLEEP_S = 2.0


class SlowRecoveryStep(AccelPactStep):
    """AccelPact whose every recovery takes ``SLEEP_S`` longer."""

    def __init__(self, ctx) -> None:  # noqa: ANN001 - harness.rank.strategies.base.TrainContext
        super().__init__(ctx)
        self.guard.phase_hooks.append(self._sleep_in_recovery)

    @staticmethod
    def _sleep_in_recovery(phase: str, step: int) -> None:
        if phase == "recovery":
            time.sleep(SLEEP_S)


if NAME not in strategies.names():
    strategies.register(
        dataclasses.replace(
            ACCELPACT,
            name=NAME,
            rank_class=f"{__name__}:SlowRecoveryStep",
            description=f"negative control: AccelPact + {SLEEP_S:g} s of sleep in every recovery",
            label=f"AccelPact + {SLEEP_S:g} s",
            color="tab:red",
            order=60,
            recovers_in_memory=False,
        )
    )  # AccelPact stays the strategy under test: the gain is over this one
