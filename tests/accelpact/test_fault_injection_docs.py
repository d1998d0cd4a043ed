"""docs/fault_injection.md documents the fault-injection API as it is: every phase and every action of
accelpact.testing, no more and no fewer, the injector methods it tells users to call exist, and the
README links to it. Failed before this branch: the page did not exist (users read testing.py)."""

from __future__ import annotations

import re
from pathlib import Path

from accelpact.testing import ACTIONS, PHASES, FaultInjector

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "fault_injection.md"


def table_keys(text: str, heading: str) -> list[str]:
    """The backticked first cells of the table under ``heading``."""
    section = text.split(heading, 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([a-z_]+)` \|", section, flags=re.M)


def test_the_page_lists_every_phase_and_action_in_order():
    text = DOC.read_text()
    assert table_keys(text, "## Phases") == list(PHASES)
    assert table_keys(text, "## Actions") == list(ACTIONS)


def test_the_methods_the_page_uses_exist_and_the_readme_links_it():
    text = DOC.read_text()
    used = set(re.findall(r"injector\.([a-z_]+)", text))
    assert {"arm", "on_phase", "install", "consume_injection_time", "begin_step", "maybe_fire"} <= used
    assert all(callable(getattr(FaultInjector, name, None)) for name in used - {"fired"}), used
    assert "docs/fault_injection.md" in (ROOT / "README.md").read_text()
