"""Strategy ``checkpoint_restore``'s spec: NVIDIA Resiliency Extension in-process restart (the NVRx baseline).

Its rank side (``harness.rank.strategies.checkpoint_restore`` and ``nvrx_rank``, which say how it recovers)
runs the rank's whole life under NVRx; the parent hosts NVRx's store outside the ranks
(``harness.parent.strategies.nvrx_store``) and relaunches every rank after a lost process
(``relaunch_after_lost_process``). Here, torch-free: that policy, and the check that NVRx can run this
configuration. ``nvrx_types`` holds what both sides share (settings, records, the store's variables).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from harness.faults import planned
from harness.schema import ConfigError, LinkPlane
from harness.strategies.checkpoint_restore.nvrx_types import NvrxUnavailable, import_inprocess
from harness.strategies.spec import Simulation, StrategySpec


def relaunch_after_lost_process(exit_codes: Mapping[int, int | None], first_failure: int | None) -> str | None:
    """Relaunch every rank when the rank that failed first was killed by a signal: a lost process.

    NVRx's in-process restart recovers inside live processes; a process that is gone takes its state with
    it, and NVRx hands that case to the launcher above it (its ft_launcher's in-job restart, like torchrun's
    --max-restarts): every worker is started again and restores the newest checkpoint. That is what this
    relaunch is. A rank that exited with an error of its own (NVRx gave up: restarts exhausted, or an error
    no restart fixes) is not relaunched: it would fail again."""
    failed = {r: c for r, c in exit_codes.items() if c not in (0, None)}
    rank = first_failure if first_failure in failed else (min(failed) if failed else None)
    if rank is None or failed[rank] >= 0:
        return None
    return (
        f"NVRx in-job restart: rank {rank} was lost (exit {failed[rank]}); in-process restart cannot bring "
        "back a process, so every rank is relaunched and restores the newest checkpoint"
    )


# Namespace faults run with NVRx: its store lives in the bridge namespace, on the control network
# (nvrx_store), which they leave alone on the data plane. Each was run through the harness to a
# bit-identical end (host_loss: a relaunch; tcp_reset, link_down, blackhole: in-process restarts).
NETNS_FAULTS = frozenset({"host_loss", "tcp_reset", "link_down", "blackhole"})


def check_runnable(run: Any) -> None:
    """NVRx must be importable; of the namespace faults, those run with it (``NETNS_FAULTS``), on the data plane."""
    for spec in (s for s in planned.specs(run) if s.needs_netns):
        if spec.kind not in NETNS_FAULTS:
            raise ConfigError(
                f"fault={spec.kind} with strategy=checkpoint_restore is not supported yet: it has not been run "
                f"with NVRx; namespace faults that have: {', '.join(sorted(NETNS_FAULTS))}"
            )
        if LinkPlane(run.fault.link) == LinkPlane.control:
            # Measured: tcp_reset on the control link reset NVRx's own store clients; its monitor thread
            # died with "Broken pipe" (NVRx 0.4.1's store client does not reconnect) and the run hung.
            raise ConfigError(
                f"fault={spec.kind} fault.link=control with strategy=checkpoint_restore is not supported: the "
                "control link carries NVRx's own store, whose client does not reconnect (a reset there hung the run); "
                "use `fault.link=data`"
            )
    try:
        import_inprocess()
    except NvrxUnavailable as exc:
        raise ConfigError(str(exc)) from exc


SPEC = StrategySpec(
    name="checkpoint_restore",
    rank_class="harness.rank.strategies.checkpoint_restore:CheckpointRestore",
    description="NVRx in-process restart: keep processes, rebuild groups, restore the newest checkpoint, replay",
    label="NVRx checkpoint restore",
    color="tab:orange",
    order=3,
    relaunch=relaunch_after_lost_process,
    parent_setup="harness.parent.strategies.nvrx_store:NvrxStore",
    rank_entry="harness.rank.strategies.nvrx_rank:train_in_process",
    check=check_runnable,
    simulation=Simulation(
        "harness.scale.outcomes:restart_in_process_and_restore",
        "NVRx in-process restart + checkpoint",
        synchronous=True,
        calibration_rollback="checkpoint",
    ),
    paper_gain={5: 1.194},  # Mistral-7B, 16 GPUs (harness.report.paper.PAPER_GAIN_SETUP)
    paper_label="NVRx checkpoint restoration",
    unequal=(
        "a socket reset is an in-process restart (processes kept, groups rebuilt, checkpoint restored); a kill needs "
        "NVRx's ft_launcher in-job restart, which the harness's parent stands in for (every rank relaunched)",
        "NVRx's store is hosted by the parent, not by ft_launcher",
    ),
)
