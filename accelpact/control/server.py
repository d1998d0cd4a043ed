"""Hosting the control store (:func:`start_control_server`) and minting a job's token (:func:`new_job_token`).

The launcher, the harness parent or a test process calls these; the ranks connect with
:class:`accelpact.control.ControlChannel`.
"""

from __future__ import annotations

import datetime
import secrets
from typing import TYPE_CHECKING

from accelpact.control.store_client import _dist

if TYPE_CHECKING:
    import torch.distributed

__all__ = ["start_control_server", "new_job_token"]


def start_control_server(host: str = "127.0.0.1", port: int = 0) -> tuple[torch.distributed.TCPStore, int]:
    """Host the control store in this process (a long-lived one the data-plane faults do not touch).

    ``port=0`` binds a free port. Returns the server store (keep a reference: the server lives as
    long as it) and the bound port.
    """
    dist = _dist()
    server: torch.distributed.TCPStore = dist.TCPStore(
        host, port, None, True, timeout=datetime.timedelta(seconds=60), wait_for_workers=False
    )
    return server, server.port


def new_job_token() -> str:
    """A fresh per-job token (16 hex characters) for ControlConfig.job_token / ACCELPACT_JOB_TOKEN."""
    return secrets.token_hex(8)
