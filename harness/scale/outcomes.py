"""Per strategy and failure class: what recovery does, the job-wide stop it costs (by part), and the rollback.

Parts are named like the harness's badput columns where they mean the same thing: detection, agreement,
rebuild, rebind, restart, restore; plus heal (state copied from memory), spare (a replacement host),
checkpoint (one taken on notice before a planned stop), fix (a recurring bug patched or skipped) and
degraded (torchft: the failed replica's recovery while the others go on, as the equivalent whole-job stop).
Replay is not a part: the engine charges the lost work itself, from the rollback.

Each public function is one recovery mechanism, named for what it does; which strategy it models is the
strategy registry's business (``StrategySpec.simulation``, ``harness.strategies.projected``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence

from harness.fleet.config import (
    CLASSES,
    ROLLBACK_CHECKPOINT,
    ROLLBACK_NONE,
    ROLLBACK_STEP,
    Cluster,
    Outcome,
    ScaleConfigError,
    check_outcomes,
)
from harness.scale import scaling as sc
from harness.scale.reconfigure_measured import measured_reconfigure
from harness.scale.torchft_measured import measured_torchft
from harness.strategies import simulated


def _detect(cluster: Cluster, cls: str) -> float:
    """How long until recovery starts, for strategies that rely on the launcher and NCCL (cold, NVRx)."""
    return {
        "transient_network": sc.RESET_DETECT_S,
        "hang": cluster.hang_timeout_s,
        "process_crash": sc.CRASH_DETECT_S,
        "gpu_host_loss": sc.HOST_DETECT_S,
        "software_bug": sc.CRASH_DETECT_S,
        "planned_maintenance": 0.0,
    }[cls]


def _cold(cluster: Cluster, cls: str, detect: float | None = None) -> Outcome:
    """Kill everything, relaunch, load the newest checkpoint, replay."""
    n = cluster.gpus
    parts = {
        "detection": _detect(cluster, cls) if detect is None else detect,
        "restart": sc.process_restart_s(n),
        "restore": sc.restore_s(cluster),
    }
    if cls in ("gpu_host_loss", "planned_maintenance"):
        parts["spare"] = sc.spare_s(cluster)
    if cls == "software_bug":
        parts["fix"] = cluster.bug_fix_s
    if cls == "planned_maintenance":
        # Announced: checkpoint first, so nothing is replayed.
        parts["checkpoint"] = cluster.checkpoint_write_s
        return Outcome(ROLLBACK_NONE, parts, "checkpoint on notice, restart, restore")
    return Outcome(ROLLBACK_CHECKPOINT, parts, "relaunch every process, restore, replay")


def _rebind(cluster: Cluster, detect: float) -> dict[str, float]:
    n = cluster.gpus
    return {"detection": detect, "agreement": sc.agreement_s(n), "rebuild": sc.comm_init_s(n), "rebind": sc.REBIND_S}


def _with_retry_first(cluster: Cluster, cls: str, detect: float) -> Outcome:
    """A recurring bug under an in-memory strategy: the retry costs one rebind and one step, then the bug
    comes back and the job falls back to the disk path."""
    cold = _cold(cluster, cls)
    retry = _rebind(cluster, detect)
    parts = {k: cold.parts.get(k, 0.0) + retry.get(k, 0.0) for k in set(cold.parts) | set(retry)}
    parts["retry_step"] = cluster.step_s
    return Outcome(ROLLBACK_CHECKPOINT, parts, "in-memory retry fails again, then disk fallback")


def relaunch_and_restore(c: Cluster, cls: str) -> Outcome:
    """Cold restart: kill every process, relaunch, restore the newest checkpoint, replay."""
    return _cold(c, cls)


def restart_in_process_and_restore(c: Cluster, cls: str) -> Outcome:
    """NVRx-style: restart inside the live processes, restore from disk, replay; a dead process restarts cold."""
    if cls in ("transient_network", "hang"):
        # Every process alive: NVRx restarts in process, rebuilds the groups, restores from disk, replays.
        parts = {"detection": _detect(c, cls), "restart": sc.inprocess_restart_s(c.gpus), "restore": sc.restore_s(c)}
        return Outcome(ROLLBACK_CHECKPOINT, parts, "in-process restart, restore, replay")
    # A dead process or host: the in-process wrapper cannot continue; the job restarts like a cold one.
    return _cold(c, cls)


def rebind_or_fall_back_to_disk(c: Cluster, cls: str) -> Outcome:
    """AccelPact as built for this model: rebind in place; a lost process or host falls back to disk."""
    if cls in ("transient_network", "hang"):
        detect = sc.RESET_DETECT_S if cls == "transient_network" else c.hang_timeout_s
        return Outcome(ROLLBACK_STEP, _rebind(c, detect), "rebind in place, redo the step in flight")
    if cls == "software_bug":
        return _with_retry_first(c, cls, sc.RESET_DETECT_S)
    if cls in ("process_crash", "gpu_host_loss"):
        # Built: a death notice or the heartbeat rule tells the survivors in seconds; they fall back to disk.
        return _cold(c, cls, detect=sc.ACCELPACT_DEAD_PEER_S)
    return _cold(c, cls)


def _measured_heal_parts(c: Cluster, cls: str, *, fixed_scale: float = 1.0) -> dict[str, float]:
    """The heal's job-wide stop at ``c.gpus``: the parts measured at 2 ranks in results/process_loss
    (``harness.scale.heal_measured``: detection, replacement start, heal transfer; each x ``fixed_scale``),
    plus what grows with the job (``harness.scale.scaling``): the vote and the communicator beyond their
    2-rank cost (already inside the measured heal transfer), and the shard copy at the cluster's shard size
    (the measured runs copied 31 MiB)."""
    from harness.scale.heal_measured import measured_heal  # lazy: numpy

    fault = "kill" if cls == "process_crash" else "host_loss"
    measured = measured_heal()[fault]
    parts = {k: v * fixed_scale for k, v in measured.parts.items()}
    n = c.gpus
    parts["agreement"] = sc.agreement_s(n) - sc.agreement_s(2)
    parts["rebuild"] = sc.comm_init_s(n) - sc.comm_init_s(2)
    parts["heal"] = sc.heal_local_s(c) if cls == "process_crash" else sc.heal_remote_s(c)
    if cls != "process_crash":
        # A lost host: nobody sees a process exit. process_loss's simulated host was watched by the parent,
        # which saw its rank die (the measured detection); on a cluster the survivors' heartbeat rule finds
        # it (ACCELPACT_DEAD_PEER_S, measured: 2.1 s), so the larger of the two is charged.
        parts["detection"] = max(parts["detection"], sc.ACCELPACT_DEAD_PEER_S)
        parts["spare"] = sc.spare_s(c)
    return parts


def _heal_in_memory(c: Cluster, cls: str, fixed_scale: float, how: str) -> Outcome:
    if cls in ("transient_network", "hang", "software_bug"):
        return rebind_or_fall_back_to_disk(c, cls)
    parts = _measured_heal_parts(
        c, "process_crash" if cls == "process_crash" else "gpu_host_loss", fixed_scale=fixed_scale
    )
    if cls == "process_crash":
        return Outcome(ROLLBACK_STEP, parts, f"{how}: replacement process heals from its own shm snapshot")
    if cls == "planned_maintenance":
        parts["detection"] = 0.0  # announced
        return Outcome(ROLLBACK_NONE, parts, f"{how}: drain the host, a spare heals from the buddy's replica")
    return Outcome(ROLLBACK_STEP, parts, f"{how}: spare host heals from the buddy's replica")


def rebind_and_heal_in_memory(c: Cluster, cls: str) -> Outcome:
    """AccelPact as built (torch 2.13, rebind): rebind in place; a lost process or host is replaced and healed
    from memory (own shm snapshot or the buddy's replica), with the costs measured in results/process_loss."""
    return _heal_in_memory(c, cls, 1.0, "heal measured in results/process_loss")


def reconfigure_and_heal_in_memory(c: Cluster, cls: str) -> Outcome:
    """AccelPact on torch 2.15's process-group reconfigure (``harness.scale.reconfigure_measured``): the heal
    as calibrated on results/process_loss with its size-independent parts x the measured 2.15/2.13 heal ratio;
    a transient fault reconfigures the same groups (nothing rebound). The communicator build is unchanged."""
    r = measured_reconfigure()
    if cls in ("transient_network", "hang"):
        detect = sc.RESET_DETECT_S if cls == "transient_network" else c.hang_timeout_s
        parts = {**_rebind(c, detect), "rebind": r.rebind_s}
        return Outcome(ROLLBACK_STEP, parts, "reconfigure the same groups, redo the step in flight")
    return _heal_in_memory(c, cls, r.heal_ratio, "reconfigure, heal x measured 2.15/2.13 ratio")


def heal_growing_the_communicator(c: Cluster, cls: str) -> Outcome:
    """Design, not built: the heal as measured, but the replacement's ranks join the survivors' communicator
    (a grow) instead of every rank building a new one, so the rebuild costs the joining host's bootstrap,
    not the job's. Assumption (unverified): a grow costs what a communicator over the joining ranks costs;
    torch 2.15 has shrink_group (NCCL's ncclCommShrink) but no grow was measured. Faults that lose no rank
    (transient, hang) still rebuild the whole communicator, as built."""
    out = rebind_and_heal_in_memory(c, cls)
    if cls not in ("process_crash", "gpu_host_loss", "planned_maintenance"):
        return out
    joining = c.gpus_per_host if cls != "process_crash" else 1
    parts = {**out.parts, "rebuild": max(0.0, sc.comm_init_s(joining) - sc.comm_init_s(2))}
    return Outcome(out.rollback, parts, "design: heal, the replacement grows the communicator")


def heal_replica_while_others_continue(c: Cluster, cls: str) -> Outcome:
    """Design, not built: HSDP with replica groups of ``c.replica_gpus``; the group that lost a rank (or saw
    a transient fault or a hang) heals as measured in results/process_loss while the others go on, as
    torchft's do. The survivors stop for the detection, the vote, and the replicate-dimension groups
    (N/G ranks each) shrunk and grown back; the failed group's own recovery (spare, replacement start,
    heal transfer, its own communicator, the shard copy) costs the job that time x G/N, the rule used for
    torchft's row. A recurring bug hits every replica: as the built heal."""
    if cls == "software_bug":
        return rebind_and_heal_in_memory(c, cls)
    from harness.scale.heal_measured import measured_heal  # lazy: numpy

    g = min(c.replica_gpus, c.gpus)
    replicate = max(2, c.gpus // g)
    survivors = {"agreement": sc.agreement_s(c.gpus), "rebuild": 2 * sc.comm_init_s(replicate)}
    if cls in ("transient_network", "hang"):
        detect = sc.RESET_DETECT_S if cls == "transient_network" else c.hang_timeout_s
        replica = sc.comm_init_s(g)
        return Outcome(
            ROLLBACK_STEP,
            {"detection": detect, **survivors, "degraded": replica * g / c.gpus},
            "design: the group rebuilds its communicator while the others go on",
        )
    m = measured_heal()["kill" if cls == "process_crash" else "host_loss"]
    detect = m.parts["detection"] if cls == "process_crash" else max(m.parts["detection"], sc.ACCELPACT_DEAD_PEER_S)
    replica = (
        m.parts["replacement_start"]
        + m.parts["heal_transfer"]
        + sc.comm_init_s(g)
        + (sc.heal_local_s(c) if cls == "process_crash" else sc.heal_remote_s(c) + sc.spare_s(c))
    )
    parts = {
        "detection": 0.0 if cls == "planned_maintenance" else detect,
        **survivors,
        "degraded": replica * g / c.gpus,
    }
    rollback = ROLLBACK_NONE if cls == "planned_maintenance" else ROLLBACK_STEP
    return Outcome(rollback, parts, "design: the group heals from memory while the others go on")


def replica_drops_and_peer_heals(c: Cluster, cls: str) -> Outcome:
    """torchft: the failed replica group drops out, the others go on, it rejoins by peer heal.

    Measured here (``harness.scale.torchft_measured``, torchft 0.2.0 under the harness): the survivors' stop
    per failure (the retried step's detection + quorum + reconfigure), and the failed group's fresh process
    start and peer heal. Its recovery (spare if needed, that start, a communicator over its own group, the
    heal, the shard over the NIC) is paid by one replica group out of N/G, so it costs the job that time x
    G/N; the survivors stop for their measured stop. torchft's per-step quorum is not charged (measured,
    reported in docs/scale.md)."""
    if cls == "software_bug":
        return _cold(c, cls)  # every replica runs the same code: all hit the bug
    m = measured_torchft()
    g = min(c.replica_gpus, c.gpus)
    replica = m.replica_start_s + sc.comm_init_s(g) + m.replica_heal_s + sc.heal_remote_s(c)
    if cls in ("gpu_host_loss", "planned_maintenance"):
        replica += sc.spare_s(c)
    detect = c.hang_timeout_s if cls == "hang" else 0.0
    parts = {"detection": detect, "agreement": m.survivor_stop_s, "degraded": replica * g / c.gpus}
    rollback = ROLLBACK_NONE if cls == "planned_maintenance" else ROLLBACK_STEP
    return Outcome(rollback, parts, "replica drops out and rejoins by peer heal")


def relaunch_and_restore_from_peer_memory(c: Cluster, cls: str) -> Outcome:
    """GEMINI (lm-resiliency): every process relaunched, each rank's state reloaded from the newest in-memory
    capture (its own host's, or its paired rank's replica for a lost host), at most one capture interval
    replayed. A recurring bug is paid as a cold restart: the relaunch after the fix reads the disk checkpoint
    (the captures of a job that was stopped for a fix are not counted on); planned maintenance as cold."""
    if cls in ("software_bug", "planned_maintenance"):
        return _cold(c, cls)
    parts = {
        "detection": _detect(c, cls),
        "restart": sc.process_restart_s(c.gpus),
        "restore": sc.heal_remote_s(c) if cls == "gpu_host_loss" else sc.heal_local_s(c),
    }
    if cls == "gpu_host_loss":
        parts["spare"] = sc.spare_s(c)
    return Outcome(ROLLBACK_STEP, parts, "relaunch every process, reload the in-memory captures, replay the step")


def no_failures(c: Cluster, cls: str) -> Outcome:
    return Outcome(ROLLBACK_NONE, {}, "fault-free reference: no failures are drawn for it")


# Rows that model a design nobody has built (their labels say so): never a measured strategy's winner.
DESIGN_BUILDS = (
    "harness.scale.outcomes:heal_growing_the_communicator",
    "harness.scale.outcomes:heal_replica_while_others_continue",
)


def _builder(build: str) -> Callable[[Cluster, str], Outcome]:
    module_name, fn_name = build.split(":")
    return getattr(importlib.import_module(module_name), fn_name)


def outcome_table(cluster: Cluster, strategies: Sequence[str] | None = None) -> dict[str, dict[str, Outcome]]:
    """{strategy: {class: Outcome}} for this cluster; checked (every pair present, every part finite >= 0).

    ``strategies``: names from the strategy registry's simulations (default: all of them); each spec's
    ``Simulation.build`` names the mechanism above that models it."""
    sims = simulated()
    names = tuple(sims) if strategies is None else tuple(strategies)
    unknown = [s for s in names if s not in sims]
    if unknown:
        raise ScaleConfigError(f"strategy {unknown[0]!r} is unknown: use one of {', '.join(sims)}")
    table = {s: {cls: _builder(sims[s].build)(cluster, cls) for cls in CLASSES} for s in names}
    check_outcomes(table, names)
    return table


def downtimes(table: Mapping[str, Mapping[str, Outcome]], strategy: str) -> list[float]:
    return [table[strategy][cls].downtime_s for cls in CLASSES]
