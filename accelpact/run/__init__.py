"""accelpact's launcher: run a torchrun-style script so that a lost rank is healed, not restarted.

``python -m accelpact.run --nproc-per-node 2 train.py ...`` (console script ``accelpact-run``) takes
torchrun's common flags and exports torchrun's environment, so a torchrun script runs unchanged. One
agent per node starts the node's ranks, hosts the control store on the first node (or connects to it),
and when a rank dies it writes the death notice, keeps the survivors running and starts one replacement
process for that rank, forked from a preloaded template. A heal that cannot happen restarts the whole
worker group, which resumes from the in-memory snapshots. docs/launcher.md has the whole story.

In the training script, :func:`replacement` says whether this process replaces a lost rank (then call
``accelpact.rejoin`` instead of ``init_process_group``). This package imports nothing heavy at import
time: the agent and the template import torch only where they need it.
"""

from accelpact.run.env import Replacement, replacement
from accelpact.run.forkserver import die_with_parent

__all__ = ["Replacement", "replacement", "die_with_parent"]
