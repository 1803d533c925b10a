"""Progress on long steps: a count bar made at its first update, and a throughput averaged over a
window of updates.

Every step of a command that can take more than ~2 s shows a bar or a running count (issue 39):
`CountBar` is the bar of a step that reports how much it has done (a passage cache's windows, an
evaluation's questions). `WindowedRate` is the examples/s of `train`'s bar: averaged over the
last updates, and without the first interval once a later one exists, since that one paid the
compilation (a rate of 0.6 ex/s beside a steady 1,284 says nothing about either).

Log lines and bars do not interleave: `dil_jax.cli` runs every command under
`logs_beside_bars`, which writes log records through `tqdm.write`.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import sys
import time
from collections.abc import Callable, Iterator


class CountBar:
    """A tqdm bar over `total` units, made at the first `update` (a step that finds its work
    already done shows nothing); `update(done)` takes the count done so far, not an increment.
    A context manager: the bar is closed on exit."""

    def __init__(self, description: str, total: int | None, unit: str, initial: int = 0,
                 enabled: bool = True):
        self.description, self.total, self.unit = description, total, unit
        self.initial, self.enabled = initial, enabled
        self.bar = None

    def update(self, done: int) -> None:
        if not self.enabled:
            return
        if self.bar is None:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=self.total, initial=self.initial, desc=self.description,
                            unit=self.unit, dynamic_ncols=True)
        self.bar.update(done - self.bar.n)

    __call__ = update

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def __enter__(self) -> CountBar:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


class WindowedRate:
    """Units per second over the last `window` intervals between updates.

    The first interval (from the start to the first update) is dropped as soon as a second one
    exists: it holds the compilation. Until then the rate is that first interval's, the only
    measurement there is. `clock` is injectable for tests.
    """

    def __init__(self, units_per_step: float, start_step: int, window: int = 10,
                 clock: Callable[[], float] = time.perf_counter):
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.units_per_step = units_per_step
        self.clock = clock
        self.points: collections.deque[tuple[float, int]] = collections.deque(
            [(clock(), start_step)], maxlen=window + 1)
        self.updates = 0

    def update(self, step: int) -> float:
        """Records that `step` is reached now; returns the averaged rate (units/s)."""
        self.points.append((self.clock(), step))
        self.updates += 1
        if self.updates == 2 and len(self.points) == 3:
            self.points.popleft()  # the start: the first interval paid the compilation
        return self.rate()

    def exclude(self, seconds: float) -> None:
        """Leaves out `seconds` just spent on something else (an evaluation, a checkpoint
        save): the recorded points move forward by it, so the interval holding the pause is
        counted at its working time. Without this, a window with a save and one without read
        as rates that jumped by orders of magnitude (3.0 -> 1325.8 -> 27.5 ex/s)."""
        self.points = collections.deque(((t + seconds, step) for t, step in self.points),
                                        maxlen=self.points.maxlen)

    def rate(self) -> float:
        """The averaged rate now; 0.0 before the first update."""
        (t0, s0), (t1, s1) = self.points[0], self.points[-1]
        if len(self.points) < 2:
            return 0.0
        return (s1 - s0) * self.units_per_step / max(t1 - t0, 1e-9)


class _BarSafeHandler(logging.Handler):
    """Writes records through `tqdm.write` to the `sys.stderr` of the moment of each record,
    not the stream a console handler held when it was made: a record then never cuts a bar in
    two, and never goes to a stream closed since (a test's captured stderr, a redirected one)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            from tqdm import tqdm

            tqdm.write(self.format(record), file=sys.stderr)
        except Exception:  # as logging.StreamHandler: a broken record is reported, not raised
            self.handleError(record)


@contextlib.contextmanager
def logs_beside_bars() -> Iterator[None]:
    """While the block runs, the root logger's console handlers (plain StreamHandlers on
    stderr or stdout) are replaced by `_BarSafeHandler`s with their level and format; they are
    put back after."""
    root = logging.getLogger()
    saved = list(root.handlers)

    def replacement(handler: logging.Handler) -> logging.Handler:
        if type(handler) is not logging.StreamHandler or \
                handler.stream not in (sys.stderr, sys.stdout):
            return handler
        safe = _BarSafeHandler(handler.level)
        safe.setFormatter(handler.formatter)
        return safe

    root.handlers = [replacement(handler) for handler in saved]
    try:
        yield
    finally:
        root.handlers = saved
