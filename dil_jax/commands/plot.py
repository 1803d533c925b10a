"""`dil-jax plot WORKDIR`: redraw a training run's curves.png from its metrics.jsonl.

Loss (train and validation), learning rate, and validation EM/F1 against steps; `train` draws
the same file at each evaluation. Needs matplotlib (`pip install 'dil_jax[train]'`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "plot", help="redraw a training workdir's curves.png from its metrics.jsonl",
        description=__doc__)
    parser.add_argument("workdir", help="a train workdir (--config.workdir), or any folder "
                                        "holding a metrics.jsonl")
    parser.add_argument("--out", default=None,
                        help="the PNG to write (default: WORKDIR/curves.png)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dil_jax.atomic import check_output_path
    from dil_jax.errors import UsageError
    from dil_jax.train.curves import CURVES_FILE, draw_curves, plotted_rows
    from dil_jax.train.log_writers import METRICS_FILE

    metrics = Path(args.workdir) / METRICS_FILE
    rows = plotted_rows(metrics)  # first: a folder without metrics.jsonl is named at once
    out = Path(args.out) if args.out else Path(args.workdir) / CURVES_FILE
    check_output_path(out, "--out", {"WORKDIR": metrics})
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError("matplotlib is not installed: pip install 'dil_jax[train]' (or "
                         "matplotlib) to draw curves") from None
    written = draw_curves(metrics, out, title=str(args.workdir), rows=rows)
    print(f"wrote {written}", file=sys.stderr)
    return 0
