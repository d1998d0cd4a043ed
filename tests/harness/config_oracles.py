"""What a validation answer must satisfy, shared by the config fuzz and the cross-group test.

A refusal is one line that gives a reason and then names a fix. An acceptance must be runnable as the
parent will set the run up: the fault's spec needs (a store it can kill, network namespaces) must be
what ``harness.faults.placement`` gives it. The fuzz once accepted anything that validated, so
``fault=control_store_loss cluster=local_hosts`` validated and then ran fault-free with a driver error in
its row; and ``error: : try ...`` (a GPU ``cluster=slurm`` refused with no reason) passed as "names a fix".
"""

from __future__ import annotations

import re

from harness.faults import registry as faults
from harness.faults.placement import StoreHome, placement
from harness.schema import RunConfig

# Words or quoting by which an error line names its fix (an override in backticks, or a direction).
FIX = re.compile(r"`[^`]+`|\b(try|e\.g\.|use|set|pick|choose|lower|raise|give|remove|drop|add)\b", re.I)


def check_refusal(context: object, message: str) -> None:
    """One line, a reason first (a few words before the fix), then the fix."""
    assert "\n" not in message.strip(), (context, message)
    assert "Traceback" not in message, (context, message)
    fix = FIX.search(message)
    assert fix, f"{context}: the error names no fix: {message}"
    reason = message[: fix.start()]
    assert re.search(r"[A-Za-z]{3,}", reason), f"{context}: the error gives no reason before its fix: {message}"


def check_parent_can_run(run: RunConfig) -> None:
    """A validated run gets from the parent what its fault's spec needs."""
    spec = faults.get(run.fault.kind)
    where = placement(run)
    what = f"fault={run.fault.kind} cluster={run.cluster.name} (hosts={run.cluster.hosts})"
    if spec.store_in_child:
        assert where.store == StoreHome.child, f"{what} validated, but its store would be in the {where.store.value}"
    if spec.needs_netns:
        assert where.namespaces, f"{what} validated, but its ranks would not run in namespaces"
