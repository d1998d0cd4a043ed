"""Every pair of shipped group options, validated together: a refusal names its reason and fix, an
acceptance is runnable as the parent sets the run up (``config_oracles``).

The fuzz draws combinations at random; this covers each (option of group A, option of group B) pair
deterministically, for the groups whose options interact (fault, cluster, strategy, checkpoint, model).
It skips Hydra's per-combination composition: the default config is composed once, and each group's
typed options are loaded from conf/ the way a ``group=option`` override merges them
(``harness.app.config.load_group``: the YAML onto the group's schema). A covering set of ~60
combinations runs by default (well under a second of validation); every combination under ``slow``.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator

import pytest
from config_oracles import check_parent_can_run, check_refusal

from harness.app import capabilities
from harness.app.config import compose, load_catalogue, load_group, to_run_config
from harness.app.validate import ConfigError, validate
from harness.machine import probe
from harness.schema import RunConfig

GROUPS = ("fault", "cluster", "strategy", "checkpoint", "model")


@pytest.fixture(scope="module")
def world() -> tuple[RunConfig, dict[str, dict[str, object]], object, object]:
    return to_run_config(compose([])), {g: load_group(g) for g in GROUPS}, probe(with_gpus=False), load_catalogue()


def pairwise(sizes: list[int]) -> Iterator[tuple[int, ...]]:
    """A covering set: every pair of values of two different positions appears in some row (greedy)."""
    uncovered = {
        (i, a, j, b)
        for i, j in itertools.combinations(range(len(sizes)), 2)
        for a in range(sizes[i])
        for b in range(sizes[j])
    }
    rows = list(itertools.product(*[range(n) for n in sizes]))
    while uncovered:
        best = max(
            rows,
            key=lambda r: sum((i, r[i], j, r[j]) in uncovered for i, j in itertools.combinations(range(len(r)), 2)),
        )
        uncovered -= {(i, best[i], j, best[j]) for i, j in itertools.combinations(range(len(best)), 2)}
        yield best


def check_combination(world, names: tuple[str, ...]) -> bool:
    """Validate one combination as ``python -m harness --validate-only`` would; True if it validated."""
    base, options, machine, catalogue = world
    run = dataclasses.replace(base, **{g: dataclasses.replace(options[g][n]) for g, n in zip(GROUPS, names)})
    context = " ".join(f"{g}={n}" for g, n in zip(GROUPS, names))
    try:
        validate(run, machine, catalogue)
        capabilities.check_runnable(run)
    except ConfigError as exc:
        check_refusal(context, str(exc))
        return False
    check_parent_can_run(run)
    return True


def _names(world) -> list[list[str]]:
    return [sorted(world[1][g]) for g in GROUPS]


def test_every_pair_of_group_options(world):
    names = _names(world)
    rows = list(pairwise([len(n) for n in names]))
    results = [check_combination(world, tuple(names[i][v] for i, v in enumerate(row))) for row in rows]
    # Both outcomes occur, or the oracles checked only one side (e.g. a machine that refuses everything).
    assert any(results) and not all(results), f"{sum(results)} of {len(results)} validated"
    pairs = {(i, r[i], j, r[j]) for r in rows for i, j in itertools.combinations(range(len(r)), 2)}
    assert len(pairs) == sum(len(names[i]) * len(names[j]) for i, j in itertools.combinations(range(len(names)), 2))


@pytest.mark.slow
def test_every_combination_of_group_options(world):
    for combo in itertools.product(*_names(world)):
        check_combination(world, combo)


def test_a_registered_plugin_fault_without_a_yaml_is_not_a_shipped_option(monkeypatch):
    """test_plugins registers a fault kind with no conf/ YAML when it is imported; in the full suite that
    happened before this module's fixture, whose load_group('fault') then opened a missing YAML (CI at a887f68)."""
    import importlib

    from harness.faults import registry as faults
    from harness.registry import Registry

    fresh = Registry(
        "fault kind",
        faults.FaultSpec,
        lambda s: s.kind,
        lambda: importlib.import_module("harness.faults.kinds").BUILTIN,
    )
    monkeypatch.setattr(faults, "_REGISTRY", fresh)  # this test's registration stays out of the others
    faults.register(
        faults.FaultSpec(
            "cross_groups_plugin_probe",
            "a plugin fault kind with no YAML",
            where="parent",
            parent_apply=lambda driver, req: None,
        )
    )
    assert "cross_groups_plugin_probe" in faults.kinds()
    loaded = load_group("fault")
    assert "cross_groups_plugin_probe" not in loaded and "kill" in loaded
