"""Strategy ``none``: the plain step, no recovery. The fault-free reference every other run is
compared with, bit for bit."""

from __future__ import annotations

import torch

from harness.strategies.base import Strategy, clip_and_step, forward_backward


class PlainStep(Strategy):
    def run_step(self, step: int, tokens: torch.Tensor) -> float:
        loss = forward_backward(self.ctx.model, tokens)
        clip_and_step(self.ctx.model, self.ctx.optimizer, self.ctx.cfg.train.max_grad_norm)
        return float(loss.detach())
