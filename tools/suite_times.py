"""The test suite's time per test directory, from pytest's `--durations=0` report.

    python3 -m pytest -q -m "not slow" --durations=0 ... > durations.txt
    python3 tools/suite_times.py durations.txt                       # one run's table
    python3 tools/suite_times.py BEFORE.txt --vs AFTER.txt           # two runs side by side

Sums every phase pytest reports (setup, call, teardown) of each test by its directory
(`tests/open_domain`, `tests/train`, ...): with `-n 2` the two workers' times add up, so the sum
is the suite's test time over both processes, not its wall time. pytest leaves out durations
under 0.005 s (`--durations-min`): those tests count as 0.
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
from pathlib import Path

# "12.34s call     tests/train/test_loop.py::test_name[param]"
DURATION_LINE = re.compile(r"^\s*(\d+(?:\.\d+)?)s\s+(setup|call|teardown)\s+(\S+?)::")


def seconds_per_directory(report: str) -> dict[str, float]:
    """{test directory: seconds summed over its tests' reported phases} of a durations report."""
    totals: dict[str, float] = collections.defaultdict(float)
    for line in report.splitlines():
        match = DURATION_LINE.match(line)
        if match:
            totals[str(Path(match.group(3)).parent)] += float(match.group(1))
    return dict(totals)


def table(runs: dict[str, dict[str, float]]) -> str:
    """A Markdown table: a row per directory (slowest first by the last run), a column per run,
    and the ratio of the last run to the first when there are two."""
    names = list(runs)
    directories = sorted({d for totals in runs.values() for d in totals},
                         key=lambda d: -runs[names[-1]].get(d, 0.0))
    header = "| directory | " + " | ".join(f"{name} (s)" for name in names)
    header += " | after / before |" if len(names) == 2 else " |"
    lines = [header, "|" + " --- |" * (len(names) + 1 + (len(names) == 2))]
    rows = directories + ["all"]
    for directory in rows:
        values = [sum(totals.values()) if directory == "all" else totals.get(directory, 0.0)
                  for totals in runs.values()]
        cells = " | ".join(f"{value:,.0f}" for value in values)
        ratio = ""
        if len(names) == 2:
            ratio = f" | {values[1] / values[0]:.2f}" if values[0] > 0 else " | new"
        lines.append(f"| {directory} | {cells}{ratio} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("report", type=Path, help="pytest --durations=0 output")
    parser.add_argument("--vs", type=Path, help="a second report (after), beside the first")
    args = parser.parse_args(argv)
    runs = {}
    for label, path in (("before" if args.vs else "seconds", args.report), ("after", args.vs)):
        if path is None:
            continue
        try:
            totals = seconds_per_directory(path.read_text())
        except OSError as error:
            parser.error(f"cannot read {path}: {error.strerror}")
        if not totals:
            parser.error(f"{path}: no pytest durations lines (run pytest with --durations=0)")
        runs[label] = totals
    print(table(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
