"""A hot spare of ``accelpact.run``: a process started with the ranks that waits to become a lost rank.

``accelpact-run --hot-spares N`` starts N extra processes per node running the same script, with
``ACCELPACT_SPARE=<i>`` and ``ACCELPACT_SPARE_KEY=<store key>`` in their environment. The script's first
accelpact call, :func:`accelpact.run.replacement`, blocks in such a process (:func:`wait_for_rank`) until the
agent assigns it a dead rank by writing that key: the rank's whole environment (torchrun's variables and
``ACCELPACT_REPLACEMENT``) and its log file. The spare then takes that environment, sends its output to
the rank's log, and returns the :class:`~accelpact.run.env.Replacement` as a forked or spawned
replacement would get it; the script goes on with ``accelpact.rejoin``.

What a spare saves over the template's fork: the fork itself and the script's top-level code (its imports
are done, its arguments parsed) — the process exists before the death. What it costs: one idle process
per spare, holding its imports' memory for the whole run (docs/launcher.md, "Hot spares"). Until assigned a
spare has no rank: a script must call ``accelpact.run.replacement()`` before it reads ``RANK`` or
``LOCAL_RANK`` (or sets its device).

A spare whose agent is gone (its pid no longer exists) exits instead of waiting forever.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from accelpact.run.template import _exists  # is a pid still there (the template's own check)

__all__ = ["SPARE_ENV", "SPARE_KEY_ENV", "is_spare", "wait_for_rank", "assignment"]

SPARE_ENV = "ACCELPACT_SPARE"
SPARE_KEY_ENV = "ACCELPACT_SPARE_KEY"
# How long one wait on the store lasts before the spare checks that its agent is still alive.
WAIT_SLICE_S = 2.0


def is_spare(env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return bool(env.get(SPARE_ENV))


def assignment(env: Mapping[str, str], log: str | None) -> bytes:
    """What the agent writes under a spare's key: the rank's environment and its log file."""
    return json.dumps({"env": dict(env), "log": log}).encode()


def wait_for_rank(env: Any = None, *, redirect: bool = True) -> None:
    """Block until the agent assigns this spare a rank; then take that rank's environment (in place) and,
    with ``redirect``, send this process's output to the rank's log. Exits the process (code 0) when the
    agent is gone."""
    import torch.distributed as dist

    env = os.environ if env is None else env
    host, _, port = env["ACCELPACT_CONTROL_ADDR"].rpartition(":")
    key = env[SPARE_KEY_ENV]
    agent = int(env.get("ACCELPACT_AGENT_PID", "0") or 0)
    store = dist.TCPStore(host, int(port), None, False, timeout=timedelta(seconds=60))
    store.set_timeout(timedelta(seconds=WAIT_SLICE_S))
    while True:
        try:
            store.wait([key])
            break
        except Exception:  # noqa: BLE001 - torch raises DistStoreError (a RuntimeError) on the slice's timeout
            if agent and not _exists(agent):
                print(
                    f"accelpact.run hot spare {env.get(SPARE_ENV)}: its agent (pid {agent}) is gone; exiting",
                    file=sys.stderr,
                    flush=True,
                )
                os._exit(0)
    got = json.loads(store.get(key).decode())
    env.update(got["env"])
    if redirect and got.get("log"):  # from now on this process is the rank: its output goes where the rank's does
        fd = os.open(got["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    env.pop(SPARE_ENV, None)
    env.pop(SPARE_KEY_ENV, None)
    env["ACCELPACT_T_ASSIGNED"] = repr(time.time())
