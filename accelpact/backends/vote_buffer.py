"""The commit vote's one-element int64 buffer, written and read from Python the cheapest way its device allows.

The vote runs every step, so its latency is a per-step cost. A CPU (gloo) buffer is written and read
through a numpy view of its memory, which costs the vote less than ``Tensor.fill_`` and ``Tensor.item``
(docs/design.md, "The vote's cost"). A device buffer (NCCL) keeps those: reading it must wait for the
device anyway.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["VoteBuffer"]


class VoteBuffer:
    """One int64 on ``device``: the tensor the vote all-reduces, and its value as a Python int."""

    def __init__(self, device: torch.device | str) -> None:
        import torch

        self.tensor = torch.zeros(1, dtype=torch.int64, device=device)
        self._host: Any = None  # numpy view of a CPU tensor's memory; None: go through the tensor
        if self.tensor.device.type == "cpu":
            try:
                self._host = self.tensor.numpy()
            except (ImportError, RuntimeError):  # torch without numpy: the tensor's own methods
                self._host = None
        if self._host is not None:  # chosen once: no branch in the vote
            self.set, self.get = self._set_host, self._get_host  # type: ignore[method-assign]

    @property
    def device(self) -> torch.device:
        return self.tensor.device

    def set(self, value: int) -> None:
        """Write ``value`` (it must fit in a signed 64-bit integer) before the all-reduce."""
        self.tensor.fill_(value)

    def get(self) -> int:
        """The value, once the all-reduce has completed on this rank."""
        return int(self.tensor.item())

    def _set_host(self, value: int) -> None:
        self._host[0] = value

    def _get_host(self) -> int:
        return int(self._host[0])
