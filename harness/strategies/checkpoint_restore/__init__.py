"""Strategy ``checkpoint_restore``: NVIDIA Resiliency Extension in-process restart (the NVRx baseline).

The rank's whole training function runs under ``harness.strategies.checkpoint_restore.nvrx_restart.run_with_inprocess_restart``:
the process stays alive; when a collective fails on any rank, NVRx interrupts every rank, the adapter
tears the process groups down, and the training function runs again (incarnation + 1). Each
incarnation builds its process group on a never-used store prefix, rebuilds model and optimizer,
restores the newest DCP checkpoint (``restore`` event) and replays the steps lost since it
(``replay=True``). Its ``restart`` event carries NVRx's own timestamps.

NVRx must be importable: without it this strategy fails with ``NvrxUnavailable`` naming the fix;
there is no silent substitute. The spec's ``rank_entry`` makes ``harness.rank.train.train`` hand the
rank's whole life to ``nvrx_rank.train_in_process``, because NVRx must own the process groups from the start.
NVRx's own TCPStore is hosted outside the ranks (``nvrx_store``) so that a rank's death does not take it
down: in the parent, or, for ranks in network namespaces, in the topology's bridge namespace on the
control network, where every host reaches it.

A lost process (a rank killed by a signal, or every rank of a lost host: ``fault=host_loss``) is beyond
in-process restart: NVRx leaves it to the launcher above it (its ft_launcher's in-job restart). The parent
does the same here (``relaunch_after_lost_process``): every rank is relaunched, a lost host's ranks in
their namespace again, on a fresh NVRx store, and restores the newest checkpoint.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from harness.strategies.base import Strategy
from harness.strategies.spec import Simulation, StrategySpec

if TYPE_CHECKING:
    import torch


class CheckpointRestore(Strategy):
    def run_step(self, step: int, tokens: torch.Tensor) -> float:
        return self.plain_step(step, tokens)

    def abandon(self) -> None:
        """Finalizer of a torn-down incarnation: drop hooks and the checkpointer without raising."""
        try:
            self.close()
        except Exception as exc:  # noqa: BLE001 - the incarnation is gone; its save error is moot
            print(f"checkpoint_restore: closing the torn-down incarnation's checkpointer: {exc}", flush=True)


class _NvrxStore:
    """NVRx's store, hosted outside the ranks (``nvrx_store``), its address to every rank. A relaunched world
    gets a new one.

    NVRx keys its store by its own iteration number only (barriers, terminated ranks, completion), and a
    relaunched world starts again at iteration 0: on the killed world's store it would read that world's
    keys. So each incarnation's ranks get a fresh store, hosted before they start: in the parent for ranks
    in its namespace, in the topology's bridge namespace on the control network for ranks in namespaces."""

    def __init__(self, run: Any, launcher: Any) -> None:
        from harness.strategies.checkpoint_restore.nvrx_store import store_home

        self.launcher = launcher
        self.home = store_home(run, launcher)
        self.addr: tuple[str, int] | None = None
        launcher.before_start.append(self.renew)  # hosted as each incarnation's ranks start

    def renew(self, incarnation: int) -> None:
        from harness.strategies.checkpoint_restore.nvrx_restart import STORE_HOST_ENV, STORE_PORT_ENV

        self.addr = host, port = self.home.renew()
        self.launcher.extra_env.update(
            {STORE_HOST_ENV: host, STORE_PORT_ENV: str(port), "TORCH_CPP_LOG_LEVEL": "ERROR"}
        )

    def row_columns(self) -> dict[str, Any]:
        """Where the last world's NVRx store was (the row says which network the ranks reached it on)."""
        return {"nvrx_store": f"{self.addr[0]}:{self.addr[1]}" if self.addr else None}

    def close(self) -> None:
        self.home.close()


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
    from harness.faults import planned
    from harness.schema import ConfigError, LinkPlane
    from harness.strategies.checkpoint_restore.nvrx_restart import NvrxUnavailable, import_inprocess

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
    rank_class="harness.strategies.checkpoint_restore:CheckpointRestore",
    description="NVRx in-process restart: keep processes, rebuild groups, restore the newest checkpoint, replay",
    label="NVRx checkpoint restore",
    color="tab:orange",
    order=3,
    relaunch=relaunch_after_lost_process,
    parent_setup=_NvrxStore,
    rank_entry="harness.strategies.checkpoint_restore.nvrx_rank:train_in_process",
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
