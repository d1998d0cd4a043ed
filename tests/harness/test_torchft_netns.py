"""strategy=torchft with its ranks in network namespaces: ``fault=host_loss`` through the harness.

Before, validation refused it: the Lighthouse ran in the parent's network namespace, which the ranks'
namespaces cannot reach. Now it runs where NVRx's store runs (``harness.server_home``): in the
topology's bridge namespace, on the control network's bridge address. Rank 1's host (a namespace of its
own) is lost at step 4: the parent SIGKILLs its rank, torchft's per-group restart starts a replacement in
that namespace, the replacement reaches the Lighthouse and group 0's store over its control link, heals
from group 0 through torchft's own transport, and the run ends with every rank agreeing; the row says
"no by design" for bit-identity (group 1 sat out steps). Nothing is left: no rank, no Lighthouse, no
namespace.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path

import psutil
import pytest
from harness_test_helpers import TINY, read_row, run_harness, worker_processes

pytest.importorskip("torchft")


def _available() -> tuple[bool, str]:
    from harness.faults.netns import namespaces_available

    return namespaces_available()


_OK, _WHY = _available()
FAULT_STEP = 4
STEPS = 10


@pytest.mark.slow  # one harness run: ~60 s here at load 4 on 2 cores
@pytest.mark.netns
@pytest.mark.timeout(900)
@pytest.mark.skipif(not _OK, reason=_WHY)
def test_host_loss_restarts_the_lost_group_in_its_namespace_and_it_heals_from_a_peer(tmp_path):
    from harness.events import read_events
    from harness.faults.addressing import BRIDGE_HOST
    from harness.faults.netns import leftovers

    run_dir = tmp_path / "run"
    done = run_harness(
        [
            *TINY,
            "strategy=torchft",
            "fault=host_loss",
            "fault.ranks=[1]",
            f"fault.at_step={FAULT_STEP}",
            f"train.steps={STEPS}",
            f"hydra.run.dir={run_dir}",
        ],
        tmp_path,
        timeout=800,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    row = read_row(run_dir)
    assert row["status"] == "ok" and row["ranks_agree"], row["reason"]
    assert row["steps_done"] == STEPS and row["faults"] == 1 and row["relaunches"] == 0
    # The Lighthouse ran in the bridge namespace, on the control network (10.x.y.254), not at 127.0.0.1.
    host = ipaddress.ip_address(row["torchft_lighthouse"].split("//", 1)[1].rsplit(":", 1)[0])
    assert host in ipaddress.ip_network("10.0.0.0/8") and int(str(host).rsplit(".", 1)[1]) == BRIDGE_HOST, host
    events = read_events(run_dir)
    [fault] = [e for e in events if e["kind"] == "fault"]
    assert fault["fault"] == "host_loss" and fault["host_ranks"] == [1]
    # torchft's own recovery: group 1 restarted once, its replacement healed from group 0's memory.
    assert row["torchft_group_restarts"] == 1
    restarted = [e for e in events if e["kind"] == "restart" and e["rank"] == 1 and e["replacement"]]
    assert [e["torchft_generation"] for e in restarted] == [1], restarted
    heals = [e for e in events if e["kind"] == "heal" and e["role"] == "replacement"]
    assert [e["rank"] for e in heals] == [1] and heals[0]["source"] == "peer", heals
    assert [e["rank"] for e in events if e["kind"] == "heal" and e["role"] == "sender"] == [0]
    assert row["heal_source"] == "peer" and row["torchft_heals"] == 1
    # Group 1 sat out the steps while it was down: not the reference's math, and the row says why.
    assert row["torchft_short_steps"] >= 1 and str(row["bit_identity_note"]).startswith("no by design")
    # Nothing left behind: ranks, the Lighthouse (its pid from the parent's log line), namespaces.
    assert worker_processes(str(tmp_path)) == []
    [pid] = [int(p) for p in re.findall(r"torchft: Lighthouse \S+ \(.*?pid (\d+)\)", done.stdout)]
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    prefix = Path(fault["snapshot_root"]).name.split("-")[0]  # the job's namespaces: <prefix>-br, <prefix>-r<n>
    assert leftovers(prefix) == [], "the run left namespaces, links, processes or snapshots behind"
