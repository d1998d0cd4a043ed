"""Where the control store is, read from what the launcher exported: accelpact's own variables or torchrun's.

Two sources, in this order:

1. ``ACCELPACT_CONTROL_ADDR=host:port`` and ``ACCELPACT_JOB_TOKEN`` (the harness, Slurm scripts, or
   anything that hosts its own long-lived store);
2. torchrun's own store: ``MASTER_ADDR:MASTER_PORT``, with ``TORCHELASTIC_RUN_ID`` (and the restart count)
   as the job token. torchrun's agent process hosts it, not a worker (docs/torchrun.md), so a data-plane
   fault inside the workers never touches it.

Either variable of (1) overrides its counterpart of (2). ``RANK`` and ``WORLD_SIZE`` come from the
launcher in both cases.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from accelpact.errors import AccelPactError

__all__: list[str] = []  # private to accelpact.control

_DEFAULT_DEADLINE_S = 30.0
_DEFAULT_CONNECT_TIMEOUT_S = 30.0


def under_torchrun(env: Mapping[str, str]) -> bool:
    """True when torchrun (torch.distributed.run's elastic agent) started this process."""
    return bool(env.get("TORCHELASTIC_RUN_ID"))


def torchrun_token(env: Mapping[str, str]) -> str:
    """The job token of a torchrun job: its run id plus the restart count.

    The restart count keeps a group restarted by ``--max-restarts`` out of the keys of the attempt
    before it (torch's own env:// rendezvous separates attempts the same way), and '/' is the key
    separator, so it is replaced.
    """
    run_id = env["TORCHELASTIC_RUN_ID"].replace("/", "_")
    return f"torchrun-{run_id}-attempt{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"


def _need(env: Mapping[str, str], name: str, hint: str) -> str:
    value = env.get(name)
    if not value:
        raise AccelPactError(f"environment variable {name} is not set: {hint}")
    return value


def _split_addr(addr: str, name: str) -> tuple[str, int]:
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise AccelPactError(f"{name}={addr!r} must look like host:port, e.g. 127.0.0.1:29600")
    return host.strip("[]"), int(port)


def control_settings(env: Mapping[str, str] | None = None, *, torchrun_only: bool = False) -> dict[str, Any]:
    """Keyword arguments for ControlConfig (all but rank and world size) from the environment.

    ``torchrun_only``: ignore the ACCELPACT_* variables and use torchrun's store and run id.
    """
    env = os.environ if env is None else env
    hint = (
        "export ACCELPACT_CONTROL_ADDR=host:port and ACCELPACT_JOB_TOKEN (the same on every rank), "
        "or start the job with torchrun, whose store (MASTER_ADDR:MASTER_PORT) and run id are used then"
    )
    torchrun = under_torchrun(env)
    if torchrun_only and not torchrun:
        raise AccelPactError(
            "TORCHELASTIC_RUN_ID is not set: this process was not started by torchrun. Under "
            "another launcher use ControlChannel.from_env() with ACCELPACT_CONTROL_ADDR and "
            "ACCELPACT_JOB_TOKEN"
        )
    if env.get("ACCELPACT_CONTROL_ADDR") and not torchrun_only:
        host, port = _split_addr(env["ACCELPACT_CONTROL_ADDR"], "ACCELPACT_CONTROL_ADDR")
    elif torchrun:
        host = _need(env, "MASTER_ADDR", "torchrun normally exports it; " + hint)
        port = int(_need(env, "MASTER_PORT", "torchrun normally exports it; " + hint))
    else:
        _need(env, "ACCELPACT_CONTROL_ADDR", hint)
        raise AssertionError("unreachable")
    if env.get("ACCELPACT_JOB_TOKEN") and not torchrun_only:
        token, source = env["ACCELPACT_JOB_TOKEN"], "ACCELPACT_JOB_TOKEN"
    elif torchrun:
        token, source = torchrun_token(env), "TORCHELASTIC_RUN_ID"
    else:
        token, source = _need(env, "ACCELPACT_JOB_TOKEN", hint), "ACCELPACT_JOB_TOKEN"
    return {
        "host": host,
        "port": port,
        "job_token": token,
        "token_source": source,
        "deadline_s": float(env.get("ACCELPACT_CONTROL_DEADLINE_S", _DEFAULT_DEADLINE_S)),
        "connect_timeout_s": float(env.get("ACCELPACT_CONTROL_CONNECT_TIMEOUT_S", _DEFAULT_CONNECT_TIMEOUT_S)),
    }


def launcher_int(name: str, env: Mapping[str, str] | None = None) -> int:
    """RANK or WORLD_SIZE as the launcher exported it."""
    env = os.environ if env is None else env
    return int(_need(env, name, "the launcher (torchrun, srun, the harness) must export RANK and WORLD_SIZE"))
