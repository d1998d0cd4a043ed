"""The seeded fault trace (harness.fleet.trace): same seed, same trace; the fault-kind shares and the rate it
claims hold over many draws; every kind is one the harness can inject; named mixes keep the published MTTFs.

The statistical checks draw from fixed seeds, so they cannot flake; their tolerance (5 standard errors) is
what a correct generator meets with room, and a wrong share or rate of a few percent misses."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from harness.faults.registry import kinds as registered_kinds
from harness.fleet.config import ScaleConfigError
from harness.fleet.mixes import mttf_h, named_mix, unexpected_classes
from harness.fleet.sources import LLAMA3_TABLE5
from harness.fleet.trace import CAUSE_KINDS, class_kind_shares, draw_trace

DRAWS = 3000


def test_same_seed_same_trace_and_another_seed_another():
    a, b = draw_trace(seed=7), draw_trace(seed=7)
    assert a.events == b.events and len(a.events) > 0
    assert draw_trace(seed=8).events != a.events


def test_every_kind_is_an_injectable_harness_fault():
    kinds = {k for m in CAUSE_KINDS.values() for k in m}
    assert kinds <= set(registered_kinds()), kinds - set(registered_kinds())
    # the tiers all appear in the mapping
    assert {"socket_reset", "link_down", "blackhole", "hang", "kill", "host_loss", "control_store_loss"} <= kinds
    assert set(CAUSE_KINDS) == set(LLAMA3_TABLE5)
    assert all(math.isclose(sum(m.values()), 1.0) for m in CAUSE_KINDS.values())


def test_table5_counts_and_the_class_split_are_the_simulators():
    assert sum(LLAMA3_TABLE5.values()) == 419  # the paper's unexpected interruptions
    mix = named_mix("llama3")
    shares = class_kind_shares(mix)
    total = sum(mix[c].rate_per_hour for c in unexpected_classes(mix))
    for cls in unexpected_classes(mix):
        got = sum(v for (c, _, _), v in shares.items() if c == cls)
        assert got == pytest.approx(mix[cls].rate_per_hour / total, rel=1e-9), cls
    # a faulty GPU is 148 of 419 unexpected interruptions, HBM3 72: both lose the host
    assert shares[("gpu_host_loss", "Faulty GPU", "host_loss")] == pytest.approx(148 / 419)
    assert shares[("gpu_host_loss", "GPU HBM3 Memory", "host_loss")] == pytest.approx(72 / 419)


@pytest.mark.parametrize("mix", ["llama3", "rsc_16k"])
def test_rate_and_kind_shares_hold_over_many_draws(mix):
    steps, faults = 300, 10.0
    traces = [draw_trace(mix, steps=steps, faults=faults, seed=s) for s in range(DRAWS)]
    p = traces[0].p_per_step
    span = steps - 1
    assert p * span == pytest.approx(faults)
    counts = np.array([len(t.events) for t in traces])
    se = math.sqrt(span * p * (1 - p) / DRAWS)
    assert abs(counts.mean() - faults) < 5 * se, (counts.mean(), se)
    assert all(1 <= e.step < steps for t in traces for e in t.events)
    assert all(len({e.step for e in t.events}) == len(t.events) for t in traces)  # at most one a step
    by_kind = Counter(e.kind for t in traces for e in t.events)
    n = sum(by_kind.values())
    want: dict[str, float] = {}
    for (_, _, kind), share in traces[0].shares.items():
        want[kind] = want.get(kind, 0.0) + share
    for kind, share in want.items():
        se_k = math.sqrt(share * (1 - share) / n)
        assert abs(by_kind[kind] / n - share) < 5 * se_k + 1e-12, (kind, by_kind[kind] / n, share)
    by_class = Counter(e.cls for t in traces for e in t.events)
    want_cls: dict[str, float] = {}
    for (cls, _, _), share in traces[0].shares.items():
        want_cls[cls] = want_cls.get(cls, 0.0) + share
    for cls, share in want_cls.items():
        assert abs(by_class[cls] / n - share) < 5 * math.sqrt(share * (1 - share) / n) + 1e-12, cls
    ranks = Counter(e.rank for t in traces for e in t.events)
    assert abs(ranks[0] / n - 0.5) < 5 * math.sqrt(0.25 / n)


def test_scale_is_the_cluster_mttf_compressed():
    t = draw_trace("llama3", steps=300, faults=10, seed=0)
    assert t.mttf_h == pytest.approx(54 * 24 / 419, rel=1e-9)  # Table 5: 419 unexpected in 54 days
    # one fault expected every 1/p steps = one MTTF of the cluster
    assert t.hours_per_step / t.p_per_step == pytest.approx(t.mttf_h)
    assert t.rate_scale(0.25) == pytest.approx(t.hours_per_step * 3600 / 0.25)
    assert "MTTF 3.09 h" in t.scale_text() and "x" in t.scale_text(0.25)
    rows = t.mapping_rows()
    assert sum(r[3] for r in rows) == pytest.approx(1.0) and sum(r[4] for r in rows) == len(t.events)
    md = t.table_md(0.25)
    assert "Table 5" in md and "x1," in md and md.count("\n| gpu_host_loss | Faulty GPU | `host_loss` | 35.3% |") == 1


@pytest.mark.parametrize("name, gpus, hours", [("rsc_1k", 1024, 7.9), ("rsc_16k", 16384, 1.8)])
def test_rsc_mixes_keep_the_published_mttf(name, gpus, hours):
    mix = named_mix(name)
    assert mttf_h(mix, gpus, unexpected_classes(mix)) == pytest.approx(hours)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"mix": "llama4"}, "mix 'llama4' is unknown: use one of llama3"),
        ({"faults": 400}, "faults=400"),
        ({"faults": 0}, "faults=0"),
        ({"first_step": 300}, "first_step"),
    ],
)
def test_bad_input_names_the_fix(kwargs, match):
    with pytest.raises(ScaleConfigError, match=match):
        draw_trace(**kwargs)
