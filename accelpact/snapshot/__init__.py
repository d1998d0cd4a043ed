"""In-memory snapshots of each rank's shard: per step, double-buffered, in node-local shared memory.

A rank's own snapshots live in ``<root>/<job_token>/rank<r>/slot0|slot1/`` (root:
``$ACCELPACT_SNAPSHOT_ROOT``, else ``/dev/shm/accelpact``); a buddy's replicas in
``<root>/<job_token>/replica/rank<src>/slot0|slot1/``. A slot exists only once its ``marker.json``
(format, job token, rank, world size, step, generation, sizes, CRC-32s) was renamed into place after
its payload. See docs/snapshots.md.

- :class:`Snapshotter`: ``after_commit(step)`` / ``before_update()`` (the guard calls both when
  attached with ``snapshots=``), ``flush``, ``held_steps``, ``restore(step, source)``, ``close``.
- :func:`restore_latest`: the restore call of a restarted job (torchrun ``--max-restarts``).
- :func:`snapshot_nbytes`: one slot's size; the memory plan is 4 of them per rank.
- :func:`remove_job`: delete a job's snapshots (clean exit, stale clean-up).
- :func:`job_token_from_env`, :func:`restart_count`: the token that survives a torchrun restart.
- :class:`Replication`: the buddy replica of each snapshot on another host; :func:`replay_bound`: the
  steps a host loss can replay at a given push cadence.

torch and the standard library only, like the rest of accelpact.
"""

from accelpact.snapshot.launch import job_token_from_env, restart_count
from accelpact.snapshot.layout import default_root, remove_job, remove_rank
from accelpact.snapshot.push_rule import replay_bound
from accelpact.snapshot.replica import Replication, control_bind_address
from accelpact.snapshot.restore import SnapshotInfo, restore_latest
from accelpact.snapshot.sizing import snapshot_nbytes, used_bytes
from accelpact.snapshot.slots import (
    NoSnapshotToResumeError,
    SnapshotError,
    SnapshotMissingError,
    SnapshotsDisagreeError,
)
from accelpact.snapshot.snapshotter import SnapshotConfig, Snapshotter

__all__ = [
    "SnapshotConfig",
    "Snapshotter",
    "SnapshotInfo",
    "SnapshotError",
    "SnapshotMissingError",
    "NoSnapshotToResumeError",
    "SnapshotsDisagreeError",
    "restore_latest",
    "snapshot_nbytes",
    "remove_job",
    "remove_rank",
    "default_root",
    "job_token_from_env",
    "restart_count",
    "Replication",
    "control_bind_address",
    "replay_bound",
    "used_bytes",
]
