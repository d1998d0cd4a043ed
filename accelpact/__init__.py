"""accelpact: in-memory recovery of FSDP training from network faults.

Attach a guard to an existing model, FSDP wrapping and optimizer; it owns the step boundary, and on a
communication fault it agrees with the other ranks over an out-of-band store, builds a fresh data-plane
communicator, rebinds every cached reference in place and continues. See README.md for usage.

Its parts (docs/design.md has the module map): ``guard/`` (the step and the commit protocol),
``recovery/`` (rounds, commit rule, heal), ``detection/``, ``control/`` (the out-of-band channel),
``dataplane/`` (process-group generations and rebinding), ``backends/``, ``snapshot/``, ``run/`` (the
launcher), ``inject`` (real fault injection: ``from accelpact.inject import FaultInjector``) and
``testing/`` (the multi-rank test session and bit-identity checks).

This package never imports the harness, Hydra, pandas or matplotlib, and its production modules
never import ``accelpact.testing``. Backend-specific recovery (gloo, NCCL) lives in ``accelpact.backends``.
"""

import sys

from accelpact.backends import generations as _generations
from accelpact.backends import is_comm_fault
from accelpact.control import ControlChannel, ControlConfig, new_job_token, start_control_server
from accelpact.control import notice_auth as _notice_auth
from accelpact.dataplane.process_group import init_process_group
from accelpact.dataplane.reset import ResetConfig
from accelpact.detection import liveness as _liveness
from accelpact.errors import (
    AccelPactError,
    CommFault,
    ControlChannelError,
    RankLostError,
    RolledBack,
    StateDivergedError,
    UnrecoverableError,
)
from accelpact.events import RecoveryEvent
from accelpact.guard import Guard, GuardConfig, attach, clip_gradients
from accelpact.recovery import heal as _heal
from accelpact.recovery import heal_wait as _heal_wait
from accelpact.recovery import rejoin as _rejoin
from accelpact.recovery.heal import HealPolicy
from accelpact.recovery.rejoin import RejoinTicket, rejoin

# The module paths launchers and scripts imported before the runtime had subpackages, e.g.
# ``accelpact.liveness.publish_death`` (a launcher's death notice) or ``from accelpact.heal import
# HealPolicy``: each is the same module object under its old name (nothing is copied).
MOVED_MODULES = {
    "accelpact.comm": _generations,
    "accelpact.dataplane.generations": _generations,
    "accelpact.heal": _heal,
    "accelpact.heal_wait": _heal_wait,
    "accelpact.liveness": _liveness,
    "accelpact.notice_auth": _notice_auth,
    "accelpact.rejoin": _rejoin,
}
for _old, _module in MOVED_MODULES.items():
    sys.modules.setdefault(_old, _module)
comm, heal, liveness, notice_auth = _generations, _heal, _liveness, _notice_auth  # ``accelpact.heal.X`` after import
# (``accelpact.rejoin`` stays the function, as before; ``from accelpact.rejoin import ...`` finds the module.)

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
