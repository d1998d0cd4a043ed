"""The protection advisor (harness.advise): the cadence a fault rate calls for, the replay bound at every cadence
it may advise, the cost model's parts, and the command line (default advice, bad input in one line)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from accelpact.snapshot.push_rule import is_pushed, pushed_steps, replay_bound
from harness.advise import cli
from harness.advise.cadence import CANDIDATES, choose, expected_replay_steps, heal_outcomes
from harness.advise.cost import CPU_HERE, GPU_NODE, Cadence, Platform, tax
from harness.fleet.config import Cluster
from harness.fleet.sources import llama3_mix
from harness.scale.outcomes import outcome_table
from harness.scale.project import project

# Synthetic costs: a 1 GB shard, 1 s steps, a push as dear as a copy; nothing hides, as on this host.
SYNTH = Platform("synthetic", copy_gbps=4.0, checksum_gbps=8.0, push_gbps=4.0, push_sides=2)
SHAPE = {"process_crash": 0.2, "gpu_host_loss": 0.8}  # the mix's shape; the rate multiplies it


def _choice(rate_per_s: float, platform: Platform = SYNTH, state: float = 1e9, step: float = 1.0):
    rates = {c: rate_per_s * w for c, w in SHAPE.items()}
    return choose(platform, state, step, rates, fallback_s={"gpu_host_loss": 600.0})


@pytest.mark.parametrize(
    "platform, state, step",
    [(SYNTH, 1e9, 1.0), (CPU_HERE, 22e6, 0.25), (GPU_NODE, 4e9, 5.0), (SYNTH.with_(push_gbps=0.5), 2e9, 0.5)],
)
def test_a_higher_fault_rate_never_advises_a_sparser_cadence(platform, state, step):
    rates = [10 ** (x / 8) for x in range(-64, 1)]  # 1e-8 .. 1 failure per second
    choices = [_choice(r, platform, state, step) for r in rates]
    for lo, hi in zip(choices, choices[1:]):
        assert hi.cadence.every <= lo.cadence.every, (lo, hi)
        assert hi.replay_bound <= lo.replay_bound, (lo, hi)
        assert hi.loss_rate / hi.objective <= 1.0 + 1e-9
    # the rate matters: rare faults buy a sparse cadence, frequent ones a dense one
    assert choices[0].replay_bound >= 64 and choices[-1].replay_bound <= choices[0].replay_bound // 8, (
        choices[0].cadence,
        choices[-1].cadence,
    )


def test_a_dearer_push_never_advises_pushing_more_often():
    ks = [_choice(1e-4, SYNTH.with_(push_gbps=g)).cadence for g in (64.0, 16.0, 4.0, 1.0, 0.25)]
    bounds = [c.every * c.push_every for c in ks]
    assert bounds == sorted(bounds) and bounds[0] < bounds[-1], ks


@pytest.mark.parametrize("cadence", CANDIDATES, ids=lambda c: c.text().replace(" ", "_"))
def test_replay_bound_at_every_cadence_the_advisor_may_pick(cadence):
    """The advisor's replay figures against push_rule: enumerate where a host loss strikes (the survivors'
    newest committed step c over a whole period) and replay what docs/snapshots.md says a heal replays."""
    e, k = cadence.every, cadence.push_every
    K = e * k
    assert cadence.replay_bound == replay_bound(e, k) == K
    push_over_step = 0.3  # a push takes 30% of a step: the loss lands before the replica with that chance
    platform = SYNTH.with_(push_gbps=1.0 / push_over_step / 1.0)  # 1 GB at that speed
    mean, p_fb = expected_replay_steps(cadence, "gpu_host_loss", platform, 1e9, 1.0)
    period = range(10 * K, 11 * K)  # c over one period of pushed steps
    replays = []
    for c in period:
        s = max(pushed_steps(range(c + 1), e, k))
        if c > s:
            replays.append(c - s)  # the replica of s had landed (the vote of s + 1 was entered)
        else:  # c == s: s's replica may be in flight; then the heal goes back to s - K
            replays.append(push_over_step * K + (1 - push_over_step) * 0)
    assert max(c - max(pushed_steps(range(c + 1), e, k)) for c in period) <= K - 1
    assert all(r <= K for r in replays)
    if cadence.confirm:
        assert mean == pytest.approx(sum(replays) / len(replays))
        assert p_fb == 0.0
    else:
        assert 0.0 < p_fb <= 1.0 and mean == pytest.approx((K - 1) / 2)
    crash_mean, crash_fb = expected_replay_steps(cadence, "process_crash", platform, 1e9, 1.0)
    own = [c - max(x for x in range(c + 1) if x % e == 0) for c in period]  # own slot: newest snapshotted step
    assert crash_mean == pytest.approx(sum(own) / len(own)) and max(own) <= e - 1 and crash_fb == 0.0
    assert is_pushed(0, e, k)


def test_heal_outcomes_charge_the_cadence_and_nothing_else():
    c = Cluster()
    base = outcome_table(c, ("accelpact_heal",))["accelpact_heal"]
    cold = outcome_table(c, ("cold_restart",))["cold_restart"]
    dense = heal_outcomes(base, cold, Cadence(1, 1, True), GPU_NODE, 4e9, c.step_s, 3600.0)
    sparse = heal_outcomes(base, cold, Cadence(4, 8, False), GPU_NODE, 4e9, c.step_s, 3600.0)
    assert dense["process_crash"].parts["replay"] == 0.0
    assert sparse["process_crash"].parts["replay"] == pytest.approx(1.5 * c.step_s)
    assert sparse["gpu_host_loss"].parts["replay"] == pytest.approx(15.5 * c.step_s)
    assert sparse["gpu_host_loss"].parts["fallback"] > 0 and "fallback" not in dense["gpu_host_loss"].parts
    for cls in ("transient_network", "hang", "software_bug", "planned_maintenance"):
        assert sparse[cls] == base[cls]


def test_tax_parts_follow_the_model():
    t = tax(SYNTH, 1e9, 1.0, Cadence(1, 1, True))
    assert t.copy_s == pytest.approx(0.25) and t.checksum_s == pytest.approx(0.125)
    assert t.push_s == pytest.approx(0.5)  # both sides of one host
    assert t.fraction == pytest.approx(0.875 + t.wait_s)
    t4 = tax(SYNTH, 1e9, 1.0, Cadence(2, 4, True))
    assert t4.copy_s == pytest.approx(0.125) and t4.push_s == pytest.approx(0.5 / 8)
    # a GPU node: the DMA hides, GEMINI's blocking remains (7.7 ms per 12 GB)
    g = tax(GPU_NODE, 12e9, 5.0, Cadence(1, 1, True))
    assert g.copy_s == 0.0 and g.checksum_s == 0.0 and g.block_s == pytest.approx(7.7e-3)
    # a snapshot longer than the step waits before the next vote
    slow = tax(GPU_NODE, 12e9, 0.1, Cadence(1, 1, True))
    assert slow.wait_s > 1.0


def test_project_charges_the_tax():
    c = Cluster(gpus=4096, days=10)
    mix = llama3_mix()
    [a] = project(c, mix, ("accelpact_heal",), trials=8, seed=3)
    [b] = project(c, mix, ("accelpact_heal",), trials=8, seed=3, tax={"accelpact_heal": 0.10})
    assert b.best_ettr == pytest.approx(a.best_ettr / 1.10, abs=0.01)
    assert b.badput["protection"] == pytest.approx(b.best_ettr * 0.10, rel=0.05)


def test_no_arguments_prints_the_default_advice_in_under_30_s():
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "harness.advise"], capture_output=True, text=True, timeout=120)
    took = time.monotonic() - t0
    assert out.returncode == 0, out.stderr
    assert took < 30, took
    text = out.stdout
    assert "16,384 GPUs" in text and "mix llama3" in text
    for s in ("accelpact_heal", "cold_restart", "checkpoint_restore", "torchft_peer_heal"):
        assert s in text
    assert "snapshot.every=" in text and "snapshot.push_every=" in text and "snapshot.confirm_push=" in text
    assert ("winner: " in text) or ("no clear winner: " in text)


@pytest.mark.parametrize(
    "argv, match",
    [
        (["--mix", "llama4"], "mix 'llama4' is unknown: use one of llama3"),
        (["--rate", "hang=-1"], "--rate hang=-1: a rate cannot be negative"),
        (["--state-gb", "80", "--host-memory-gb", "512"], "more than --host-memory-gb 512: lower --state-gb"),
        (["--rate", "meteor=1"], "that class is unknown"),
        (["--gpus", "100"], "--gpus=100 is not a multiple of --gpus-per-host=8"),
    ],
)
def test_bad_input_is_one_line_naming_the_fix(argv, match, capsys):
    assert cli.main(argv) == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and match in err, err


def test_settings_for_a_trace_run_grow_denser_with_more_faults():
    """A harness run under a seeded trace: each strategy's disk interval in steps, and the heal's cadence, from
    the trace's rate; a trace with more faults never gets sparser settings."""
    from harness.advise.advice import advise_for_trace
    from harness.fleet.trace import draw_trace

    platform = CPU_HERE
    by_faults = {}
    for faults in (2, 5, 10, 20, 40):
        t = draw_trace(steps=300, faults=faults, seed=1)
        by_faults[faults] = {r.strategy: r for r in advise_for_trace(t, 0.25, 32e6, 0.3, platform)}
    seq = list(by_faults.values())
    for lo, hi in zip(seq, seq[1:]):
        for s, r in hi.items():
            if r.checkpoint_every_steps is not None:
                assert r.checkpoint_every_steps <= lo[s].checkpoint_every_steps, s
            if r.cadence is not None:
                assert r.cadence.every * r.cadence.push_every <= lo[s].cadence.every * lo[s].cadence.push_every, s
    rows = by_faults[10]
    assert rows["accelpact_heal"].cadence is not None and rows["cold_restart"].cadence is None
    # a cold restart rolls back on every fault of the trace: its faults are 1 / p steps apart
    assert rows["cold_restart"].mtbf_steps == pytest.approx(1 / draw_trace(steps=300, faults=10).p_per_step)
    assert by_faults[40]["cold_restart"].checkpoint_every_steps < by_faults[2]["cold_restart"].checkpoint_every_steps
