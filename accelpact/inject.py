"""Real fault injection, public: socket resets, stalls and dead ranks, for tests, the harness and users' own
fault drills.

Usable with or without a guard. A plain training loop calls ``injector.begin_step(step)`` at the top
of every step and ``injector.maybe_fire(phase, step)`` before its clip all-reduce / vote; a guarded
loop gets both for free through ``guard.phase_hooks.append(injector.on_phase)``. The forward and
backward phases are caught by module hooks that run immediately before the intended collective.

Faults are real: a reset shuts down this process's own gloo TCP connections (every peer blocked on
them fails in milliseconds), a stall sleeps inside the step (a hang), an exit kills the process
without cleanup (a dead rank). Each injector records the wall time of its injections; pass
``injection_clock=injector.consume_injection_time`` to ``accelpact.attach`` so the guard measures
detection time from the moment of the fault, not from the start of the step.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

# The socket helpers are production code (the gloo backend resets its own connections with them);
# they are re-exported here because injecting a reset is what tests and the harness use them for.
from accelpact.backends.generations import store_ports
from accelpact.common.sockets import reset_own_gloo_sockets, shutdown_sockets, tcp_socket_inodes

if TYPE_CHECKING:
    import torch.nn as nn

    from accelpact.common.control_client import ControlClient

__all__ = [
    "PHASES",
    "ACTIONS",
    "FaultSpec",
    "FaultInjector",
    "reset_own_gloo_sockets",
    "shutdown_sockets",
    "tcp_socket_inodes",
    "store_ports",
    "post_arrival",
]

# Phases a fault can be armed at, in the order they happen within one step.
PHASES: tuple[str, ...] = (
    "forward_allgather_first",
    "forward_allgather_middle",
    "backward_reduce_scatter",
    "clip_allreduce",
    "vote",
    "post_vote",  # the vote completed on this rank, optimizer.step not yet applied
    "recovery",  # only with a guard: after the new generation is built, before its first collective
    "eval",  # the caller's own evaluation, between steps (fired explicitly)
    "checkpoint_save",  # the caller's own checkpoint save, between steps (fired explicitly)
)
# reset: shut down own gloo connections (the next collective fails on every rank);
# reset_raise: the same, and fail right here with a CommFault, as a collective that failed on this
#   rank after its data got through would (the only way to make the vote complete on some ranks only);
# stall: sleep stall_s seconds (a hang); exit: os._exit (a dead rank).
ACTIONS: tuple[str, ...] = ("reset", "reset_raise", "stall", "exit")

# --- the injector ------------------------------------------------------------------------------------


@dataclass
class FaultSpec:
    """One armed, one-shot fault."""

    step: int
    phase: str
    action: str = "reset"
    stall_s: float = 0.0
    fired_at: float | None = None

    def __post_init__(self) -> None:
        if self.phase not in PHASES:
            raise ValueError(f"unknown fault phase {self.phase!r}; choose one of {PHASES}")
        if self.action not in ACTIONS:
            raise ValueError(f"unknown fault action {self.action!r}; choose one of {ACTIONS}")
        if self.action == "stall" and self.stall_s <= 0:
            raise ValueError("a 'stall' fault needs stall_s > 0 (seconds to hang)")


@dataclass
class FaultInjector:
    """Arms one-shot faults at (step, phase) and fires them from module hooks or explicit calls.

    ``exclude_ports`` are the store ports a reset must leave alone. ``on_fire`` (optional) is called
    with the spec just before the fault acts, e.g. to write a ``fault`` event.
    """

    exclude_ports: Collection[int] = ()
    on_fire: Callable[[FaultSpec], None] | None = None
    armed: list[FaultSpec] = field(default_factory=list)
    fired: list[FaultSpec] = field(default_factory=list)
    step: int = -1
    _handles: list[Any] = field(default_factory=list, repr=False)
    _last_injection: float | None = field(default=None, repr=False)
    _firing: FaultSpec | None = field(default=None, repr=False)  # the spec whose on_fire is running
    _cancel_firing: bool = field(default=False, repr=False)

    def consume_injection_time(self, not_before: float) -> float | None:
        """Return and forget this injector's newest injection time if it is at or after ``not_before``.

        The guard's ``injection_clock``: it calls this once per detected fault with the start time
        of the failed attempt, so an injection from an earlier attempt is never counted twice.
        """
        t, self._last_injection = self._last_injection, None
        return t if t is not None and t >= not_before else None

    def arm(self, step: int, phase: str, action: str = "reset", *, stall_s: float = 0.0) -> FaultSpec:
        spec = FaultSpec(step, phase, action, stall_s)
        self.armed.append(spec)
        return spec

    def disarm(self, spec: FaultSpec) -> None:
        """Cancel ``spec``: an armed one never fires, and the one firing now (from ``on_fire``) does not
        act. A spec that already fired or was never armed is left alone."""
        if spec is self._firing:
            self._cancel_firing = True
        self.armed[:] = [s for s in self.armed if s is not spec]

    def rearm(self, spec: FaultSpec, action: str, *, stall_s: float = 0.0) -> None:
        """Change what ``spec`` does when it fires: an armed one, or the one firing now (from ``on_fire``,
        e.g. the rank's own part after a parent has acted)."""
        if spec is not self._firing and not any(s is spec for s in self.armed):
            raise ValueError(f"rearm: the fault at step {spec.step}, phase {spec.phase} is not armed; arm() it")
        FaultSpec(spec.step, spec.phase, action, stall_s)  # the same checks as arm()
        spec.action, spec.stall_s = action, stall_s

    def begin_step(self, step: int) -> None:
        """Tell the injector which step is running (the module hooks need it)."""
        self.step = step

    def on_phase(self, phase: str, step: int) -> None:
        """A guard phase hook: ``guard.phase_hooks.append(injector.on_phase)``."""
        if phase == "step_start":
            self.begin_step(step)
        else:
            self.maybe_fire(phase, step)

    def maybe_fire(self, phase: str, step: int | None = None) -> bool:
        """Fire the fault armed at (step, phase), if any; True when one fired."""
        step = self.step if step is None else step
        for spec in self.armed:
            if spec.step == step and spec.phase == phase:
                self.armed.remove(spec)
                self._fire(spec)
                return True
        return False

    def _fire(self, spec: FaultSpec) -> None:
        spec.fired_at = time.time()
        self._last_injection = spec.fired_at
        self.fired.append(spec)
        if self.on_fire is not None:
            self._firing, self._cancel_firing = spec, False
            try:
                self.on_fire(spec)
            finally:
                self._firing = None
            if self._cancel_firing:  # on_fire disarmed it (e.g. it already fired in an earlier process)
                return
        if spec.action in ("reset", "reset_raise"):
            reset_own_gloo_sockets(self.exclude_ports)
            if spec.action == "reset_raise":
                from accelpact.errors import CommFault

                raise CommFault(f"injected connection reset at step {spec.step}, phase {spec.phase}", phase=spec.phase)
        elif spec.action == "stall":
            time.sleep(spec.stall_s)
        elif spec.action == "exit":
            os._exit(17)  # no cleanup, like a crash: peers see their connections drop

    # -- module hooks for the forward / backward phases --

    def install(self, first_module: nn.Module, middle_module: nn.Module) -> None:
        """Install hooks on the root FSDP module (``first_module``) and a middle decoder block.

        - forward_allgather_first: a forward pre-hook prepended before the root's FSDP pre-forward,
          so it runs right before the first all-gather of the step.
        - forward_allgather_middle: the same on the middle block, right before its all-gather.
        - backward_reduce_scatter: a gradient hook on the middle block's input *as FSDP passes it on*
          (after FSDP's pre-forward wrapped it), which fires after the block's backward compute and
          right before FSDP's post-backward reduce-scatter of that block.
        """
        self._handles.append(
            first_module.register_forward_pre_hook(self._make_pre("forward_allgather_first"), prepend=True)
        )
        self._handles.append(
            middle_module.register_forward_pre_hook(self._make_pre("forward_allgather_middle"), prepend=True)
        )
        self._handles.append(middle_module.register_forward_pre_hook(self._grad_hook_installer, with_kwargs=True))

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _make_pre(self, phase: str) -> Callable[..., None]:
        def hook(module: Any, args: Any) -> None:
            self.maybe_fire(phase)

        return hook

    def _grad_hook_installer(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        import torch

        if not torch.is_grad_enabled():
            return None
        if not any(s.step == self.step and s.phase == "backward_reduce_scatter" for s in self.armed):
            return None  # only pay for the hook on the step it can fire
        for t in list(args) + list(kwargs.values()):
            if isinstance(t, torch.Tensor) and t.requires_grad:
                t.register_hook(self._grad_hook)  # type: ignore[no-untyped-call]
                return None
        return None

    def _grad_hook(self, grad: Any) -> None:
        self.maybe_fire("backward_reduce_scatter")
        return None


def post_arrival(control: ControlClient, t_launch: float | None = None) -> None:
    """Post this replacement's arrival exactly as :func:`accelpact.rejoin` does, and nothing more.

    For a drill in which a replacement dies after the survivors saw it arrive and before it took the
    heal plan: the survivors must name that death, not wait out their deadline. ``control`` is the
    replacement's :class:`accelpact.ControlChannel`; ``t_launch`` is when its launcher started it.
    """
    import json

    from accelpact.recovery.heal_wait import arrived_key

    control.heartbeat()
    control.set(
        arrived_key(control, control.rank),
        json.dumps({"pid": os.getpid(), "t": time.time(), "t_launch": t_launch}).encode(),
    )
