"""What accelpact needs of a control-store client: :class:`ControlClient`, the type of every ``control``.

:class:`accelpact.control.ControlChannel` is the implementation; the tests pass stand-ins with the members the
code under test uses. The optional members (``config``, ``join``, ``prepare_data_plane``,
``generation_superseded``) are looked up with ``getattr`` where they are used, so they are not part of it.

A typing-only module in the bottom layer (accelpact.common): its users import it under ``TYPE_CHECKING``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch.distributed

    from accelpact.common.peer_records import Verdict

__all__ = ["ControlClient", "PeerCheck"]


class PeerCheck(Protocol):
    """What a gather's ``watch`` does: look at the missing peers' beats and notices between waits.

    accelpact.detection.liveness.PeerWatch is the implementation.
    """

    slice_s: float  # the longest wait between two looks

    def check(self, store: Any, missing: list[int]) -> Verdict | None:
        """A verdict that some of ``missing`` are lost, or None to keep waiting."""
        ...


class ControlClient(Protocol):
    """A rank's handle on the out-of-band control store (accelpact.control.channel has the semantics)."""

    rank: int
    world_size: int
    job_token: str
    generation: int  # the current data-plane generation

    def key(self, *parts: str) -> str: ...

    def set(self, key: str, value: bytes) -> None: ...

    def get(self, key: str, deadline_s: float | None = None) -> bytes: ...

    def gather(
        self,
        tag: str,
        payload: bytes,
        generation: int,
        deadline_s: float | None = None,
        watch: PeerCheck | None = None,
    ) -> dict[int, bytes]: ...

    def barrier(self, tag: str, generation: int, deadline_s: float | None = None) -> None: ...

    def advance_generation(self) -> int: ...

    def heartbeat(self, progress: int = 0) -> None: ...

    def data_plane_store(self, generation: int) -> torch.distributed.Store: ...

    # The channel's plumbing, used by accelpact.recovery.heal_wait.peek: fn(store) within a deadline.
    def _call(self, fn: Callable[[Any], Any], deadline: float, what: str, *, idempotent: bool = True) -> Any: ...

    def _deadline(self, deadline_s: float | None) -> float: ...
