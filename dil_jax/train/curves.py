"""Training curves: `curves.png` from a workdir's metrics.jsonl (loss, learning rate, validation
EM/F1 against steps).

`train` redraws it at each evaluation (`MetricWriter.draw_curves`); `dil-jax plot WORKDIR`
redraws it from the file alone. matplotlib (the `train` and `bench` extras) draws with its Agg
canvas and no pyplot, so no display and no process-wide backend switch; without matplotlib
training goes on and says once how to get the plot.
"""

from __future__ import annotations

import dataclasses
import io
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dil_jax.atomic import write_atomic
from dil_jax.errors import InputFileError

CURVES_FILE = "curves.png"

Series = tuple[tuple[int, ...], tuple[float, ...]]  # steps, values


def read_metric_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a metrics.jsonl with an integer step and a split; a line cut off by a kill (or
    anything else unreadable) is skipped. InputFileError naming the file when it is absent or a
    folder."""
    if path.is_dir():
        raise InputFileError(f"{path} is a folder, not a metrics file")
    if not path.is_file():
        raise InputFileError(f"{path}: no such file (dil-jax train writes it into its workdir)")
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int) and "split" in row:
            rows.append(row)
    return rows


def series(rows: Iterable[Mapping[str, Any]], split: str, name: str) -> Series:
    """Steps and values of one metric of one split, in step order; the last row of a step wins
    (a resumed run logs its steps again), non-numeric values are skipped."""
    by_step: dict[int, float] = {}
    for row in rows:
        value = row.get(name)
        if row.get("split") == split and isinstance(value, (int, float)) \
                and not isinstance(value, bool):
            by_step[int(row["step"])] = float(value)
    steps = tuple(sorted(by_step))
    return steps, tuple(by_step[step] for step in steps)


@dataclasses.dataclass(frozen=True)
class Panel:
    """One panel of the figure: a title and its (label, split, metric) curves."""

    title: str
    curves: tuple[tuple[str, str, str], ...]


PANELS = (
    Panel("loss", (("train loss", "train", "loss"), ("validation loss", "eval", "val_loss"))),
    Panel("learning rate", (("learning rate", "train", "learning_rate"),)),
    Panel("validation EM / F1", (("EM", "eval", "exact"), ("F1", "eval", "f1"))),
)


def panel_series(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Series]]:
    """Per panel title, the non-empty series of its curves by label."""
    out: dict[str, dict[str, Series]] = {}
    for panel in PANELS:
        out[panel.title] = {}
        for label, split, name in panel.curves:
            steps, values = series(rows, split, name)
            if steps:
                out[panel.title][label] = (steps, values)
    return out


def render_png(rows: Sequence[Mapping[str, Any]], title: str = "") -> bytes:
    """The figure as PNG bytes: one panel per entry of PANELS, steps on every x axis; a panel
    without data says so. Needs matplotlib."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(15, 4.2))
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, len(PANELS), sharex=True)
    for ax, (panel_title, curves) in zip(axes, panel_series(rows).items()):
        ax.set_title(panel_title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        for label, (steps, values) in curves.items():
            # Evaluations are few: markers show where each one is.
            ax.plot(steps, values, marker="o" if len(steps) < 50 else None, ms=3, label=label)
        if curves:
            ax.legend()
        else:
            ax.text(0.5, 0.5, "nothing logged yet", ha="center", va="center",
                    transform=ax.transAxes, color="gray")
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()


def plotted_rows(metrics_file: Path) -> list[dict[str, Any]]:
    """`read_metric_rows`, and an InputFileError naming the file when it holds none."""
    rows = read_metric_rows(metrics_file)
    if not rows:
        raise InputFileError(f"{metrics_file}: no metric rows to plot (each line is a JSON "
                             "object with a step and a split, written by dil-jax train)")
    return rows


def draw_curves(metrics_file: Path, out: Path | None = None, title: str = "",
                rows: Sequence[Mapping[str, Any]] | None = None) -> Path:
    """Draws `out` (default: curves.png beside `metrics_file`) from the file (or from `rows`
    already read from it), atomically; InputFileError when the file is missing or holds no
    metric row."""
    rows = plotted_rows(metrics_file) if rows is None else rows
    out = out if out is not None else metrics_file.parent / CURVES_FILE
    return write_atomic(out, render_png(rows, title))
