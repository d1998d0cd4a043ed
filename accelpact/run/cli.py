"""The command line of ``accelpact.run`` (``python -m accelpact.run`` / ``accelpact-run``): torchrun's common flags.

Accepted like torchrun: ``--nnodes N`` (or ``N:N``; elastic ranges are refused), ``--nproc-per-node``
(``--nproc_per_node``), ``--node-rank``, ``--master-addr``, ``--master-port``, ``--rdzv-endpoint
HOST:PORT`` (the same as the two before), ``--rdzv-id`` (the run id), ``--max-restarts``,
``--standalone``, ``-m``/``--module``, then the script and its arguments. accelpact's own:
``--max-replacements``, ``--replacement template|spawn|none``, ``--hot-spares``, ``--snapshot-root``, ``--log-dir``,
``--preload``. Under Slurm, ``--node-rank`` defaults to ``$SLURM_NODEID``.
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid
from pathlib import Path

from accelpact.run.agent import Agent, AgentConfig


def _nnodes(text: str) -> int:
    lo, _, hi = text.partition(":")
    if hi and hi != lo:
        raise argparse.ArgumentTypeError(f"--nnodes={text}: elastic node ranges are not supported; give one number")
    return int(lo)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="accelpact-run",
        description="Run a torchrun-style training script; a lost rank is healed in memory (docs/launcher.md).",
    )
    ap.add_argument("--nnodes", type=_nnodes, default=1)
    ap.add_argument("--nproc-per-node", "--nproc_per_node", dest="nproc_per_node", type=int, default=1)
    ap.add_argument(
        "--node-rank", "--node_rank", dest="node_rank", type=int, default=int(os.environ.get("SLURM_NODEID", "0") or 0)
    )
    ap.add_argument("--master-addr", "--master_addr", dest="master_addr", default=None)
    ap.add_argument("--master-port", "--master_port", dest="master_port", type=int, default=None)
    ap.add_argument(
        "--rdzv-endpoint",
        "--rdzv_endpoint",
        dest="rdzv_endpoint",
        default=None,
        help="HOST:PORT of node 0's store (the same as --master-addr/--master-port)",
    )
    ap.add_argument(
        "--rdzv-id",
        "--rdzv_id",
        dest="rdzv_id",
        default=None,
        help="the run id (default: a new one "
        "on a single node; several nodes need the same id on every node, e.g. $SLURM_JOB_ID)",
    )
    ap.add_argument(
        "--rdzv-backend",
        "--rdzv_backend",
        dest="rdzv_backend",
        default="static",
        help="accepted for compatibility; the agents always use node 0's store",
    )
    ap.add_argument("--standalone", action="store_true", help="one node, a free port (the default on one node)")
    ap.add_argument(
        "--max-restarts",
        "--max_restarts",
        dest="max_restarts",
        type=int,
        default=0,
        help="group restarts (from snapshots) when a heal is impossible",
    )
    ap.add_argument(
        "--max-replacements", type=int, default=3, help="replacement processes this agent may start for killed ranks"
    )
    ap.add_argument(
        "--replacement",
        choices=("template", "spawn", "none"),
        default="template",
        help="how a killed rank's replacement starts (default: forked from a preloaded template)",
    )
    ap.add_argument(
        "--hot-spares",
        type=int,
        default=0,
        help="idle processes per node, started with the ranks, "
        "that take a killed rank's place (the script must call accelpact.run.replacement() first)",
    )
    ap.add_argument("--snapshot-root", default=None, help="ACCELPACT_SNAPSHOT_ROOT for the ranks ('%%n': node rank)")
    ap.add_argument("--log-dir", type=Path, default=None, help="each rank's output to LOG_DIR/rank<r>.log")
    ap.add_argument(
        "--preload",
        default="",
        help="comma-separated modules the template imports besides the script's own top-level imports",
    )
    ap.add_argument("-m", "--module", action="store_true", help="the entry is a module (python -m)")
    ap.add_argument("--join-timeout", type=float, default=300.0, help="seconds to wait for the other nodes")
    ap.add_argument("entry", help="the training script (or module with -m)")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    return ap


def config_from_args(argv: list[str]) -> AgentConfig:
    ap = parser()
    a = ap.parse_args(argv)
    host, port = a.master_addr, a.master_port
    if a.rdzv_endpoint:
        h, sep, p = a.rdzv_endpoint.rpartition(":")
        if not sep or not p.isdigit():
            ap.error(f"--rdzv-endpoint={a.rdzv_endpoint!r} must be HOST:PORT")
        host, port = host or h, port if port is not None else int(p)
    if a.standalone and a.nnodes != 1:
        ap.error("--standalone is for one node; drop it or --nnodes")
    if a.nnodes > 1:  # every node must name the same run: no fresh id here
        run_id = a.rdzv_id or os.environ.get("SLURM_JOB_ID", "")
    else:
        run_id = a.rdzv_id or uuid.uuid4().hex[:12]
    if not run_id:
        ap.error("several nodes need the same --rdzv-id on every node (under Slurm $SLURM_JOB_ID is used)")
    try:
        return AgentConfig(
            entry=(a.entry, *a.args),
            nnodes=a.nnodes,
            nproc_per_node=a.nproc_per_node,
            node_rank=a.node_rank,
            master_addr=host or "127.0.0.1",
            master_port=port or 0,
            run_id=run_id,
            max_restarts=a.max_restarts,
            max_replacements=a.max_replacements,
            replacement=a.replacement,
            module=a.module,
            snapshot_root=a.snapshot_root,
            log_dir=a.log_dir,
            preload=tuple(x for x in a.preload.split(",") if x),
            join_timeout_s=a.join_timeout,
            hot_spares=a.hot_spares,
        )
    except ValueError as exc:
        ap.error(str(exc))
        raise AssertionError("unreachable") from None


def main(argv: list[str] | None = None) -> int:
    return Agent(config_from_args(sys.argv[1:] if argv is None else argv)).run()
