"""Training metrics: JSONL lines, TensorBoard event files, and a tqdm progress bar.

TensorBoard events are written with `tensorboardX` (pure Python + protobuf, ~100 KB), not
`flax.metrics.tensorboard` (which needs TensorFlow) nor `clu` (which pulls TensorFlow too). It is
optional: without it the JSONL file is still written and a warning says how to get the events.
Only process 0 writes; the others keep silent so a pod run has one log.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dil_jax.atomic import write_atomic

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"


def rows_through_step(lines: list[str], last_step: int) -> list[str]:
    """The JSONL lines whose step is <= last_step; unreadable lines (a write cut off by a kill)
    are dropped too."""
    kept = []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] <= last_step:
            kept.append(line)
    return kept


def truncate_metrics(path: Path, last_step: int) -> int:
    """Drops rows past `last_step` from a metrics.jsonl (atomically); returns how many."""
    if not path.is_file():
        return 0
    lines = path.read_text(encoding="utf-8").splitlines()
    kept = rows_through_step(lines, last_step)
    if len(kept) != len(lines):
        write_atomic(path, "".join(line + "\n" for line in kept))
    return len(lines) - len(kept)


class MetricWriter:
    """Appends {"step", "split", **values} lines to metrics.jsonl and scalars to TensorBoard."""

    def __init__(self, workdir: str | Path, *, enabled: bool = True, tensorboard: bool = True,
                 resume_step: int | None = None):
        """resume_step: the step training continues from; rows logged after it (by a run that
        stopped before its next checkpoint) are removed, since those steps run again."""
        self.enabled = enabled
        self._tb = None
        self._file = None
        self.path = Path(workdir) / METRICS_FILE
        self._curves = True  # False once matplotlib turned out to be missing
        if not enabled:
            return
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        if resume_step is not None:
            dropped = truncate_metrics(workdir / METRICS_FILE, resume_step)
            if dropped:
                log.info("dropped %d rows past step %d from %s (those steps run again)",
                         dropped, resume_step, workdir / METRICS_FILE)
        # Append: a resumed run continues the same file (steps after the restored one follow).
        self._file = open(workdir / METRICS_FILE, "a", encoding="utf-8")
        if tensorboard:
            try:
                from tensorboardX import SummaryWriter
            except ImportError:
                log.warning("tensorboardX is not installed: metrics go to %s only "
                            "(pip install 'dil_jax[train]' for TensorBoard event files)",
                            workdir / METRICS_FILE)
            else:
                self._tb = SummaryWriter(str(workdir / TENSORBOARD_DIR))

    def write(self, step: int, split: str, values: dict[str, Any]) -> None:
        if not self.enabled:
            return
        scalars = {name: float(value) for name, value in values.items()}
        line = {"step": int(step), "split": split, "time": time.time(), **scalars}
        self._file.write(json.dumps(line) + "\n")
        self._file.flush()
        if self._tb is not None:
            for name, value in scalars.items():
                self._tb.add_scalar(f"{split}/{name}", value, int(step))
            self._tb.flush()

    def draw_curves(self) -> Path | None:
        """Redraws curves.png beside metrics.jsonl (dil_jax.train.curves); returns its path, or
        None when not drawn. A plot never stops training: without matplotlib it is skipped (said
        once), and a plot that cannot be written is a warning."""
        if not self.enabled or not self._curves:
            return None
        try:
            from dil_jax.train.curves import draw_curves
        except ImportError:
            log.warning("matplotlib is not installed: no %s/curves.png (pip install "
                        "'dil_jax[train]'; dil-jax plot %s draws it later)", self.path.parent,
                        self.path.parent)
            self._curves = False
            return None
        try:
            return draw_curves(self.path)
        except (OSError, ValueError) as error:  # the DilJaxErrors of a write are ValueErrors
            log.warning("could not draw the training curves: %s", error)
            return None

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        if self._tb is not None:
            self._tb.close()


class Progress:
    """tqdm bar over optimizer steps: step/total, ETA, loss and examples/s in the postfix.

    examples/s is averaged over the last `window` updates, without the first interval (which
    paid the compilation) once there is another (`dil_jax.progress.WindowedRate`); the
    metrics.jsonl rows keep each log interval's own rate."""

    def __init__(self, total_steps: int, start_step: int, examples_per_step: int,
                 enabled: bool = True, window: int = 10,
                 clock: Callable[[], float] = time.perf_counter):
        from tqdm.auto import tqdm

        from dil_jax.progress import WindowedRate

        self.rate = WindowedRate(examples_per_step, start_step, window, clock)
        self.bar = tqdm(total=total_steps, initial=start_step, disable=not enabled,
                        unit="step", dynamic_ncols=True, smoothing=0.1)
        self._last_step = start_step

    def update(self, step: int, loss: float | None = None) -> float:
        """Advances the bar to `step`; returns the averaged examples/s shown."""
        rate = self.rate.update(step)
        postfix = {"ex/s": f"{rate:.1f}"}
        if loss is not None:
            postfix["loss"] = f"{loss:.4f}"
        self.bar.set_postfix(postfix, refresh=False)
        self.bar.update(step - self._last_step)
        self._last_step = step
        return rate

    def exclude(self, seconds: float) -> None:
        """Leaves `seconds` of non-training work out of the examples/s shown."""
        self.rate.exclude(seconds)

    def close(self) -> None:
        self.bar.close()
