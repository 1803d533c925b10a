"""Two training runs side by side, from their workdirs' metrics.jsonl: the mean training loss of
each window of steps over the steps BOTH logged (runs of the same config and data seed see the
same batches at the same step, so the difference is the change between them, not the data),
and every validation EM / F1. Prints a Markdown table.

    python3 tools/compare_runs.py RUN_A RUN_B [--window 100] [--names A B]

A step logged twice (a run restarted from an older checkpoint logs the steps since again)
counts once, its last record.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

METRICS_FILE = "metrics.jsonl"


@dataclass(frozen=True)
class RunCurve:
    """One run's logged values: training loss by step, (EM, F1) by evaluated step."""

    train_loss: dict[int, float]
    evals: dict[int, tuple[float, float]]


def read_curve(workdir: Path) -> RunCurve:
    """The curve in WORKDIR/metrics.jsonl; SystemExit naming the file if it cannot be read."""
    path = workdir / METRICS_FILE
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise SystemExit(f"compare_runs: cannot read {path}: {error.strerror}") from None
    train_loss: dict[int, float] = {}
    evals: dict[int, tuple[float, float]] = {}
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            raise SystemExit(f"compare_runs: {path} line {number} is not JSON") from None
        if record.get("split") == "train" and "loss" in record:
            train_loss[int(record["step"])] = float(record["loss"])
        elif "f1" in record and "exact" in record:
            evals[int(record["step"])] = (float(record["exact"]), float(record["f1"]))
    return RunCurve(train_loss, evals)


def window_means(a: RunCurve, b: RunCurve, window: int
                 ) -> list[tuple[int, int, float, float]]:
    """(start, steps compared, mean loss of a, of b) for each window of steps start + 1 ..
    start + `window` holding a step both runs logged (so the row 700 holds the loss at step
    800 beside the evaluation after step 800)."""
    shared = sorted(set(a.train_loss) & set(b.train_loss))
    rows = []
    for start in range(0, shared[-1] if shared else 0, window):
        steps = [s for s in shared if start < s <= start + window]
        if steps:
            rows.append((start, len(steps), sum(a.train_loss[s] for s in steps) / len(steps),
                         sum(b.train_loss[s] for s in steps) / len(steps)))
    return rows


def table(a: RunCurve, b: RunCurve, names: tuple[str, str], window: int) -> str:
    lines = [f"| steps | logged steps | loss {names[0]} | loss {names[1]} | EM / F1 {names[0]} "
             f"| EM / F1 {names[1]} |", "|---|---|---|---|---|---|"]
    by_start = {start: (n, la, lb) for start, n, la, lb in window_means(a, b, window)}
    eval_steps = sorted(set(a.evals) | set(b.evals))
    starts = sorted(set(by_start) | {(step - 1) // window * window for step in eval_steps})

    def scores(curve: RunCurve, start: int) -> str:
        found = [f"{curve.evals[s][0]:.2f} / {curve.evals[s][1]:.2f} (step {s})"
                 for s in eval_steps if start < s <= start + window and s in curve.evals]
        return "; ".join(found)

    for start in starts:
        n, la, lb = by_start.get(start, (0, None, None))
        loss = (f"{la:.3f} | {lb:.3f}" if n else " | ")
        lines.append(f"| {start}-{start + window} | {n} | {loss} | {scores(a, start)} | "
                     f"{scores(b, start)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs=2, type=Path, help="two workdirs")
    parser.add_argument("--window", type=int, default=100, help="steps per row")
    parser.add_argument("--names", nargs=2, default=None, help="the runs' column names")
    args = parser.parse_args(argv)
    if args.window < 1:
        parser.error(f"--window must be >= 1, got {args.window}")
    names = tuple(args.names or (path.name for path in args.runs))
    a, b = (read_curve(path) for path in args.runs)
    print(table(a, b, names, args.window))
    return 0


if __name__ == "__main__":
    sys.exit(main())
