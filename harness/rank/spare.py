"""A hot spare's wait (``strategy.hot_spares``): import everything, then wait for the parent to assign a rank.

Started by the parent with ``HARNESS_SPARE=<index>`` (harness.parent.replacements). It imports torch, the
harness's training code and transformers (a model on the meta device), connects to the control store
and waits for ``{token}/spare/{index}``. The parent writes it when a rank dies; the spare then sets
RANK / LOCAL_RANK / HARNESS_REPLACEMENT and its launch time (the assignment's) in its environment and
trains as a replacement of that rank, which heals in memory without paying for a process start.
"""

from __future__ import annotations

import datetime
import json
import os

from harness.schema import RunConfig
from harness.rank.env import REPLACEMENT, T_LAUNCH, RankEnv

_WAIT_SLICE_S = 60.0


def become_rank(cfg: RunConfig, env: RankEnv, index: int) -> RankEnv:
    """Block until the parent assigns this spare a rank; returns the environment of that rank."""
    import torch.distributed as dist

    import accelpact.snapshot  # noqa: F401 - everything a replacement imports, now rather than after a death
    import harness.rank.train  # noqa: F401
    from harness.parent.replacements import spare_key
    from harness.rank.models import meta_model

    meta_model(cfg.model)
    store = dist.TCPStore(env.control_host, env.control_port, is_master=False,
                          timeout=datetime.timedelta(seconds=_WAIT_SLICE_S))
    key = spare_key(env.token, index)
    while not store.check([key]):
        try:
            store.wait([key], datetime.timedelta(seconds=_WAIT_SLICE_S))
        except Exception:  # noqa: BLE001 - a timed-out slice: wait again (the parent kills an unused spare)
            pass
    job = json.loads(store.get(key).decode())
    rank = int(job["rank"])
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), REPLACEMENT: str(job["replacement"]),
                       T_LAUNCH: repr(float(job["t"]))})
    print(f"spare {index}: taking rank {rank} (replacement {job['replacement']})", flush=True)
    return RankEnv.from_environ()
