"""Launch a multi-process accelpact session for an experiment and compare its results.

``run_session`` hosts the out-of-band control store in this process, starts one
``experiments._accelpact_rank`` process per rank (gloo over 127.0.0.1), waits, and returns every
rank's job results. ``bit_differences`` compares a job's saved state with a reference job's:
every loss, every local parameter shard and every optimizer-state tensor, by ``torch.equal`` and
by sha256 of the bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Session:
    out_dir: Path
    world_size: int
    results: list[dict[str, Any]]  # per rank: job name -> result
    returncodes: list[int]
    logs: list[str] = field(default_factory=list)
    wall_s: float = 0.0

    def job(self, name: str) -> list[dict[str, Any]]:
        """Every rank's result of job ``name``; raises naming the rank and its error if one failed."""
        out = []
        for rank, res in enumerate(self.results):
            r = res.get(name)
            if r is None:
                raise RuntimeError(f"rank {rank} did not finish job {name!r} (exit {self.returncodes[rank]}); "
                                   f"log tail:\n{self.logs[rank]}")
            if r.get("error"):
                raise RuntimeError(f"rank {rank}, job {name!r}: {r['error']['type']}: {r['error']['message']}\n"
                                   f"{r['error'].get('traceback', '')}")
            out.append(r)
        return out

    def tensors(self, name: str, rank: int) -> dict[str, Any]:
        import torch

        return torch.load(self.out_dir / f"{name}.rank{rank}.pt", weights_only=True)


def run_session(out_dir: Path, jobs: list[dict], *, world_size: int, pg_timeout_s: float = 120.0,
                control_deadline_s: float = 120.0, timeout_s: float = 900.0,
                env_extra: dict[str, str] | None = None) -> Session:
    from accelpact.control import new_job_token, start_control_server

    out_dir.mkdir(parents=True, exist_ok=True)
    server, port = start_control_server()
    token = new_job_token()
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", TORCHINDUCTOR_COMPILE_THREADS="1",
               **(env_extra or {}))
    procs, logs = [], []
    t0 = time.time()
    for rank in range(world_size):
        cfg = {"rank": rank, "world_size": world_size, "host": "127.0.0.1", "port": port, "job_token": token,
               "out_dir": str(out_dir), "pg_timeout_s": pg_timeout_s, "control_deadline_s": control_deadline_s,
               "jobs": jobs}
        path = out_dir / f"config.rank{rank}.json"
        path.write_text(json.dumps(cfg))
        log = open(out_dir / f"log.rank{rank}.txt", "w")
        logs.append(log)
        procs.append(subprocess.Popen([sys.executable, "-m", "experiments._accelpact_rank", str(path)],
                                      stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(ROOT)))
    deadline = time.time() + timeout_s
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(1.0, deadline - time.time())))
        except subprocess.TimeoutExpired:
            p.kill()
            codes.append(p.wait())
    for f in logs:
        f.close()
    del server
    results = []
    for rank in range(world_size):
        path = out_dir / f"results.rank{rank}.json"
        results.append(json.loads(path.read_text()) if path.exists() else {})
    tails = [(out_dir / f"log.rank{r}.txt").read_text()[-4000:] for r in range(world_size)]
    return Session(out_dir, world_size, results, codes, tails, time.time() - t0)


def sha256(t: Any) -> str:
    return hashlib.sha256(t.detach().contiguous().reshape(-1).view(__import__("torch").uint8).numpy()
                          .tobytes()).hexdigest()


def bit_differences(session: Session, name: str, reference: str) -> tuple[list[str], dict[str, int]]:
    """Mismatches between job ``name`` and ``reference`` on every rank ([] when bit-identical), and
    counts of what was compared (tensors, bytes, losses)."""
    import torch

    diffs: list[str] = []
    counts = {"tensors": 0, "bytes": 0, "losses": 0}
    for rank in range(session.world_size):
        ref, got = session.tensors(reference, rank), session.tensors(name, rank)
        if len(ref["losses"]) != len(got["losses"]):
            diffs.append(f"rank {rank}: {len(got['losses'])} losses, reference has {len(ref['losses'])}")
        for i, (a, b) in enumerate(zip(ref["losses"], got["losses"])):
            counts["losses"] += 1
            if not torch.equal(a, b):
                diffs.append(f"rank {rank}: loss of step {i} {b.item()!r} != reference {a.item()!r}")
        if set(ref["state"]) != set(got["state"]):
            diffs.append(f"rank {rank}: state keys differ: {sorted(set(ref['state']) ^ set(got['state']))[:5]}")
        for key in sorted(set(ref["state"]) & set(got["state"])):
            a, b = ref["state"][key], got["state"][key]
            counts["tensors"] += 1
            counts["bytes"] += a.numel() * a.element_size()
            if not torch.equal(a, b) or sha256(a) != sha256(b):
                diffs.append(f"rank {rank}: {key} differs (max abs diff "
                             f"{(a.double() - b.double()).abs().max().item():.3e})")
    return diffs, counts


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]
