"""Which launches of a run fork from the preloaded template: the first may, a timed relaunch never does."""

from __future__ import annotations

import pytest

from harness.parent.launch_start import SPAWN, TEMPLATE, launch_method
from harness.schema import RankLaunch, ReplacementStart

LOCAL, SRUN = RankLaunch.local, RankLaunch.srun


def test_the_first_launch_forks_from_the_template_by_default():
    assert launch_method(0, ReplacementStart.template, LOCAL, namespaced=False) == (TEMPLATE, "")


@pytest.mark.parametrize("incarnation", [1, 2, 7])
@pytest.mark.parametrize("first_launch", list(ReplacementStart))
@pytest.mark.parametrize("launch", [LOCAL, SRUN])
@pytest.mark.parametrize("namespaced", [False, True])
def test_a_relaunch_the_verdict_times_is_never_forked(incarnation, first_launch, launch, namespaced):
    how, why = launch_method(incarnation, first_launch, launch, namespaced)
    assert how == SPAWN and "relaunch" in why


@pytest.mark.parametrize(
    "args, reason",
    [
        ((ReplacementStart.spawn, LOCAL, False), "cluster.first_launch=spawn"),
        ((ReplacementStart.template, SRUN, False), "srun"),
        ((ReplacementStart.template, LOCAL, True), "namespaces"),
    ],
)
def test_a_first_launch_spawns_where_forking_cannot_or_must_not_serve(args, reason):
    how, why = launch_method(0, *args)
    assert how == SPAWN and reason in why
