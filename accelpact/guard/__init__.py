"""The guard: the step boundary and the commit protocol (core.py), with its settings and attach checks.

- core.py: :class:`Guard` and :func:`attach`;
- config.py: :class:`GuardConfig`; attach_checks.py: what attach refuses, with the fix;
- clipping.py: the gradient clipping inside the guarded step.
"""

from accelpact.detection.watchdog import DEFAULT_STALL_TIMEOUT_S
from accelpact.guard.clipping import clip_gradients
from accelpact.guard.config import GuardConfig, InjectionClock
from accelpact.guard.core import Guard, attach

__all__ = ["Guard", "GuardConfig", "InjectionClock", "attach", "clip_gradients", "DEFAULT_STALL_TIMEOUT_S"]
