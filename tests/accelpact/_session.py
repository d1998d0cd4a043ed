"""Runs a multi-process recovery session: control server here, one subprocess per rank.

Several fault scenarios share one session (one interpreter start-up, ~5 s, per rank instead of one
per case). The result is per scenario and per rank: recovery events, errors, saved tensors.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from accelpact.control import new_job_token, start_control_server

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


@dataclass
class Session:
    out_dir: Path
    world_size: int
    results: list[dict[str, Any]]  # per rank: scenario name -> result
    returncodes: list[int]
    logs: list[str] = field(default_factory=list)
    wall_s: float = 0.0

    def result(self, scenario: str, rank: int) -> dict[str, Any] | None:
        return self.results[rank].get(scenario)

    def tensors(self, scenario: str, rank: int) -> dict[str, Any]:
        return torch.load(self.out_dir / f"{scenario}.rank{rank}.pt", weights_only=True)


def run_session(tmp: Path, scenarios: list[dict], *, world_size: int = 2, flavour: str = "fsdp2",
                compile: str | None = None, pg_timeout_s: float = 120.0, control_deadline_s: float = 60.0,
                timeout_s: float = 280.0) -> Session:
    tmp.mkdir(parents=True, exist_ok=True)
    server, port = start_control_server()
    token = new_job_token()
    procs = []
    log_files = []
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", TORCHINDUCTOR_COMPILE_THREADS="1")
    t0 = time.time()
    for rank in range(world_size):
        cfg = {"rank": rank, "world_size": world_size, "host": "127.0.0.1", "port": port,
               "job_token": token, "out_dir": str(tmp), "flavour": flavour, "compile": compile,
               "pg_timeout_s": pg_timeout_s, "control_deadline_s": control_deadline_s,
               "scenarios": scenarios}
        path = tmp / f"config.rank{rank}.json"
        path.write_text(json.dumps(cfg))
        log = open(tmp / f"log.rank{rank}.txt", "w")
        log_files.append(log)
        procs.append(subprocess.Popen([sys.executable, str(HERE / "_rank.py"), str(path)],
                                      stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(ROOT)))
    deadline = time.time() + timeout_s
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(1.0, deadline - time.time())))
        except subprocess.TimeoutExpired:
            p.kill()
            codes.append(p.wait())
    for f in log_files:
        f.close()
    del server
    results = []
    for rank in range(world_size):
        path = tmp / f"results.rank{rank}.json"
        results.append(json.loads(path.read_text()) if path.exists() else {})
    logs = [(tmp / f"log.rank{r}.txt").read_text()[-4000:] for r in range(world_size)]
    return Session(tmp, world_size, results, codes, logs, time.time() - t0)
