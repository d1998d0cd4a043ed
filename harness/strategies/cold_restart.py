"""Strategy ``cold_restart``: what a cluster manager does. On a fault the ranks fail (the comm error
ends the process); the parent (``harness.parent.launcher``) kills every rank process and launches fresh ones
with incarnation + 1. Those rebuild everything, load the newest DCP checkpoint (``restore`` event,
in ``Periodic.__init__``) and replay the steps lost since it (``replay=True`` step events)."""

from __future__ import annotations

import torch

from harness.strategies._common import Periodic


class ColdRestart(Periodic):
    def run_step(self, step: int, tokens: torch.Tensor) -> float:
        return self.plain_step(step, tokens)
