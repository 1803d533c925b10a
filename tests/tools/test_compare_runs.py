"""tools/compare_runs.py: two runs' losses over the steps both logged, window by window, and
their evaluations; expected values computed by hand from the files written here."""

from __future__ import annotations

import json

import pytest

from tests.helpers import load_script


def _write(workdir, records):
    workdir.mkdir()
    (workdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def _train(step, loss):
    return {"step": step, "split": "train", "loss": loss}


def test_windows_compare_shared_steps_and_evaluations_land_in_their_row(tmp_path, capsys):
    tool = load_script("tools/compare_runs.py")
    # a logs 10, 20 (twice: a restart; the last counts), 30; b logs 20, 30, 40.
    _write(tmp_path / "a", [_train(10, 9.0), _train(20, 5.0), _train(20, 4.0), _train(30, 2.0),
                            {"step": 20, "split": "eval", "exact": 10.0, "f1": 20.0}])
    _write(tmp_path / "b", [_train(20, 3.0), _train(30, 1.0), _train(40, 7.0),
                            {"step": 40, "split": "eval", "exact": 30.0, "f1": 40.5}])
    a, b = (tool.read_curve(tmp_path / name) for name in ("a", "b"))
    # Shared steps 20, 30; windows of 20: (0, 20] holds 20, (20, 40] holds 30.
    assert tool.window_means(a, b, 20) == [(0, 1, 4.0, 3.0), (20, 1, 2.0, 1.0)]
    assert tool.main([str(tmp_path / "a"), str(tmp_path / "b"), "--window", "20"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert rows[2] == "| 0-20 | 1 | 4.000 | 3.000 | 10.00 / 20.00 (step 20) |  |"
    assert rows[3] == "| 20-40 | 1 | 2.000 | 1.000 |  | 30.00 / 40.50 (step 40) |"


def test_a_missing_or_broken_metrics_file_is_named(tmp_path):
    tool = load_script("tools/compare_runs.py")
    with pytest.raises(SystemExit, match=r"cannot read .*nowhere/metrics.jsonl"):
        tool.read_curve(tmp_path / "nowhere")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "metrics.jsonl").write_text('{"step": 1}\nnot json\n')
    with pytest.raises(SystemExit, match=r"bad/metrics.jsonl line 2 is not JSON"):
        tool.read_curve(tmp_path / "bad")
