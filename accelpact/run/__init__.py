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

The pieces another launcher builds on (the harness's parent is one) are public here too: starting and
watching worker processes (:class:`Workers`, :func:`spawn`, :func:`start_replacement`, :class:`Notices`,
:func:`describe_exit`), the preloaded template a replacement is forked from (:class:`TemplateClient`,
:class:`ForkedRank`) and the fork server inside it (:func:`serve`, :func:`fork_one`, :func:`reap`).
"""

from accelpact.run.env import Replacement, replacement
from accelpact.run.forkserver import die_with_parent, enter_netns, fork_one, reap, serve, thread_count
from accelpact.run.signals import raise_on_signals
from accelpact.run.template import FORK_REPLY_S, READY_WAIT_S, ForkedRank, TemplateClient, TemplateUnavailable
from accelpact.run.workers import HOT_SPARE, Notices, Workers, describe_exit, spawn, start_replacement

__all__ = [
    "Replacement",
    "replacement",
    "die_with_parent",
    "Workers",
    "Notices",
    "spawn",
    "start_replacement",
    "describe_exit",
    "HOT_SPARE",
    "TemplateClient",
    "TemplateUnavailable",
    "ForkedRank",
    "FORK_REPLY_S",
    "READY_WAIT_S",
    "serve",
    "fork_one",
    "reap",
    "enter_netns",
    "thread_count",
    "raise_on_signals",
]
