"""What this host can provide: CPU cores, available memory, GPUs. Probed once, passed around as data.

Validation takes a ``Machine`` argument instead of probing itself, so its rules can be unit-tested
against any machine shape in milliseconds.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import psutil

GiB = 1024**3

# local_cpu rank limit: at most this many ranks per core. Beyond it ranks time-slice so much that a
# step's collectives mostly wait on descheduled peers and the timings measure the scheduler.
RANKS_PER_CORE = 2
# Resident memory of one idle rank process (python + torch + transformers + gloo), measured ~0.5 GiB.
RANK_RUNTIME_BYTES = int(0.6 * GiB)
# Share of the available memory a run may plan to use; the rest is headroom for the OS, page cache
# and the estimate's error, so a run that passes the plan does not die mid-way with OOM.
USABLE_FRACTION = 0.85


@dataclass(frozen=True)
class Machine:
    cpu_cores: int
    mem_available: int  # bytes
    gpu_mem: tuple[int, ...] = field(default_factory=tuple)  # total bytes of each visible GPU
    # Inside a Slurm allocation (SLURM_JOB_ID): a cluster.launch=srun run is checked against this node;
    # outside one (the host that submits it) its ranks will run elsewhere and are not.
    in_slurm_job: bool = False
    # Free bytes where the ranks keep their snapshots (ACCELPACT_SNAPSHOT_ROOT, else /dev/shm); None:
    # not probed (then only the memory plan bounds the snapshots).
    shm_free: int | None = None
    shm_path: str = "/dev/shm"

    @property
    def gpu_count(self) -> int:
        return len(self.gpu_mem)

    @property
    def usable_mem(self) -> int:
        return int(self.mem_available * USABLE_FRACTION)

    def local_cpu_rank_limit(self) -> int:
        """Most ranks cluster=local_cpu runs here: 2 per core, and no more than memory holds idle."""
        by_cores = RANKS_PER_CORE * self.cpu_cores
        by_memory = max(1, self.usable_mem // RANK_RUNTIME_BYTES)
        return max(1, min(by_cores, by_memory))


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity, which a container or taskset narrows), else all."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def probe(with_gpus: bool = True) -> Machine:
    """This host. GPUs are only looked at when asked (it may initialise CUDA)."""
    cores = usable_cores()
    gpu_mem: tuple[int, ...] = ()
    if with_gpus:
        gpu_mem = _gpu_memory()
    shm_path, shm_free = snapshot_space()
    return Machine(
        cpu_cores=cores,
        mem_available=psutil.virtual_memory().available,
        gpu_mem=gpu_mem,
        in_slurm_job="SLURM_JOB_ID" in os.environ,
        shm_free=shm_free,
        shm_path=shm_path,
    )


def snapshot_space() -> tuple[str, int | None]:
    """(the filesystem the snapshots go to, its free bytes): the nearest existing directory of
    ``ACCELPACT_SNAPSHOT_ROOT`` (else /dev/shm); None when there is no such filesystem to ask."""
    path = os.environ.get("ACCELPACT_SNAPSHOT_ROOT") or "/dev/shm"
    probe_at = path
    while probe_at and not os.path.isdir(probe_at):
        probe_at = os.path.dirname(probe_at.rstrip("/"))
    try:
        st = os.statvfs(probe_at or "/")
    except OSError:
        return path, None
    return path, st.f_bavail * st.f_frsize


def _gpu_memory() -> tuple[int, ...]:
    try:
        import torch  # lazy: torch

        if not torch.cuda.is_available():
            return ()
        return tuple(torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count()))
    except Exception:  # a broken driver means "no usable GPU", which validation then explains
        return ()
