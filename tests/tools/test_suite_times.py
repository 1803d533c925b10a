"""tools/suite_times.py: durations summed per test directory, checked against a hand sum."""

from __future__ import annotations

import pytest

from tools import suite_times

REPORT = """\
============================= slowest durations ==============================
12.50s call     tests/train/test_loop.py::test_a[x-1]
2.25s setup    tests/train/test_loop.py::test_a[x-1]
0.75s call     tests/train/deep/test_b.py::test_b
3.00s teardown tests/test_layout.py::test_c
(3 durations < 0.005s hidden.  Use -vv to show these durations.)
1 passed in 19.00s
"""


def test_seconds_are_summed_per_directory_by_hand() -> None:
    assert suite_times.seconds_per_directory(REPORT) == {
        "tests/train": 14.75, "tests/train/deep": 0.75, "tests": 3.0}


def test_two_runs_side_by_side_with_their_ratio() -> None:
    text = suite_times.table({"before": {"tests/a": 10.0, "tests/b": 4.0},
                              "after": {"tests/a": 5.0, "tests/c": 1.0}})
    lines = text.splitlines()
    assert lines[0] == "| directory | before (s) | after (s) | after / before |"
    assert "| tests/a | 10 | 5 | 0.50 |" in lines
    assert "| tests/b | 4 | 0 | 0.00 |" in lines
    assert "| tests/c | 0 | 1 | new |" in lines
    assert lines[-1] == "| all | 14 | 6 | 0.43 |"


def test_a_file_without_durations_is_refused_naming_it(tmp_path, capsys) -> None:
    path = tmp_path / "out.txt"
    path.write_text("1 passed in 3.00s\n")
    with pytest.raises(SystemExit) as stop:
        suite_times.main([str(path)])
    assert stop.value.code != 0
    assert str(path) in capsys.readouterr().err
