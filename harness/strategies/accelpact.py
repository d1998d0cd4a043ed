"""Strategy ``accelpact``'s spec: every step through ``accelpact.guard``, comm faults recovered in memory, a
lost rank healed in memory from the snapshots (``harness.rank.strategies.accelpact`` is its rank side, which
says how). Here: what the parent and validation need of it, torch-free: when the parent relaunches every rank
(a rank gave up on in-memory recovery, exit ``EXIT_FALLBACK``, or was killed), when it starts a replacement
for one rank only (the heal), and the settings a heal cannot work with.
"""

from __future__ import annotations

from collections.abc import Mapping

from harness.faults import planned
from harness.schema import ConfigError, RunConfig
from harness.strategies.snapshot_config import AccelpactConfig, SnapshotSettings, accelpact_config
from harness.strategies.spec import Simulation, StrategySpec

__all__ = [
    "EXIT_FALLBACK",
    "relaunch_on_fallback",
    "relaunch_from_snapshots",
    "check_heal",
    "check_snapshot_values",
    "replace_on_kill",
    "SPEC",
]

# Exit status of a rank that gave up on in-memory recovery (the parent relaunches from a checkpoint).
EXIT_FALLBACK = 75


def relaunch_on_fallback(exit_codes: Mapping[int, int | None], first_failure: int | None) -> str | None:
    """Fall back to checkpoint restore (relaunch every rank) only when a rank said it cannot recover in
    memory (exit ``EXIT_FALLBACK``) or was killed by a signal; any other failure ends the run."""
    why = _fallen(exit_codes)
    return None if why is None else "fallback to checkpoint restore: " + why


def _fallen(exit_codes: Mapping[int, int | None]) -> str | None:
    """Which ranks were killed by a signal or gave up on in-memory recovery (None: neither, no relaunch)."""
    failed = {r: c for r, c in exit_codes.items() if c not in (0, None)}
    fell_back = sorted(r for r, c in failed.items() if c == EXIT_FALLBACK)
    killed = sorted(r for r, c in failed.items() if c is not None and c < 0)
    if not (fell_back or killed):
        return None
    parts = []
    if killed:
        parts.append(f"rank(s) {killed} killed by a signal")
    if fell_back:
        parts.append(f"rank(s) {fell_back} could not recover in memory")
    return ", ".join(parts)


def relaunch_from_snapshots(exit_codes: Mapping[int, int | None], first_failure: int | None) -> str | None:
    """``accelpact_heal``'s policy: relaunch every rank when :func:`relaunch_on_fallback` would, and say where
    the relaunched ranks resume: from the snapshots they all hold (``AccelPactStep._resume_relaunched``; a
    ``fallback`` event says so if they must read the disk after all). A whole-job crash (every rank killed
    by a signal, none gave up on its own) is a group restart, not a fallback."""
    failed = {r: c for r, c in exit_codes.items() if c not in (0, None)}
    if exit_codes and len(failed) == len(exit_codes) and all(c < 0 for c in failed.values()):
        return (
            f"group restart: every rank ({sorted(failed)}) was killed by a signal; the relaunched ranks resume "
            "from the newest snapshot every rank holds in shared memory"
        )
    why = _fallen(exit_codes)
    return (
        None
        if why is None
        else (
            "fallback to a relaunch of every rank, resumed from the newest snapshot every "
            "rank holds (the checkpoint if they hold no agreeing set): " + why
        )
    )


def check_heal(run: RunConfig) -> None:
    """ConfigError naming the fix for snapshot settings, a tax budget or hot spares that cannot work (the
    spec's ``check``)."""
    st = accelpact_config(run.strategy)
    check_snapshot_values(st.snapshot)
    if st.snapshot.max_tax is not None and st.snapshot.every > 0:
        check_tax_budget(st.snapshot)
    if st.hot_spares and (run.cluster.hosts or planned.needs_netns(run)):
        raise ConfigError(
            f"strategy.hot_spares={st.hot_spares} runs spares on the parent's host, but this run puts "
            "ranks in network-namespace hosts (cluster.hosts or a namespace fault): a spare cannot know "
            "which host loses a rank. Use strategy.hot_spares=0 here"
        )


def check_snapshot_values(snap: SnapshotSettings) -> None:
    """``strategy.snapshot``'s cadence and push settings, each naming the fix."""
    if snap.every < 0:
        raise ConfigError(
            f"strategy.snapshot.every={snap.every} must be >= 0 (0 = snapshots off, k = every "
            "k-th committed step); try `strategy.snapshot.every=1`"
        )
    if snap.push_every < 1:
        raise ConfigError(
            f"strategy.snapshot.push_every={snap.push_every} must be >= 1 (1 = push every "
            "snapshot to the buddy, k = every k-th); to push none, use `strategy.snapshot.replicas=false`; "
            "try `strategy.snapshot.push_every=1`"
        )
    if (snap.push_every > 1 or snap.confirm_push) and not snap.replicas:
        raise ConfigError(
            f"strategy.snapshot.push_every={snap.push_every} / confirm_push="
            f"{snap.confirm_push} set how buddy replicas are pushed, and replicas are off; try "
            "`strategy.snapshot.replicas=true`, or drop the push settings"
        )


def check_tax_budget(snap: SnapshotSettings) -> None:
    """``strategy.snapshot.max_tax`` and its companions, by accelpact's own checks, each naming the fix."""
    from accelpact.snapshot import SnapshotConfig  # lazy: torch

    try:
        SnapshotConfig(root="/unused", check_room=False, **snap.cadence())
    except ValueError as exc:
        raise ConfigError(
            f"{str(exc).replace('SnapshotConfig.', 'strategy.snapshot.')}; or `strategy.snapshot.max_tax=null` "
            "for a fixed cadence"
        ) from None


def replace_on_kill(run: RunConfig, rank: int, code: int, codes: Mapping[int, int | None]) -> bool:
    """Heal in memory (start a replacement for ``rank``) when snapshots are on, the rank was killed by a
    signal, some rank is still alive to heal it with, and no rank has given up on in-memory recovery
    (then the disk fallback runs instead)."""
    alive = [r for r, c in codes.items() if c is None]
    return (
        accelpact_config(run.strategy).snapshot.every > 0
        and code < 0
        and bool(alive)
        and EXIT_FALLBACK not in codes.values()
    )


SPEC = StrategySpec(
    name="accelpact",
    rank_class="harness.rank.strategies.accelpact:AccelPactStep",
    description="in-memory recovery: agree out of band, new process group, rebind FSDP's references, continue",
    label="AccelPact",
    color="tab:green",
    order=1,
    config=AccelpactConfig,
    relaunch=relaunch_on_fallback,
    replace_dead=replace_on_kill,
    check=check_heal,
    rejoin="harness.rank.strategies.heal:rejoin_job",
    # Survivors of a lost rank learn of it from the parent's death notice (within ~0.1 s) or by the
    # heartbeat rule (~2 s), write their fallback event and exit; 10 s covers a loaded host. A
    # survivor still waiting then is killed, which the relaunch policy treats the same way.
    settle_s=lambda run: min(run.strategy.recovery_deadline_s + 15.0, 10.0),
    recovers_in_memory=True,
    simulation=Simulation(
        "harness.scale.outcomes:rebind_or_fall_back_to_disk",
        "AccelPact rebinding, disk fallback",
        synchronous=True,
        calibration_rollback="step",
    ),
)
