"""The soak's pure logic: the fitted growth slope and its interval, the time budget, and reading
back a soak that was killed part-way (only its progress lines exist)."""

from __future__ import annotations

import json
import random
from pathlib import Path

from experiments.bit_identity_soak import fit_slope, growth, soak_lines
from experiments.bit_identity_soak_run import load_progress, soak_timeout_s
from experiments.workloads.fault_schedules import hang_every, soak_faults


def test_slope_and_interval_cover_the_true_slope_and_exclude_zero_when_it_grows():
    rng = random.Random(0)
    xs = [i / 2 for i in range(400)]
    level = 0.0
    ys = []
    for x in xs:  # a random walk around a 0.1/fault trend: autocorrelated like RSS
        level += rng.gauss(0, 0.3)
        ys.append(0.1 * x + level * 0.2)
    slope, low, high = fit_slope(xs, ys)
    assert low < 0.1 < high and low > 0
    flat = fit_slope(xs, [rng.gauss(5, 0.1) for _ in xs])
    assert flat[1] < 0 < flat[2]
    assert all(v != v for v in fit_slope([1, 1, 1], [1, 2, 3]))  # NaNs without 3 distinct x


def test_budget_grows_with_faults_and_hangs_are_bounded():
    assert soak_timeout_s(1000) > 2 * soak_timeout_s(300) > 0
    assert len([f for f in soak_faults(2, 1000) if f.get("action") == "stall"]) == 1000 // hang_every(1000) == 10
    assert len([f for f in soak_faults(2, 100) if f.get("action") == "stall"]) == 4


def test_a_killed_soak_is_read_back_from_its_progress_lines(tmp_path: Path):
    faults = soak_faults(2, 100)
    (tmp_path / "schedule.json").write_text(json.dumps({"world": 2, "faults": faults, "steps": 201, "layers": 2}))
    for rank in range(2):
        with open(tmp_path / f"progress.faults.rank{rank}.jsonl", "w") as f:
            for step in range(130):  # killed during step 130: faults at steps 1, 3, ..., 129 reached
                rec = sum(1 for x in faults if x["step"] <= step)
                ev = (
                    [
                        {
                            "step": step,
                            "decision": {"action": "retry", "apply_on": []},
                            "rounds": 1,
                            "detection_s": 0.01,
                            "total_s": 0.02,
                        }
                    ]
                    if any(x["step"] == step for x in faults)
                    else []
                )
                f.write(
                    json.dumps(
                        {
                            "step": step,
                            "recoveries": rec,
                            "threads": 7,
                            "fds": 16,
                            "tcp": 1,
                            "rss_mib": 400 + 0.01 * rec,
                            "loss": 1.0,
                            "events": ev,
                        }
                    )
                    + "\n"
                )
    soak = load_progress(tmp_path)
    assert len(soak["rows"]) == 65 and all(r["decision"] == "retry" for r in soak["rows"])
    g = growth(soak)
    assert abs(g["rss_mib"]["slope"] - 0.01) < 1e-6 and g["threads"]["slope"] == 0
    soak["diffs"] = ["the soak did not finish"]
    text = "\n".join(soak_lines(soak))
    assert "65 of 100 faults" in text and "rss_mib | +0.0100 MiB" in text


def test_short_only_keeps_the_soak_section_of_the_old_table(tmp_path: Path):
    from experiments.bit_identity_report import keep_soak_section

    old = tmp_path / "table.md"
    old.write_text(
        "# T\n\n## fsdp2 old rows\n\n## Soak: 1000 faults\nslopes\n### Provenance of the soak section\n- x\n\n"
        "## How to read it\nold guide\n### Provenance\n- old sha\n"
    )
    new = "# T\n\n## fsdp2 new rows\n\n## How to read it\nnew guide\n### Provenance\n- new sha\n"
    out = keep_soak_section(new, old)
    assert "new rows" in out and "old rows" not in out and "new sha" in out and "old sha" not in out
    assert out.index("new rows") < out.index("## Soak: 1000 faults") < out.index("## How to read it")
    assert "### Provenance of the soak section\n- x" in out
    old.write_text("# T\n\n## fsdp2 old rows\n\n## How to read it\nold\n")  # no soak: nothing to keep
    assert keep_soak_section(new, old) == new


def test_fds_by_kind_from_progress_lines_and_the_constant_check():
    from experiments.bit_identity_fds import constant_after_first_recovery, kinds_from_progress

    base = {"tcp store": 5, "tcp peer": 1}
    after = {"tcp store": 6, "tcp peer": 3}
    lines = [
        {"step": 0, "recoveries": 0, "fd_kinds": base},
        {"step": 1, "recoveries": 1, "fd_kinds": after},
        {"step": 2, "recoveries": 1},
        {"settled": {"fds": 18}, "fd_kinds": dict(after)},
    ]
    kinds = kinds_from_progress(lines)
    assert kinds == {"baseline": base, "first_recovery": after, "settled": after}
    assert constant_after_first_recovery({"fd_kinds": [kinds, kinds]})
    grown = dict(kinds, settled={"tcp store": 7, "tcp peer": 3})  # one more store connection since
    assert not constant_after_first_recovery({"fd_kinds": [kinds, grown]})
    assert not constant_after_first_recovery({"fd_kinds": [kinds_from_progress([{"step": 0, "recoveries": 0}])]})
    assert not constant_after_first_recovery({})
