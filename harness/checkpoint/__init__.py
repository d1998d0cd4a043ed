"""DCP checkpoints for every strategy: save modes (sync, async, cached and pinned staging), layout on disk,
complete markers, pruning, restore, and the records that goodput accounting reads."""

from harness.checkpoint.checkpointer import Checkpointer, CheckpointSettings

__all__ = ["Checkpointer", "CheckpointSettings"]
