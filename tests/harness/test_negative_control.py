"""The negative-control plugin (examples/negative_control.py): registered through the plugin mechanism,
AccelPact's spec with its own rank class, not the strategy under test, and a sleep only in recoveries.
Whether a comparison sees its loss is benchmarks/bench_negative_control.py's job (real runs)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(autouse=True)
def _unregister_afterwards():
    """The registry is process-wide: leave no plugin strategy behind for the tests that list strategies."""
    yield
    from harness import strategies

    strategies._REGISTRY._entries.pop("accelpact_slow_recovery", None)
    sys.modules.pop("negative_control", None)


def test_plugin_registers_a_slow_accelpact(monkeypatch):
    from harness import strategies
    from harness.plugins import load_plugins

    monkeypatch.syspath_prepend(str(EXAMPLES))
    assert load_plugins({"HARNESS_PLUGINS": "negative_control"}) == ["negative_control"]
    control = sys.modules["negative_control"]
    spec = strategies.get(control.NAME)
    assert spec.rank_class == "negative_control:SlowRecoveryStep" and not spec.recovers_in_memory
    assert strategies.under_test().name == "accelpact"  # the gain is still AccelPact's over the control
    assert spec.relaunch is strategies.get("accelpact").relaunch


def test_sleeps_in_recoveries_only(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    import negative_control

    slept: list[float] = []
    monkeypatch.setattr(negative_control.time, "sleep", slept.append)
    for phase in ("step_start", "clip_allreduce", "vote", "post_vote"):
        negative_control.SlowRecoveryStep._sleep_in_recovery(phase, 3)
    assert slept == []
    negative_control.SlowRecoveryStep._sleep_in_recovery("recovery", 3)
    assert slept == [negative_control.SLEEP_S] == [2.0]
