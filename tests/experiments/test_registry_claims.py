"""Every experiment's claim in the registry holds on its committed results, and the README's figures for
`make reproduce` are the registry's own."""

from __future__ import annotations

import csv
import importlib
import re
import shutil
from pathlib import Path

import pytest

from experiments import claim_checks
from experiments.registry import REGISTRY

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("exp", REGISTRY, ids=lambda e: e.name)
def test_the_claim_holds_on_the_committed_results(exp):
    assert exp.check, f"{exp.name}: its claim names no check (Experiment.check)"
    module, fn = exp.check.split(":")
    problems = getattr(importlib.import_module(module), fn)(ROOT / "results" / exp.name)
    assert problems == [], f"{exp.name}: the committed results do not support {exp.claim!r}: {problems}"


def test_a_check_fails_when_the_numbers_stop_supporting_the_claim(tmp_path):
    """The checks read the tables: break one number in a copy and the claim must fail."""
    peers = tmp_path / "peers"
    shutil.copytree(ROOT / "results" / "peers", peers)
    with (peers / "table.csv").open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    lo = "gain_lo" if "interval_method" in rows[0] else "measured_gain_lo"
    broken = next(r for r in rows if r["strategy"] == "cold_restart" and r["fault"] == "kill")
    broken[lo] = "0.9"  # the interval now reaches below 1: no longer "better"
    with (peers / "table.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    problems = claim_checks.check_peers(peers)
    assert any("cold_restart" in p and "within noise" in p for p in problems), problems

    loss = tmp_path / "process_loss"
    shutil.copytree(ROOT / "results" / "process_loss", loss)
    with (loss / "overhead.csv").open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    on = next(r for r in rows if r["snapshots"] == "on")
    on["step_median_s"] = str(float(on["step_median_s"]) * 1.5)  # one pair's snapshots now cost +50% or more
    with (loss / "overhead.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    assert any("snapshot overhead" in p for p in claim_checks.check_process_loss(loss))

    mixed = tmp_path / "mixed"
    shutil.copytree(ROOT / "results" / "mixed_faults" / "steps60", mixed)
    assert claim_checks.check_mixed_faults(mixed) == []
    with (mixed / "table.csv").open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    next(r for r in rows if r["strategy"] == "torchft")["gain_lo"] = "1.01"  # inside the minimum effect
    next(r for r in rows if r["strategy"] == "accelpact_heal")["bit_identical"] = "False"
    with (mixed / "table.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    problems = claim_checks.check_mixed_faults(mixed)
    assert any(p.startswith("torchft") for p in problems) and any("bit-identical" in p for p in problems)


def test_the_readme_states_the_registrys_time_for_make_reproduce():
    total = round(sum(e.budget_min for e in REGISTRY))
    text = (ROOT / "README.md").read_text()
    start = text.index("`make reproduce` regenerates")
    line = " ".join(text[start : text.index("\n\n", start)].split())
    assert f"add up to {total} min" in line, (total, line)
    assert not re.search(r"half an hour", line)
