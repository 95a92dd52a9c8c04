"""The test suite's time per file, from pytest's JUnit XML report: a Markdown table.

Usage::

    python -m pytest -q -n 2 --dist loadgroup tests --junitxml=/tmp/junit.xml
    python benchmarks/test_times.py /tmp/junit.xml [--most 25]

Each row: a test file, its tests, and the seconds they took (setup, call and teardown,
added up over both xdist workers: the suite's wall time is about half their sum on two
cores). ``docs/testing.md`` shows this table.
"""
from __future__ import annotations

import argparse
import collections
import xml.etree.ElementTree as ElementTree


def per_file(report: str):
    """{test file: (tests, seconds, skipped)} from a JUnit XML report."""
    seconds = collections.Counter()
    tests = collections.Counter()
    skipped = collections.Counter()
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        name = case.get("classname", "").split(".")
        module = name[1] if name[0] == "tests" and len(name) > 1 else name[0]
        seconds[module] += float(case.get("time") or 0.0)
        tests[module] += 1
        skipped[module] += case.find("skipped") is not None
    return {m: (tests[m], seconds[m], skipped[m]) for m in tests}


def table(rows, most: int) -> str:
    ordered = sorted(rows.items(), key=lambda kv: -kv[1][1])
    total = sum(s for _, s, _ in rows.values())
    lines = ["| file | tests | seconds | share |", "|---|---:|---:|---:|"]
    for module, (n, s, skip) in ordered[:most]:
        note = f" ({skip} skipped)" if skip else ""
        lines.append(f"| {module} | {n}{note} | {s:.1f} | {s / total:.0%} |")
    rest = ordered[most:]
    if rest:
        lines.append(f"| {len(rest)} other files | {sum(v[0] for _, v in rest)} | "
                     f"{sum(v[1] for _, v in rest):.1f} | "
                     f"{sum(v[1] for _, v in rest) / total:.0%} |")
    lines.append(f"| all | {sum(v[0] for v in rows.values())} | {total:.1f} | |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("report", help="pytest's --junitxml file")
    parser.add_argument("--most", type=int, default=25, help="rows before the rest (25)")
    args = parser.parse_args(argv)
    print(table(per_file(args.report), args.most))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
