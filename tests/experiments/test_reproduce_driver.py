"""experiments/reproduce.py: every registered experiment runs in order; missing ones are skipped with a
message; a failure does not stop the rest and makes the exit status non-zero."""

from __future__ import annotations

import types

import pytest

from experiments import reproduce
from experiments.reproduce import REGISTRY, Experiment, run_all, select


def _exp(name: str) -> Experiment:
    return Experiment(name, f"fake.{name}", "claim", 1)


def _module(rc=0, raises: Exception | None = None, calls: list | None = None):
    def main(argv):
        if calls is not None:
            calls.append(argv)
        if raises:
            raise raises
        return rc

    return types.SimpleNamespace(main=main)


def test_missing_modules_are_skipped_and_the_rest_still_run():
    calls: list = []
    logs: list[str] = []
    mods = {"fake.a": _module(calls=calls), "fake.c": _module(calls=calls)}
    out = run_all(
        [_exp("a"), _exp("b"), _exp("c")],
        quick=True,
        exists=lambda m: m in mods,
        load=mods.__getitem__,
        log=logs.append,
    )
    assert [o.status for o in out] == ["ok", "skipped", "ok"]
    assert calls == [["--quick"], ["--quick"]]
    assert any("b: SKIPPED" in line and "fake.b does not exist" in line for line in logs)


def test_a_failing_experiment_is_reported_and_does_not_stop_the_next():
    mods = {"fake.a": _module(raises=RuntimeError("boom")), "fake.b": _module(rc=3), "fake.c": _module()}
    out = run_all(
        [_exp("a"), _exp("b"), _exp("c")], quick=False, exists=lambda m: True, load=mods.__getitem__, log=lambda s: None
    )
    assert [o.status for o in out] == ["failed", "failed", "ok"]
    assert "boom" in out[0].detail and "returned 3" in out[1].detail


def test_registry_covers_every_claim_and_selection_keeps_its_order():
    names = [e.name for e in REGISTRY]
    assert names == [
        "goodput_vs_age",
        "process_loss",
        "peers",
        "peers_host_loss",
        "rebind_scaling",
        "bit_identity",
        "ckpt_overhead",
        "compile",
        "mixed_faults/steps60",
        "scale_projection",
    ]
    # A name is the results directory: the experiment's own, or a named run of it (mixed_faults/steps60)
    assert all(e.module == f"experiments.{e.name.split('/')[0]}" for e in REGISTRY)
    assert [e.name for e in select(REGISTRY, ["compile", "bit_identity"])] == ["bit_identity", "compile"]
    with pytest.raises(ValueError, match="choose from"):
        select(REGISTRY, ["nope"])


def test_module_exists_sees_real_and_missing_modules():
    assert reproduce.module_exists("experiments.ckpt_overhead")
    assert not reproduce.module_exists("experiments.no_such_experiment")
    assert not reproduce.module_exists("no_such_package.mod")
