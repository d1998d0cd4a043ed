"""The one-save-in-flight rule for async checkpoints, and how background failures reach the loop.

A background save is a ``Future`` whose result is a dict of fields to fill into its ``SaveRecord``.
Settling it (``poll`` when done, ``wait`` always) either fills the record or raises
``CheckpointSaveError``; either way the slot is free again, so a failure is reported exactly once and
never silently dropped. Pure ``concurrent.futures``: no torch, testable with plain futures.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

from harness.checkpoint.records import CheckpointSaveError, SaveRecord


class SaveSlot:
    """Holds at most one in-flight save."""

    def __init__(self) -> None:
        self._record: SaveRecord | None = None
        self._future: Future[dict[str, Any]] | None = None

    @property
    def busy(self) -> bool:
        return self._future is not None

    @property
    def step(self) -> int | None:
        return self._record.step if self._record is not None else None

    def put(self, record: SaveRecord, future: Future[dict[str, Any]]) -> None:
        if self._future is not None:
            raise RuntimeError(
                f"a save (step {self.step}) is still in flight; settle it with wait() before starting another"
            )
        self._record, self._future = record, future

    def poll(self) -> SaveRecord | None:
        """Settle the in-flight save if it has finished; never blocks."""
        if self._future is None or not self._future.done():
            return None
        return self._settle()

    def wait(self) -> SaveRecord | None:
        """Block until the in-flight save (if any) finishes and settle it."""
        if self._future is None:
            return None
        return self._settle()

    def _settle(self) -> SaveRecord:
        record, future = self._record, self._future
        assert record is not None and future is not None
        self._record, self._future = None, None
        try:
            fields = future.result()
        except BaseException as exc:  # noqa: BLE001 - every failure is re-raised, named
            raise CheckpointSaveError(record.step, exc) from exc
        for name, value in fields.items():
            setattr(record, name, value)
        return record
