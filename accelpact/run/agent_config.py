"""What one node's agent of ``accelpact.run`` runs: :class:`AgentConfig`, its command line parsed
(accelpact.run.cli) and checked, and where each of the node's ranks sits in the job (:meth:`AgentConfig.place`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from accelpact.run.env import RankPlace

__all__ = ["AgentConfig", "REPLACE_MODES"]

REPLACE_MODES = ("template", "spawn", "none")


@dataclass(frozen=True)
class AgentConfig:
    """What one node's agent runs (the command line, parsed: accelpact.run.cli)."""

    entry: tuple[str, ...]  # the script and its arguments (or, with module=True, the module and its arguments)
    nnodes: int = 1
    nproc_per_node: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    run_id: str = "none"
    max_restarts: int = 0
    max_replacements: int = 3
    replacement: str = "template"
    module: bool = False
    snapshot_root: str | None = None  # "%n" is replaced by the node rank
    log_dir: Path | None = None
    preload: tuple[str, ...] = ()
    join_timeout_s: float = 300.0
    python: str = sys.executable
    hot_spares: int = 0  # idle processes per node that take a killed rank's place (accelpact.run.spare)

    def __post_init__(self) -> None:
        if self.nnodes < 1 or self.nproc_per_node < 1:
            raise ValueError(f"--nnodes={self.nnodes} and --nproc-per-node={self.nproc_per_node} must be >= 1")
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"--node-rank={self.node_rank} must be in 0..{self.nnodes - 1} (--nnodes={self.nnodes})")
        if self.nnodes > 1 and self.master_port == 0:
            raise ValueError(
                "several nodes need a fixed store port: pass --master-port (or --rdzv-endpoint "
                "HOST:PORT), the same on every node"
            )
        if self.replacement not in REPLACE_MODES:
            raise ValueError(f"--replacement={self.replacement!r}: choose one of {', '.join(REPLACE_MODES)}")
        if not self.entry:
            raise ValueError("no training script given: accelpact-run [flags] SCRIPT [script args]")
        if self.hot_spares < 0 or (self.hot_spares and self.replacement == "none"):
            raise ValueError(
                f"--hot-spares={self.hot_spares} with --replacement={self.replacement}: spares replace "
                "killed ranks; give a count >= 0, and drop --replacement=none to use them"
            )

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    def place(self, local_rank: int) -> RankPlace:
        return RankPlace(
            rank=self.node_rank * self.nproc_per_node + local_rank,
            local_rank=local_rank,
            world_size=self.world_size,
            local_world_size=self.nproc_per_node,
            node_rank=self.node_rank,
            nnodes=self.nnodes,
        )
