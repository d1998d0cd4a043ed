"""The comparison's pure parts: the default sweep, the reference, the relaunch policy, the table over
hand-made timelines, and the multirun callback over a hand-made sweep directory (no processes started)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.app.comparison import ComparisonCallback
from harness.app.config import compose, to_run_config
from harness.app.preflight import job_overrides
from harness.report.compare import PAPER_GAIN, build_table, reference_config
from harness.report.goodput import compute_goodput
from harness.report.table import RunSummary
from harness.strategies import relaunch_reason
from harness.strategies.accelpact import EXIT_FALLBACK


def test_default_experiment_is_a_sweep_over_ages_and_strategies():
    cfg = compose([], with_hydra=True)
    assert str(cfg.hydra.mode) == "RunMode.MULTIRUN"
    run = to_run_config(cfg)
    assert run.name == "compare" and run.model.name == "mistral_tiny" and run.cluster.world_size == 2
    assert run.fault.kind == "socket_reset" and run.fault.schedule.value == "at_age"
    smoke = compose(["experiment=smoke"], with_hydra=True)
    assert str(smoke.hydra.mode) != "RunMode.MULTIRUN" and to_run_config(smoke).fault.kind == "none"


def test_the_sweep_is_every_strategy_at_every_age_ages_outer():
    jobs, multirun = job_overrides([])
    assert multirun
    assert [dict(o.split("=") for o in job) for job in jobs] == [
        {"fault.at_age": age, "strategy": s}
        for age in ("5", "18")
        for s in ("accelpact", "cold_restart", "checkpoint_restore")
    ]
    # The command line narrows the experiment's sweep key by key.
    jobs, _ = job_overrides(["fault.at_age=2", "strategy=accelpact,cold_restart"])
    assert [sorted(job) for job in jobs] == [
        ["fault.at_age=2", "strategy=accelpact"],
        ["fault.at_age=2", "strategy=cold_restart"],
    ]


def test_reference_is_fault_free_with_the_same_cadence_and_data():
    base = to_run_config(compose([]))
    ref = reference_config(base)
    assert ref.strategy.name == "none" and ref.fault.kind == "none"
    # Same cadence and data as the faulted runs: the only difference is the recovery.
    assert ref.checkpoint == base.checkpoint and ref.train == base.train and ref.model == base.model
    assert base.strategy.name == "accelpact" and base.fault.kind == "socket_reset"  # the base is not mutated


def test_default_ages_fit_the_run():
    from harness.faults.schedule import plan_faults

    jobs, _ = job_overrides([])
    for job in jobs:
        cfg = to_run_config(compose(job))
        [fault] = plan_faults(cfg.fault, cfg.train.steps, cfg.checkpoint.interval)
        assert fault.age == cfg.fault.at_age
        assert fault.step < cfg.train.steps - 1  # at least one step after the fault


@pytest.mark.parametrize(
    "strategy,codes,expect",
    [
        ("cold_restart", {0: 1, 1: -15}, "cold restart: rank 0 exited with 1"),
        ("cold_restart", {0: 0, 1: 0}, None),
        ("accelpact", {0: EXIT_FALLBACK, 1: -9}, "fallback to checkpoint restore"),
        ("accelpact", {0: 1, 1: 1}, None),  # a plain crash is not a fallback
        ("none", {0: 1, 1: 1}, None),
        ("checkpoint_restore", {0: 1, 1: 1}, None),  # NVRx restarts in process; the parent never relaunches
    ],
)
def test_relaunch_policy(strategy, codes, expect):
    got = relaunch_reason(strategy, codes, restarts=0, max_restarts=3, interrupted=False, first_failure=0)
    assert (got is None) if expect is None else (got is not None and got.startswith(expect)), got


def test_relaunch_policy_stops_at_the_limit_and_on_ctrl_c():
    assert relaunch_reason("cold_restart", {0: 1}, restarts=3, max_restarts=3, interrupted=False) is None
    assert relaunch_reason("cold_restart", {0: 1}, restarts=0, max_restarts=3, interrupted=True) is None


def _steps(rank: int, spans, tokens: int = 100, incarnation: int = 0, first: int = 0):
    return [
        {
            "kind": "step",
            "t": b,
            "rank": rank,
            "step": first + i,
            "t_start": a,
            "t_end": b,
            "tokens": tokens,
            "incarnation": incarnation,
        }
        for i, (a, b) in enumerate(spans)
    ]


def test_table_over_hand_computed_timelines():
    # Reference: 10 steps of 1 s on one rank -> 1000 tokens in 10 s = 100 tokens/s.
    ref = _steps(0, [(i, i + 1) for i in range(10)])
    # AccelPact: the same, with a 0.5 s in-memory recovery inside step 5 -> 1000 tokens in 10.5 s.
    ours = _steps(0, [(i, i + 1) for i in range(5)] + [(5, 6.5)] + [(i + 0.5, i + 1.5) for i in range(6, 10)])
    ours.append(
        {"kind": "fault", "t": 5.2, "rank": 0, "fault": "socket_reset", "step": 5, "phase": "vote", "ranks": [0]}
    )
    ours.append(
        {
            "kind": "recovery",
            "t": 5.7,
            "rank": 0,
            "decision": "retry",
            "detection_s": 0.1,
            "agreement_s": 0.2,
            "rebuild_s": 0.1,
            "rebind_s": 0.1,
        }
    )
    # Cold restart: steps 0..4, fault at 5.2, relaunch ready at 9, replay steps 4 (ckpt after 3) .. 9.
    cold = _steps(0, [(i, i + 1) for i in range(5)])
    cold += _steps(0, [(9 + i, 10 + i) for i in range(6)], incarnation=1, first=4)
    cold.append(
        {"kind": "fault", "t": 5.2, "rank": 0, "fault": "socket_reset", "step": 5, "phase": "vote", "ranks": [0]}
    )
    cold.append({"kind": "restart", "t": 9, "rank": 0, "t_launch": 6.0, "t_ready": 9.0, "incarnation": 1})
    summaries = [
        RunSummary("none", compute_goodput(ref), bit_identical=True),
        RunSummary("accelpact", compute_goodput(ours), age=1, fault="socket_reset", bit_identical=True),
        RunSummary("cold_restart", compute_goodput(cold), age=1, fault="socket_reset", bit_identical=False),
    ]
    table = build_table(summaries, [{"status": "ok"}] * 3)
    by = {r["strategy"]: r for r in table}
    assert by["none (reference)"]["goodput"] == pytest.approx(100.0)
    assert by["accelpact"]["goodput"] == pytest.approx(1000 / 10.5)
    assert by["cold_restart"]["goodput"] == pytest.approx(1000 / 15.0)
    assert by["accelpact"]["ratio_to_reference"] == pytest.approx(10 / 10.5)
    assert by["cold_restart"]["accelpact_gain"] == pytest.approx(15.0 / 10.5)
    assert by["accelpact"]["recovery_s"] == pytest.approx(0.5)
    assert by["cold_restart"]["replayed_steps"] == 1  # step 4 ran twice
    assert by["cold_restart"]["bit_identical"] is False and by["accelpact"]["bit_identical"] is True
    assert by["cold_restart"]["fallback"] == "no"
    assert by["cold_restart"]["paper_gain"] is None  # the paper has no age-1 figure
    assert PAPER_GAIN[("cold_restart", 18)] == 1.698


def _fake_run(d: Path, strategy: str, fault: str, age, steps_spans, bit_identical=None, extra_events=()):
    (d / "events").mkdir(parents=True)
    events = _steps(0, steps_spans) + list(extra_events)
    (d / "events" / "rank0.jsonl").write_text("\n".join(json.dumps(e) for e in events) + "\n")
    row = {"strategy": strategy, "fault": fault, "age": age, "status": "ok", "bit_identical": bit_identical}
    (d / "summary.json").write_text(json.dumps({"row": row}))


def test_multirun_callback_writes_the_table_over_the_sweep(tmp_path: Path, capsys):
    from omegaconf import OmegaConf

    _fake_run(tmp_path / "0", "none", "none", None, [(i, i + 1) for i in range(4)])
    fault = {"kind": "fault", "t": 2.1, "rank": 0, "fault": "socket_reset", "step": 2, "ranks": [0]}
    _fake_run(tmp_path / "1", "accelpact", "socket_reset", 2, [(i, i + 1) for i in range(4)], True, [fault])
    _fake_run(tmp_path / "2", "cold_restart", "socket_reset", 2, [(i, 2 * i + 1) for i in range(4)], True, [fault])
    cfg = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}})
    ComparisonCallback().on_multirun_end(cfg)
    table = (tmp_path / "table.md").read_text()
    assert "none (reference)" in table and "accelpact" in table and "cold_restart" in table
    import pandas as pd

    frame = pd.read_csv(tmp_path / "table.csv").set_index("strategy")
    # one trial: measured gain 7/4 (walls 4 s and 7 s); no interval, so no verdict either way
    assert frame.loc["cold_restart", "gain"] == pytest.approx(7.0 / 4.0)
    assert frame.loc["cold_restart", "trials"] == 1 and frame.loc["cold_restart", "verdict"] == "1 trial: no interval"
    runs = pd.read_csv(tmp_path / "runs.csv")
    assert set(runs["trial"]) == {0}
    assert (tmp_path / "goodput_vs_age.png").stat().st_size > 1000
    assert (tmp_path / "badput_by_part.png").stat().st_size > 1000
    assert f"sweep {tmp_path}" in capsys.readouterr().out


def test_multirun_callback_over_trials_gives_intervals_and_verdicts(tmp_path: Path):
    """Three trials, each with its own reference (1 s steps). The cold restart's measured badput is 3 s
    more than AccelPact's in every trial, while its productive steps run at a different speed each trial
    (1 s, 1.5 s, 0.8 s: load). The badput-based gain is the same 7/4 in every trial; the measured one moves."""
    import pandas as pd
    from omegaconf import OmegaConf

    fault = {"kind": "fault", "t": 2.05, "rank": 0, "fault": "socket_reset", "step": 2, "ranks": [0]}
    for k, pace in enumerate((1.0, 1.5, 0.8)):
        d = tmp_path / f"trial{k}"
        _fake_run(d / "reference", "none", "none", None, [(i, i + 1) for i in range(4)])
        _fake_run(d / "accelpact_age2", "accelpact", "socket_reset", 2, [(i, i + 1) for i in range(4)], True, [fault])
        # steps 0, 1 at `pace`; the fault destroys the step in flight; step 2 starts 3 s after step 1 ended
        spans = [(0, pace), (pace, 2 * pace), (2 * pace + 3, 3 * pace + 3), (3 * pace + 3, 4 * pace + 3)]
        _fake_run(d / "cold_restart_age2", "cold_restart", "socket_reset", 2, spans, True, [fault])
    ComparisonCallback().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}}))
    frame = pd.read_csv(tmp_path / "table.csv").set_index("strategy")
    cold = frame.loc["cold_restart"]
    # the verdict's measured whole-run gain: walls 7, 9, 6.2 s over 4 s; 3 trials' range covers 75%
    assert cold["trials"] == 3 and cold["gain"] == pytest.approx(7 / 4)
    assert (cold["gain_lo"], cold["gain_hi"]) == pytest.approx((6.2 / 4, 9 / 4)) and cold[
        "verdict"
    ] == "AccelPact better"
    assert cold["gain_coverage"] == pytest.approx(0.75)
    # badput-based (diagnostic): 4 useful steps at the reference's 1 s + 3 s badput = 7 s vs 4 s, every trial
    assert cold["gain_bp"] == pytest.approx(7 / 4) and cold["gain_bp_lo"] == pytest.approx(7 / 4)
    assert "(n=3)" in cold["gain_ci"]
    runs = pd.read_csv(tmp_path / "runs.csv")
    assert sorted(set(runs["trial"])) == [0, 1, 2] and len(runs) == 9
    footer = (tmp_path / "table.md").read_text()
    assert "trials per cell: 3 " in footer and "order_statistic" in footer and "coverage 75.0% at n=3" in footer
    assert "minimum effect of 2%" in footer


def test_multirun_callback_ignores_sweeps_without_faults(tmp_path: Path):
    from omegaconf import OmegaConf

    _fake_run(tmp_path / "0", "none", "none", None, [(0, 1)])
    ComparisonCallback().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}}))
    assert not (tmp_path / "table.md").exists()
