"""Progress on long steps (dil_jax/progress.py): train's examples/s averaged over a window
without the compiling first interval, count bars made at their first count, and log lines that
never cut a bar in two."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dil_jax.progress import CountBar, WindowedRate
from dil_jax.train.log_writers import Progress

from tests.helpers import REPO


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_compiling_first_interval_leaves_the_rate_once_a_second_exists():
    clock = FakeClock()
    rate = WindowedRate(units_per_step=8, start_step=0, window=3, clock=clock)
    assert rate.rate() == 0.0
    clock.now = 100.0  # 10 steps, 100 s: the compilation
    assert rate.update(10) == pytest.approx(10 * 8 / 100)  # all there is
    clock.now = 101.0  # then 10 steps a second
    assert rate.update(20) == pytest.approx(80.0)
    clock.now = 103.0  # and 5 steps a second: averaged over both intervals
    assert rate.update(30) == pytest.approx(20 * 8 / 3)


def test_the_rate_is_averaged_over_the_last_window_of_intervals():
    clock = FakeClock()
    rate = WindowedRate(units_per_step=1, start_step=0, window=2, clock=clock)
    for step, now in ((1, 50.0), (2, 51.0), (3, 52.0), (4, 53.0)):  # 1 step/s after the first
        clock.now = now
        rate.update(step)
    clock.now = 63.0  # a slow interval: 1 step in 10 s; the window holds it and one fast one
    assert rate.update(5) == pytest.approx(2 / 11)
    clock.now = 73.0
    assert rate.update(6) == pytest.approx(2 / 20)  # the fast one has left the window


def test_time_spent_saving_or_evaluating_is_left_out_of_the_rate():
    """Steps at 10 a second with a 30 s save after every second interval: the shown rate stays
    80 ex/s (it jumped 3.0 -> 1325.8 -> 27.5 -> 69.2 with the pauses counted)."""
    clock = FakeClock()
    rate = WindowedRate(units_per_step=8, start_step=0, window=3, clock=clock)
    clock.now = 100.0
    rate.update(10)  # the compilation
    shown = []
    for n in range(2, 8):
        clock.now += 1.0  # 10 steps in 1 s
        shown.append(rate.update(10 * n))
        if n % 2:
            clock.now += 30.0  # a checkpoint save
            rate.exclude(30.0)
    assert shown == pytest.approx([80.0] * 6)


def test_a_window_of_one_is_the_last_interval_and_zero_is_refused():
    clock = FakeClock()
    rate = WindowedRate(units_per_step=2, start_step=5, window=1, clock=clock)
    clock.now = 10.0
    rate.update(6)
    clock.now = 11.0
    assert rate.update(8) == pytest.approx(4.0)
    with pytest.raises(ValueError, match="window must be >= 1"):
        WindowedRate(1, 0, window=0)


def test_train_progress_shows_the_windowed_rate():
    clock = FakeClock()
    progress = Progress(total_steps=100, start_step=0, examples_per_step=4, enabled=True,
                        clock=clock)
    clock.now = 60.0  # the first log step pays a minute of compilation
    assert progress.update(10, loss=2.0) == pytest.approx(40 / 60)
    clock.now = 61.0
    assert progress.update(20, loss=1.5) == pytest.approx(40.0)  # not (80 / 61)
    assert progress.bar.n == 20
    progress.close()


def test_a_count_bar_is_made_at_its_first_count_and_counts_totals(capsys):
    with CountBar("cache", total=10, unit="window") as bar:
        assert bar.bar is None  # work already done shows nothing
        bar(4)
        bar(10)
        assert bar.bar.n == 10
    assert bar.bar is None
    assert "cache: 100%" in capsys.readouterr().err
    resumed = CountBar("questions", total=10, unit="question", initial=6)
    resumed(6)
    assert resumed.bar.n == 6
    resumed(10)
    assert resumed.bar.n == 10
    resumed.close()
    off = CountBar("x", 3, "y", enabled=False)
    off(3)
    assert off.bar is None


# A command run through dil_jax.cli.main that logs while its bar is drawn.
_PROBE = """
import logging, sys
import dil_jax.commands.evaluate as evaluate
from dil_jax import cli

def probe(args):
    from tqdm import tqdm
    bar = tqdm(total=4, desc="probe", file=sys.stderr)
    bar.update(2)
    logging.getLogger("probe").warning("a log line")
    bar.update(2)
    bar.close()
    return 0

evaluate.run = probe
sys.exit(cli.main(["evaluate", "--data", "unused", "--predictions", "unused"]))
"""


def test_a_log_line_does_not_cut_a_progress_bar_in_two(tmp_path):
    # Bytes: text mode would turn the bars' carriage returns into newlines.
    done = subprocess.run([sys.executable, "-c", _PROBE], cwd=tmp_path, capture_output=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    err = done.stderr.decode()
    assert done.returncode == 0, err
    (line,) = [line for line in err.split("\n") if "a log line" in line]
    *before, last = line.split("\r")
    assert last == "WARNING probe: a log line"
    assert not before[-1].strip()  # the bar was cleared first, not written over


def test_log_records_go_to_the_stderr_of_the_moment_not_a_closed_one(monkeypatch):
    """A console handler made while one stderr was current must not write to it after it is
    closed (a test's captured stderr, a server thread outliving its caller's stream)."""
    import io
    import logging
    import sys

    from dil_jax.progress import logs_beside_bars

    first, second = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    root = logging.getLogger()
    console = logging.StreamHandler(first)
    console.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    monkeypatch.setattr(root, "handlers", [console])
    monkeypatch.setattr(root, "level", logging.INFO)
    with logs_beside_bars():
        assert root.handlers != [console]
        first.close()
        monkeypatch.setattr(sys, "stderr", second)
        logging.getLogger("dil_jax.test").warning("after the swap")
    assert root.handlers == [console]
    assert second.getvalue() == "WARNING after the swap\n"
