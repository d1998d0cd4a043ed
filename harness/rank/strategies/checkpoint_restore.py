"""Strategy ``checkpoint_restore``, rank side: NVIDIA Resiliency Extension in-process restart (the NVRx
baseline). Its spec: ``harness.strategies.checkpoint_restore``.

The rank's whole training function runs under ``harness.rank.strategies.nvrx_restart.run_with_inprocess_restart``:
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

from typing import TYPE_CHECKING

from harness.rank.strategies.base import Strategy

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
