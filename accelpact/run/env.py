"""The environment ``accelpact.run`` gives each rank: torchrun's variables plus accelpact's (pure).

torchrun's set (a torchrun script reads these unchanged): ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE``, ``GROUP_RANK`` (the node rank), ``GROUP_WORLD_SIZE``, ``ROLE_RANK``,
``ROLE_WORLD_SIZE``, ``ROLE_NAME``, ``MASTER_ADDR``, ``MASTER_PORT`` (the agent's store, as torchrun's
``TORCHELASTIC_USE_AGENT_STORE=True``), ``TORCHELASTIC_RUN_ID``, ``TORCHELASTIC_RESTART_COUNT``,
``TORCHELASTIC_MAX_RESTARTS``, and ``OMP_NUM_THREADS=1`` when several ranks share a node and it is unset
(as torchrun does).

accelpact's: ``ACCELPACT_CONTROL_ADDR`` (the same store), ``ACCELPACT_JOB_TOKEN``
(``torchrun-<run id>-attempt<n>``: what ``ControlChannel.from_torchrun`` would derive, so both agree),
``ACCELPACT_SNAPSHOT_TOKEN`` (``torchrun-<run id>``: the same across group restarts, so a restarted group
finds its snapshots), ``ACCELPACT_SNAPSHOT_ROOT`` (when the launcher was given one).

A replacement process also gets ``ACCELPACT_REPLACEMENT=<n>`` (the agent's n-th replacement, n >= 1),
``ACCELPACT_REPLACES_PID`` (the dead process) and ``ACCELPACT_T_LAUNCH`` (when the agent started it, for
the heal's timings); :func:`replacement` reads them. A hot spare gets ``ACCELPACT_SPARE`` until the agent
assigns it a rank (accelpact.run.spare).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from accelpact.run import spare

__all__ = [
    "Replacement",
    "replacement",
    "RankPlace",
    "worker_env",
    "job_token",
    "snapshot_token",
    "REPLACEMENT_ENV",
    "REPLACES_PID_ENV",
    "T_LAUNCH_ENV",
]

REPLACEMENT_ENV = "ACCELPACT_REPLACEMENT"
REPLACES_PID_ENV = "ACCELPACT_REPLACES_PID"
T_LAUNCH_ENV = "ACCELPACT_T_LAUNCH"


@dataclass(frozen=True)
class Replacement:
    """This process replaces a lost rank: pass ``t_launch`` to ``accelpact.rejoin``."""

    number: int  # the agent's n-th replacement (1-based)
    replaces_pid: int | None  # the process it replaces
    t_launch: float | None  # when the agent started (or forked) it, wall clock


def replacement(env: Mapping[str, str] | None = None) -> Replacement | None:
    """None in a rank started with the group; a :class:`Replacement` in a process replacing a lost rank.

    In a hot spare (``accelpact-run --hot-spares N``) it first blocks until the agent assigns the spare a
    dead rank, and takes that rank's environment (accelpact.run.spare): call it before reading ``RANK``."""
    if env is None and spare.is_spare():
        spare.wait_for_rank()
    env = os.environ if env is None else env
    raw = env.get(REPLACEMENT_ENV, "")
    if not raw or raw == "0":
        return None
    pid = env.get(REPLACES_PID_ENV)
    t = env.get(T_LAUNCH_ENV)
    return Replacement(number=int(raw), replaces_pid=int(pid) if pid else None, t_launch=float(t) if t else None)


def job_token(run_id: str, attempt: int) -> str:
    """The control channel's token of one attempt (as accelpact derives it under torchrun)."""
    return f"torchrun-{run_id.replace('/', '_')}-attempt{attempt}"


def snapshot_token(run_id: str) -> str:
    """The snapshots' token: the same in every attempt of the run."""
    return f"torchrun-{run_id.replace('/', '_')}"


@dataclass(frozen=True)
class RankPlace:
    """Where a rank sits: its numbers in the world and on its node."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    nnodes: int


def worker_env(
    place: RankPlace,
    *,
    master_addr: str,
    master_port: int,
    run_id: str,
    attempt: int,
    max_restarts: int,
    snapshot_root: str | None = None,
    replacement_of: tuple[int, int, float] | None = None,
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The full environment of one rank process: ``base`` (the agent's) plus the variables above.

    ``replacement_of``: (replacement number, dead pid, launch time) for a replacement process."""
    env = dict(os.environ if base is None else base)
    addr = f"{master_addr}:{master_port}"
    env.update(
        {
            "RANK": str(place.rank),
            "LOCAL_RANK": str(place.local_rank),
            "WORLD_SIZE": str(place.world_size),
            "LOCAL_WORLD_SIZE": str(place.local_world_size),
            "GROUP_RANK": str(place.node_rank),
            "GROUP_WORLD_SIZE": str(place.nnodes),
            "ROLE_RANK": str(place.rank),
            "ROLE_WORLD_SIZE": str(place.world_size),
            "ROLE_NAME": "default",
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(master_port),
            "TORCHELASTIC_RUN_ID": run_id,
            "TORCHELASTIC_RESTART_COUNT": str(attempt),
            "TORCHELASTIC_MAX_RESTARTS": str(max_restarts),
            "TORCHELASTIC_USE_AGENT_STORE": "True",
            "ACCELPACT_CONTROL_ADDR": addr,
            "ACCELPACT_JOB_TOKEN": job_token(run_id, attempt),
            "ACCELPACT_SNAPSHOT_TOKEN": snapshot_token(run_id),
        }
    )
    if place.local_world_size > 1:
        env.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default: ranks of one node share its cores
    if snapshot_root:
        env["ACCELPACT_SNAPSHOT_ROOT"] = snapshot_root
    for name in (REPLACEMENT_ENV, REPLACES_PID_ENV, T_LAUNCH_ENV):
        env.pop(name, None)
    if replacement_of is not None:
        number, pid, t_launch = replacement_of
        env.update({REPLACEMENT_ENV: str(number), REPLACES_PID_ENV: str(pid), T_LAUNCH_ENV: repr(t_launch)})
    return env
