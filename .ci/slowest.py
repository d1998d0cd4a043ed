"""Print the test suite's slowest tests and files from pytest's JUnit XML, so CI shows where the time goes.

    python3 .ci/slowest.py build/ci/junit.xml [--top 40]

Each test's time is setup + call + teardown (pytest's junit_duration_report=total), so a module-scoped
fixture's run is charged to the first test that uses it; the per-file totals show the whole cost of a
file. Standard library only: it runs before, or without, the project's venv.
"""

from __future__ import annotations

import argparse
import collections
import sys
import xml.etree.ElementTree as ET


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("junit_xml")
    ap.add_argument("--top", type=int, default=40, help="how many tests to list (default 40)")
    args = ap.parse_args(argv)
    try:
        root = ET.parse(args.junit_xml).getroot()
    except (OSError, ET.ParseError) as exc:
        print(f"slowest: no test timings to show ({args.junit_xml}: {exc}); did pytest run?", file=sys.stderr)
        return 1
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    cases = []
    for case in root.iter("testcase"):
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = child.tag
        name = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
        cases.append((float(case.get("time") or 0), name, outcome))
    wall = sum(float(s.get("time") or 0) for s in suites)
    total = sum(t for t, _, _ in cases)
    print(f"\n==== slowest tests: pytest wall {wall / 60:.1f} min, {len(cases)} tests, "
          f"{total / 60:.1f} min in tests (setup + call + teardown) ====")
    for t, name, outcome in sorted(cases, reverse=True)[:args.top]:
        print(f"{t:8.1f} s  {name}" + ("" if outcome == "passed" else f"  [{outcome}]"))
    per_file: dict[str, float] = collections.defaultdict(float)
    for t, name, _ in cases:
        per_file[name.split("::")[0]] += t
    print("\n==== slowest files ====")
    for name, t in sorted(per_file.items(), key=lambda kv: -kv[1])[:20]:
        print(f"{t:8.1f} s  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
