"""Whether a strategy=torchft run can run at all, checked on its config before any process starts.

torchft heals a restarted replica group only from a live one, so the world must split into at least two
groups and the fault must leave one of them untouched; torchft itself must be importable.
"""

from __future__ import annotations

from typing import Any

from harness.faults import registry as faults
from harness.schema import ConfigError
from harness.strategies.torchft_config import torchft_config
from harness.strategies.torchft_layout import groups_untouched, ranks_lost
from harness.strategies.torchft_report import TORCHFT_VERSION


def check_runnable(run: Any) -> None:
    """torchft must be importable, the world must split into >= 2 groups, and a fault that kills ranks
    must leave at least one group untouched (a restarted group heals only from a live peer)."""
    st = torchft_config(run.strategy)
    world = run.cluster.world_size
    if st.group_size < 1 or world % st.group_size or world // st.group_size < 2:
        raise ConfigError(
            f"strategy=torchft with cluster.world_size={world} and strategy.group_size="
            f"{st.group_size}: the world must split into at least 2 replica groups of equal size; "
            f"try strategy.group_size={max(1, world // 2)}"
        )
    replicate = run.cluster.replicate
    if replicate > 1 and st.group_size * replicate != world:
        raise ConfigError(
            f"strategy=torchft under HSDP (cluster.replicate={replicate}): torchft's replica groups are "
            f"the replicate dimension, so each holds cluster.world_size / cluster.replicate = "
            f"{world // replicate} rank(s); try `strategy.group_size={world // replicate}`"
        )
    for kind, ranks in _strikes(run):
        _check_fault(run, faults.get(kind), ranks)
    try:
        import torchft  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - ImportError or a broken install
        raise ConfigError(
            f"strategy=torchft needs torchft=={TORCHFT_VERSION}: `pip install -e '.[baselines]'` (`make setup` does); "
            f"importing it failed: {type(exc).__name__}: {exc}"
        ) from exc


def _strikes(run: Any) -> list[tuple[str, tuple[int, ...]]]:
    """(kind, ranks) of every fault the run plans: each event of a trace (``fault=mixed``), else its one kind
    on ``fault.ranks``."""
    from harness.faults import planned
    from harness.faults.schedule import plan_faults

    if planned.is_trace(run.fault):
        plan = plan_faults(run.fault, run.train.steps, run.checkpoint.interval, run.cluster.world_size)
        return [(p.kind, p.ranks) for p in plan]
    if run.fault.kind == planned.NO_FAULT:
        return []
    return [(run.fault.kind, tuple(run.fault.ranks))]


def _check_fault(run: Any, spec: Any, ranks: tuple[int, ...]) -> None:
    """One planned fault (each of a trace's faults in turn) must leave a replica group untouched."""
    from harness.schema import ConfigError

    st = torchft_config(run.strategy)
    world = run.cluster.world_size
    if spec.kills_all:
        raise ConfigError(
            f"strategy=torchft with fault={spec.kind}: the fault kills every rank at once, and torchft heals a "
            "restarted replica group only from a live one, so nothing would be left to heal from; use fault=kill "
            "(one rank) or fault=host_loss with a host per group, or compare the whole-job crash with "
            "strategy=accelpact_heal,cold_restart,checkpoint_restore"
        )
    if spec.kills_ranks:
        lost = ranks_lost(list(ranks), world, run.cluster.hosts, spec.kills_hosts)
        if not groups_untouched(lost, world, st.group_size):
            raise ConfigError(
                f"strategy=torchft with fault={spec.kind} on rank(s) {list(ranks)}: it kills ranks "
                f"{sorted(lost)}, a member of every replica group of {st.group_size} rank(s), and torchft heals a "
                f"restarted group only from a live one; try fault.ranks=[{ranks[0]}] with a host per "
                f"group: cluster.hosts={world // st.group_size}"
            )
