"""What a guard leaves on the control store for ``accelpact.run``: neither one may fail training.

- :func:`record_modules`: after the first commit, what this process imported, for the script
  template to preload (accelpact.run.modules): a later replacement then pays none of those imports.
- :func:`mark_ended`: at close after finish, that this rank ended the run (accelpact.recovery.heal_wait's
  closed key): a waiting replacement stops at once, and the agent never replaces the rank after it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from accelpact.common.control_client import ControlClient

_log = logging.getLogger(__name__)

__all__: list[str] = []  # private to accelpact.guard


def record_modules(control: ControlClient, rank: int) -> None:
    """Write this process's modules where the agent asked for them (nothing when it did not)."""
    from accelpact.run.modules import record

    try:
        record(control)
    except Exception as exc:  # noqa: BLE001 - a slower replacement at worst
        _log.info("rank %d: could not record its modules for the template: %s", rank, exc)


def mark_ended(control: ControlClient, rank: int, committed_step: int) -> None:
    """Write that ``rank`` ended the run at ``committed_step``."""
    from accelpact.recovery.heal_wait import closed_key

    try:
        control.set(closed_key(control, rank), str(committed_step).encode())
    except Exception as exc:  # noqa: BLE001 - the store may be gone at the end of a job: nothing waits then
        _log.info("rank %d: could not mark the run ended on the control store: %s", rank, exc)
