"""How each launch of a run's ranks starts: forked from a preloaded template, or a fresh interpreter.

A run's goodput is measured from its first step to its last, so how its FIRST launch starts is in no
goodput: forking it from a template that already imported torch, FSDP and the model's classes saves the
seconds every fresh rank spends importing (most of a short run's wall time here) without touching what
the comparison measures. A RELAUNCH of every rank after a fault (cold restart, a fallback) is badput the
verdict times, so it always starts a fresh interpreter that imports everything, as users pay.

One template per (strategy, model, environment) serves every run of a process that asks for it (a
comparison sweep runs dozens in one process); it is preloaded once, when the first run needs it, and
ends with the process. A heal's replacement (``accelpact_heal``) forks from the same template, as
accelpact's own launcher forks replacements for users' scripts.
"""

from __future__ import annotations

import atexit
import os
from typing import TYPE_CHECKING, Any

from harness.schema import RankLaunch, ReplacementStart

if TYPE_CHECKING:
    from harness.parent.template import ReplacementTemplate

TEMPLATE = "template"
SPAWN = "spawn"

_shared: dict[tuple[str, ...], ReplacementTemplate] = {}


def launch_method(
    incarnation: int, first_launch: ReplacementStart, launch: RankLaunch, namespaced: bool
) -> tuple[str, str]:
    """(TEMPLATE or SPAWN, why not the template: '' when it is used) for the launch ``incarnation`` of a run.

    Only a run's first launch (incarnation 0) may be forked; a relaunch is timed and always spawns."""
    if incarnation > 0:
        return SPAWN, "a relaunch after a fault is timed: it starts fresh interpreters, as users' jobs do"
    if launch != RankLaunch.local:
        return SPAWN, "srun starts the ranks on the allocation's nodes"
    if namespaced:
        return SPAWN, "ranks in network namespaces start through `ip netns exec`"
    if first_launch != ReplacementStart.template:
        return SPAWN, "cluster.first_launch=spawn"
    return TEMPLATE, ""


def _key(launcher: Any) -> tuple[str, ...]:
    run = launcher.run
    env = os.environ
    return (
        launcher.python,
        os.getcwd(),
        run.strategy.name,
        repr(run.model),
        env.get("HARNESS_PLUGINS", ""),
        env.get("PYTHONPATH", ""),
        env.get("TORCH_CPP_LOG_LEVEL", ""),
    )


def shared_template(launcher: Any) -> ReplacementTemplate:
    """The process's template for ``launcher``'s run (started, and preloaded in the background, on first use)."""
    from harness.parent.template import ReplacementTemplate  # lazy: torch

    key = _key(launcher)
    template = _shared.get(key)
    if template is None or not template.alive():
        if template is not None:
            template.close()
        template = _shared[key] = ReplacementTemplate.start(launcher)
    return template


def is_shared(template: Any | None) -> bool:
    """Whether ``template`` is one of the process's shared templates (a run must not close it)."""
    return template is not None and any(template is t for t in _shared.values())


@atexit.register
def close_all() -> None:
    """End every shared template (their children were stopped with their runs)."""
    while _shared:
        _, template = _shared.popitem()
        template.close()
