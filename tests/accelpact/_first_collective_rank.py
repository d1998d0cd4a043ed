"""One rank for test_first_collective: rank 1 joins the group but never enters the collective.

``python _first_collective_rank.py <rank> <port> <superseded: 0|1>``; rank 0 prints what
``first_collective`` did as one JSON line.
"""

import json
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch.distributed as dist  # noqa: E402

from accelpact import comm  # noqa: E402
from accelpact.errors import GenerationSuperseded  # noqa: E402

rank, port, flag = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
store = dist.TCPStore("127.0.0.1", port, 2, is_master=rank == 0, timeout=timedelta(seconds=60))
dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=timedelta(seconds=6))
if rank == 1:
    store.wait(["done"])  # alive, connected, and never in the collective
else:
    t0 = time.monotonic()
    try:
        comm.first_collective(dist.group.WORLD, superseded=lambda: flag, poll_s=0.05)
        out = {"result": "completed"}
    except GenerationSuperseded as exc:
        out = {"result": "superseded", "work_kept": exc.work is not None}
    except Exception as exc:  # noqa: BLE001
        out = {"result": type(exc).__name__}
    out["seconds"] = time.monotonic() - t0
    print(json.dumps(out), flush=True)
    store.set("done", "1")
import os  # noqa: E402

os._exit(0)  # the abandoned collective still runs in gloo: do not wait for it at shutdown
