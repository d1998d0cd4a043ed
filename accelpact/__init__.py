"""accelpact: in-memory recovery of FSDP training from network faults.

Attach a guard to an existing model, FSDP wrapping and optimizer; it owns the step boundary, and on a
communication fault it agrees with the other ranks over an out-of-band store, builds a fresh data-plane
communicator, rebinds every cached reference in place and continues. See README.md for usage.

This package never imports the harness, Hydra, pandas or matplotlib, and its production modules
never import ``accelpact.testing`` (the fault injector lives there: ``from accelpact.testing import
FaultInjector``). Backend-specific recovery (gloo, NCCL) lives in ``accelpact.backends``.
"""

from accelpact.control import ControlChannel, ControlConfig, new_job_token, start_control_server
from accelpact.errors import (
    AccelPactError,
    CommFault,
    ControlChannelError,
    RankLostError,
    RolledBack,
    StateDivergedError,
    UnrecoverableError,
    is_comm_fault,
)
from accelpact.events import RecoveryEvent
from accelpact.guard import Guard, GuardConfig, attach, clip_gradients
from accelpact.heal import HealPolicy
from accelpact.process_group import init_process_group
from accelpact.rejoin import RejoinTicket, rejoin
from accelpact.reset import ResetConfig

__all__ = [
    "AccelPactError",
    "CommFault",
    "ControlChannel",
    "ControlChannelError",
    "ControlConfig",
    "Guard",
    "GuardConfig",
    "HealPolicy",
    "RankLostError",
    "RecoveryEvent",
    "RejoinTicket",
    "ResetConfig",
    "RolledBack",
    "StateDivergedError",
    "UnrecoverableError",
    "attach",
    "clip_gradients",
    "init_process_group",
    "is_comm_fault",
    "new_job_token",
    "rejoin",
    "start_control_server",
]
