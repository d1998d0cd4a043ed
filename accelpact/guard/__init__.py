"""The guard: the step boundary and the commit protocol (core.py), with its settings and attach checks.

- attaching.py: :func:`attach`; core.py: :class:`Guard` (steps, guarded regions, the shared catch);
- wiring.py: the guard's collaborators, built in one place; vote.py: the commit vote;
- decisions.py: what a recovery round's decision means for this rank;
- config.py: :class:`GuardConfig`; attach_checks.py: what attach refuses, with the fix;
- clipping.py: the gradient clipping inside the guarded step;
- launcher_notes.py: what the guard writes on the control store for accelpact.run.
"""

from accelpact.detection.watchdog import DEFAULT_STALL_TIMEOUT_S
from accelpact.guard.attaching import attach
from accelpact.guard.clipping import clip_gradients
from accelpact.guard.config import GuardConfig, InjectionClock
from accelpact.guard.core import Guard

__all__ = ["Guard", "GuardConfig", "InjectionClock", "attach", "clip_gradients", "DEFAULT_STALL_TIMEOUT_S"]
