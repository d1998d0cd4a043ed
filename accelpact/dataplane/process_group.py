"""``init_process_group`` that survives a torchrun restart: one store prefix per restart attempt.

Plain ``env://`` fails after torchrun restarts a worker group under its default static rendezvous: that
rendezvous keeps ONE agent store for every attempt, and the new workers read the dead attempt's gloo
addresses from it ("Gloo connectFullMesh failed ... Connection refused"; docs/torchrun.md has the
measurement). :func:`init_process_group` therefore initialises the group on
``PrefixStore("accelpact/attempt<N>")`` over torchrun's store, N = ``TORCHELASTIC_RESTART_COUNT``.
Outside torchrun it is plain ``env://``.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Mapping
from typing import Any

import torch.distributed as dist

__all__ = ["init_process_group", "ATTEMPT_PREFIX"]

ATTEMPT_PREFIX = "accelpact/attempt"


def init_process_group(
    backend: str, timeout: datetime.timedelta | None = None, env: Mapping[str, str] | None = None
) -> None:
    """``dist.init_process_group(backend)`` from the launcher's environment, on a store prefix of its
    own per torchrun restart attempt (``accelpact/attempt<TORCHELASTIC_RESTART_COUNT>``).

    Under torchrun the store is torchrun's (``MASTER_ADDR:MASTER_PORT``): the agent's when
    ``TORCHELASTIC_USE_AGENT_STORE=True`` (the default), else rank 0 hosts it, as ``env://`` would.
    Not under torchrun (no ``TORCHELASTIC_RESTART_COUNT``): plain ``env://``, unchanged.
    ``timeout``: the process group's timeout (torch's default when None).
    """
    env = os.environ if env is None else env
    extra: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
    restart = env.get("TORCHELASTIC_RESTART_COUNT")
    if restart is None:
        dist.init_process_group(backend, **extra)
        return
    rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    hosts_store = env.get("TORCHELASTIC_USE_AGENT_STORE") != "True" and rank == 0
    store = dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), world, is_master=hosts_store, multi_tenant=True)
    dist.init_process_group(
        backend, store=dist.PrefixStore(f"{ATTEMPT_PREFIX}{restart}", store), rank=rank, world_size=world, **extra
    )
