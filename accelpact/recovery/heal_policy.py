"""The heal's settings (:class:`HealPolicy`, what ``attach(..., heal=...)`` takes) and its result
(:class:`HealOutcome`, what the guard does next).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accelpact.events import HealEvent

__all__ = ["FetchReplica", "HealPolicy", "HealOutcome"]

# A buddy's fetch: (source rank, destination slot directory, step or None for the newest) -> the
# replica's marker (a dict with at least "step") or None when it holds none.
FetchReplica = Callable[[int, Path, "int | None"], "dict[str, Any] | None"]


@dataclass(frozen=True)
class HealPolicy:
    """How survivors heal a lost rank instead of raising RankLostError (``attach(..., heal=...)``).

    ``replacement_timeout_s``: how long survivors wait for a replacement to arrive; a Python + torch +
    transformers start on a loaded host took 5-15 s here, so the default leaves room for several.
    ``fetch_replica``: the buddy's fetch (None: no replicas, own slots only). ``buddy_of``: rank -> the
    rank holding its replica (for the error that names both). ``initial_state_reproducible``: a
    replacement's freshly built model and optimizer equal every rank's state before step 0 (seeded
    init), so a rank lost before its first snapshot is healed from step -1. ``max_rounds``: heals in a
    row for one loss (a replacement lost during its heal costs one more).
    """

    replacement_timeout_s: float = 180.0
    fetch_replica: FetchReplica | None = None
    buddy_of: Callable[[int], int] | None = None
    initial_state_reproducible: bool = True
    max_rounds: int = 4
    poll_s: float = 0.01

    def __post_init__(self) -> None:
        if self.replacement_timeout_s <= 0 or self.max_rounds < 1:
            raise ValueError(
                f"HealPolicy(replacement_timeout_s={self.replacement_timeout_s}, max_rounds="
                f"{self.max_rounds}): both must be positive"
            )


@dataclass(frozen=True)
class HealOutcome:
    """What the guard does after a heal: continue at ``resume_step`` (with ``extra_state`` restored)."""

    resume_step: int
    extra_state: dict[str, Any]
    event: HealEvent
