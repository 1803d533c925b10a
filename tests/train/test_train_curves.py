"""Training curves: curves.png from metrics.jsonl (dil_jax/train/curves.py), drawn by `train` at
each evaluation and redrawn by `dil-jax plot WORKDIR`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dil_jax.cli import main
from dil_jax.errors import InputFileError
from dil_jax.train import curves

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# What train writes (dil_jax/train/log_writers.py), by hand: train rows every 2 steps, two
# evaluations, a line cut off by a kill, and step 4 logged again by a resumed run.
ROWS = [
    {"step": 2, "split": "train", "loss": 4.0, "learning_rate": 1e-5, "examples_per_sec": 10.0},
    {"step": 4, "split": "train", "loss": 9.0, "learning_rate": 2e-5},
    {"step": 4, "split": "eval", "val_loss": 3.5, "exact": 10.0, "f1": 20.0},
    {"step": 4, "split": "train", "loss": 3.0, "learning_rate": 2e-5},
    {"step": 6, "split": "train", "loss": 2.0, "learning_rate": 1.5e-5},
    {"step": 8, "split": "eval", "val_loss": 2.5, "exact": 30.0, "f1": 45.0},
]


def write_metrics(folder: Path, rows=ROWS, tail: str = '{"step": 9, "spl') -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "metrics.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows) + tail, encoding="utf-8")
    return path


def test_series_in_step_order_the_last_row_of_a_step_winning(tmp_path):
    rows = curves.read_metric_rows(write_metrics(tmp_path))
    assert len(rows) == len(ROWS)  # the cut-off line is skipped
    assert curves.series(rows, "train", "loss") == ((2, 4, 6), (4.0, 3.0, 2.0))
    assert curves.series(rows, "eval", "f1") == ((4, 8), (20.0, 45.0))
    assert curves.series(rows, "train", "f1") == ((), ())
    panels = curves.panel_series(rows)
    assert list(panels) == ["loss", "learning rate", "validation EM / F1"]
    assert set(panels["loss"]) == {"train loss", "validation loss"}
    assert panels["learning rate"]["learning rate"] == ((2, 4, 6), (1e-5, 2e-5, 1.5e-5))


def test_plot_draws_curves_png_from_a_hand_written_metrics_file(tmp_path, capsys):
    write_metrics(tmp_path / "run")
    assert main(["plot", str(tmp_path / "run")]) == 0
    png = (tmp_path / "run" / "curves.png").read_bytes()
    assert png.startswith(PNG_MAGIC) and len(png) > 10_000
    assert f"wrote {tmp_path / 'run' / 'curves.png'}" in capsys.readouterr().err
    assert main(["plot", str(tmp_path / "run"), "--out", str(tmp_path / "elsewhere.png")]) == 0
    assert (tmp_path / "elsewhere.png").read_bytes().startswith(PNG_MAGIC)


def test_plot_of_a_folder_without_metrics_is_one_line_naming_the_file(tmp_path, capsys):
    assert main(["plot", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"dil-jax plot: error: {tmp_path / 'metrics.jsonl'}: no such file (dil-jax "
                   "train writes it into its workdir)"]
    assert not (tmp_path / "curves.png").exists()


def test_plot_of_a_metrics_file_without_rows_is_refused(tmp_path, capsys):
    write_metrics(tmp_path, rows=[], tail="not json\n")
    assert main(["plot", str(tmp_path)]) == 1
    assert "metrics.jsonl: no metric rows to plot" in capsys.readouterr().err
    with pytest.raises(InputFileError, match="is a folder"):
        curves.read_metric_rows(tmp_path)


def test_train_redraws_curves_png_at_each_evaluation(tmp_path, monkeypatch):
    from dil_jax.train.loop import train

    from tests.helpers.training import BEST_BY_F1, STEPS, tiny_config

    drawn_through = []
    real = curves.draw_curves

    def recording(metrics_file, *args, **kwargs):
        rows = curves.read_metric_rows(metrics_file)
        drawn_through.append(max(row["step"] for row in rows if row["split"] == "eval"))
        return real(metrics_file, *args, **kwargs)

    monkeypatch.setattr(curves, "draw_curves", recording)
    # num_train_steps STEPS = 10 (tests/helpers/training.py says why): evaluations at 4 and 8,
    # then (resumed) at the last step, 10, not a multiple of 4.
    overrides = {"num_train_steps": STEPS, "checkpoint.every_steps": 2, "eval.every_steps": 4,
                 "log.every_steps": 1, **BEST_BY_F1}
    train(tiny_config(tmp_path, overrides), stop_after_step=8,
          evaluate_fn=lambda params: {"exact": 1.0, "f1": 2.0})
    assert drawn_through == [4, 8]  # every evaluation, each with its own row
    assert (tmp_path / "curves.png").read_bytes().startswith(PNG_MAGIC)
    train(tiny_config(tmp_path, overrides),
          evaluate_fn=lambda params: {"exact": 1.0, "f1": 2.0})
    assert drawn_through == [4, 8, STEPS]


def test_a_workdir_holding_curves_png_is_still_trains_own(tmp_path):
    from dil_jax.train.workdir import workdir_problem

    # What older code left (no mark, no checkpoints yet): metrics and the plot only.
    write_metrics(tmp_path)
    (tmp_path / "curves.png").write_bytes(PNG_MAGIC)
    assert workdir_problem(tmp_path) is None
    (tmp_path / "notes.txt").write_text("x")
    assert "did not write" in workdir_problem(tmp_path)
