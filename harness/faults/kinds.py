"""The built-in fault kinds: one ``FaultSpec`` entry each, with the parent-side action of the kind.

Each kind also has ``conf/fault/<kind>.yaml``. A parent-side action gets the ``FaultDriver`` and the
rank's request (index, kind, step, phase, rank, age); it acts, records the ``fault`` event with the
time it acted (``driver.record``) and acks the rank (``driver.ack``) unless the rank is gone.

- ``hang``: SIGSTOP the rank's process group, ack (the rank reads it once continued), SIGCONT it
  ``fault.outage_s`` later from the poll loop.
- ``kill``: SIGKILL the rank's process group; no ack.
- ``kill_all``: SIGKILL every rank of the job at once and wait until all are gone (``harness.faults.kill_all``:
  a whole-job crash); no ack.
- ``host_loss``: SIGKILL every rank of the rank's host and delete the host's snapshot root
  (``harness.faults.host_loss``); no ack.
- ``tcp_reset``: ``ss -K`` on the rank's data-plane sockets inside its namespace, then ack.
- ``blackhole`` / ``link_down``: a link outage on the rank's data link for ``fault.outage_s``, held
  on a background thread; ack once it is applied.
- ``control_store_loss``: SIGKILL the child process hosting the control store, ack; the rank then
  resets its own gloo connections (its ``rank_action``): a fault with no control store to agree on.
"""

from __future__ import annotations

import functools
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from harness.faults.host_loss import apply_host_loss
from harness.faults.kill_all import apply_kill_all
from harness.faults.spec import FaultSpec


def apply_hang(driver: Any, req: dict) -> None:
    outage = float(driver.run.fault.outage_s)
    driver.signal(int(req["rank"]), signal.SIGSTOP)
    driver.record(req, outage_s=outage)
    driver.ack(req)
    driver.stop_until(int(req["rank"]), time.time() + outage)


def apply_kill(driver: Any, req: dict) -> None:
    driver.record(req)
    driver.signal(int(req["rank"]), signal.SIGKILL)


def apply_tcp_reset(driver: Any, req: dict) -> None:
    plane = driver.run.fault.link.value
    record = driver.topology_or_fail().tcp_reset([int(req["rank"])], plane=plane)
    driver.record(req, sockets_reset=record.sockets_reset, link=plane)
    driver.ack(req)


def link_outage(cut: str) -> Callable[[Any, dict], None]:
    """The parent action of a link outage: ``cut`` (a ``harness.faults.netns.LinkCut``, by value: the
    ranks import this registry, and the namespaces module is the parent's alone) on the link of the
    rank's host that ``fault.link`` names (data by default) for fault.outage_s."""
    return functools.partial(apply_link_outage, cut=cut)


def apply_link_outage(driver: Any, req: dict, cut: str) -> None:
    topo = driver.topology_or_fail()
    kind, rank, outage = str(req["kind"]), int(req["rank"]), float(driver.run.fault.outage_s)
    plane = driver.run.fault.link.value
    applied = threading.Event()

    def outage_body() -> None:
        try:
            with topo.outage(cut, [rank], plane=plane):
                driver.record(req, outage_s=outage, link=plane)
                applied.set()
                topo._closed.wait(outage)  # returns early if the topology is torn down
        except Exception as exc:  # noqa: BLE001 - recorded in the row
            driver.errors.append(f"{kind} on rank {rank}: {exc}")
        finally:
            applied.set()

    driver.in_background(f"fault-{kind}-{rank}", outage_body)
    applied.wait(15)
    driver.ack(req)


def apply_control_store_loss(driver: Any, req: dict) -> None:
    store = driver.store_host
    if store is None:
        raise RuntimeError("fault=control_store_loss needs the control store in a child process (store_in_child)")
    host, port = store.addr
    store.kill()
    driver.record(req, control_store=f"{host}:{port}")
    driver.ack(req)


BUILTIN: tuple[FaultSpec, ...] = (
    FaultSpec("none", "no fault", where="none"),
    FaultSpec(
        "socket_reset",
        "in-process: shutdown(SHUT_RDWR) on the rank's own gloo sockets (a connection reset); no root",
        where="rank",
        rank_action="reset",
    ),
    FaultSpec(
        "nested_reset",
        "in-process: a socket reset, then another on the same rank(s) inside the in-memory "
        "recovery it starts (before the new generation's first collective): a two-round recovery; no root",
        where="rank",
        rank_action="reset",
        nested=True,
    ),
    FaultSpec(
        "hang",
        "SIGSTOP the rank for fault.outage_s, then SIGCONT",
        where="parent",
        parent_apply=apply_hang,
        outage=True,
    ),
    FaultSpec(
        "kill",
        "SIGKILL the rank (accelpact heals it from its snapshot; others restart)",
        where="parent",
        parent_apply=apply_kill,
        kills_ranks=True,
    ),
    FaultSpec(
        "kill_all",
        "SIGKILL every rank at once, a whole-job crash (accelpact_heal resumes from its shared-memory "
        "snapshots; the others from the checkpoint)",
        where="parent",
        parent_apply=apply_kill_all,
        kills_ranks=True,
        kills_all=True,
    ),
    FaultSpec(
        "host_loss",
        "network namespaces: SIGKILL every rank of the rank's host and delete that host's "
        "snapshot directory (its shared memory)",
        where="netns",
        parent_apply=apply_host_loss,
        kills_ranks=True,
    ),
    FaultSpec(
        "control_store_loss",
        "SIGKILL the process hosting the control store, then a socket reset on the "
        "rank: no store to agree on, so accelpact falls back to checkpoint restore; no root",
        where="parent",
        parent_apply=apply_control_store_loss,
        rank_action="reset",
        store_in_child=True,
    ),
    FaultSpec(
        "tcp_reset",
        "network namespaces: destroy the rank's gloo TCP connections (ss -K)",
        where="netns",
        parent_apply=apply_tcp_reset,
    ),
    FaultSpec(
        "blackhole",
        "network namespaces: drop all of the rank's data-link traffic for fault.outage_s",
        where="netns",
        parent_apply=link_outage("blackhole"),
        outage=True,
    ),
    FaultSpec(
        "link_down",
        "network namespaces: ip link set eth0 down on the rank for fault.outage_s",
        where="netns",
        parent_apply=link_outage("link_down"),
        outage=True,
    ),
)
