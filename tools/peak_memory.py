"""Runs a command and reports the peak of its whole process tree's summed resident memory.

    python3 tools/peak_memory.py COMMAND [ARG ...]

Samples every second (psutil) the RSS of the command and all its descendants, summed: the
memory a machine must have for it, where `/usr/bin/time` reports only the largest single process.
Prints `peak_tree_rss_gib=... wall_s=... rc=...` at the end and exits with the command's status.
A peak shorter than a second can be missed.
"""

from __future__ import annotations

import subprocess
import sys
import time

import psutil


def tree_rss(root: psutil.Process) -> int:
    """Bytes resident in `root` and its descendants now (processes that end meanwhile: 0)."""
    total = 0
    for process in [root, *root.children(recursive=True)]:
        try:
            total += process.memory_info().rss
        except psutil.Error:
            continue
    return total


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    started = time.time()
    command = subprocess.Popen(argv)
    root = psutil.Process(command.pid)
    peak = 0
    while command.poll() is None:
        try:
            peak = max(peak, tree_rss(root))
        except psutil.Error:
            pass
        time.sleep(1.0)
    print(f"peak_tree_rss_gib={peak / 2**30:.2f} wall_s={time.time() - started:.0f} "
          f"rc={command.returncode}", flush=True)
    return command.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
