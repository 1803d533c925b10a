"""tools/export_train_step.py: a QANet run's checkpoint at one step as a reader export.

The reference is the trainer's own in-memory state at the end of a tiny run (the last
checkpoint's step): its weights (with optim.ema_decay, as here, the moving average the optimizer
state holds, not the params: the trainer's export rule) must come back bit for bit from the
export, with the run's config, `--reader`
changes applied; bad requests are refused by name and nothing is written.
"""

from __future__ import annotations

import json
import sys

import jax
import numpy as np
import pytest

from dil_jax.readers import load_reader
from dil_jax.train.loop import train
from dil_jax.train.optim import averaged

from tests.helpers import REPO
from tests.helpers.qanet import pointing_features, trainer_config

sys.path.insert(0, str(REPO / "tools"))
import export_train_step  # tools/ is not a package


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(workdir, final TrainResult): a tiny QANet run of 4 steps, checkpoints at 2 and 4, with a
    moving average of its weights (one run: each costs a compilation)."""
    workdir = tmp_path_factory.mktemp("runs") / "ema"
    config = trainer_config("qanet", workdir, steps=4, **{
        "checkpoint.every_steps": 2, "checkpoint.keep": 3, "optim.ema_decay": 0.9})
    return workdir, train(config, train_features=pointing_features(0, 256),
                          val_features=pointing_features(1, 32))


def test_the_export_holds_the_steps_weights_bit_for_bit(run, tmp_path):
    workdir, result = run
    out = export_train_step.export_step(workdir, tmp_path / "step4", step=4)
    reader = load_reader(out, kind="qanet", with_tokenizer=False)
    state = jax.device_get(result.state)
    average = averaged(state.opt_state)
    jax.tree.map(np.testing.assert_array_equal, reader.params, average)
    # The average is not the params (so the test tells which one was exported).
    assert not np.array_equal(average["params"]["projection"]["kernel"],
                              state.params["params"]["projection"]["kernel"])
    assert reader.config == result.student.config
    record = json.loads((out / "trained_from.json").read_text())
    assert record["step"] == 4 and record["workdir"] == str(workdir.resolve())
    # The run config's windows, which `dil-jax predict` reads with by default.
    run_data = json.loads((workdir / "config.json").read_text())["data"]
    assert record["windows"] == {"max_passage_len": run_data["max_passage_len"],
                                 "doc_stride": run_data["doc_stride"]}
    earlier = load_reader(export_train_step.export_step(workdir, tmp_path / "step2", 2),
                               with_tokenizer=False)
    assert not np.array_equal(earlier.params["params"]["projection"]["kernel"],
                              reader.params["params"]["projection"]["kernel"])


def test_trained_weights_are_the_params_not_the_average(run, tmp_path):
    workdir, result = run
    out = export_train_step.export_step(workdir, tmp_path / "trained", 4, weights="trained")
    reader = load_reader(out, kind="qanet", with_tokenizer=False)
    jax.tree.map(np.testing.assert_array_equal, reader.params,
                 jax.device_get(result.state.params))
    assert json.loads((out / "trained_from.json").read_text())["weights"] == "trained"


def test_trained_weights_of_a_run_without_an_average_are_refused(tmp_path):
    workdir = tmp_path / "plain"
    (workdir).mkdir()
    config = trainer_config("qanet", workdir, steps=2)
    (workdir / "config.json").write_text(config.to_json())
    (workdir / "checkpoints" / "2").mkdir(parents=True)
    (workdir / "checkpoints" / "2" / "commit_success.txt").write_text("")
    with pytest.raises(SystemExit, match="--weights trained: the run .* keeps no moving average"):
        export_train_step.export_step(workdir, tmp_path / "out", 2, weights="trained")
    assert not (tmp_path / "out").exists()


def test_reader_changes_go_into_the_exported_config(run, tmp_path):
    workdir, result = run
    out = export_train_step.export_step(workdir, tmp_path / "scaled", 4, {"word_scale": "18"})
    reader = load_reader(out, with_tokenizer=False)
    assert reader.config == result.student.config.replace(word_scale=18)


@pytest.mark.parametrize("step, changes, out_exists, named", [
    (3, {}, False, "--step 3: not a finished checkpoint"),
    (4, {}, True, "exists; name a new folder"),
    (4, {"no_such_field": "1"}, False, "no_such_field"),
])
def test_bad_requests_are_refused_by_name(run, tmp_path, step, changes, out_exists, named):
    workdir, _ = run
    out = tmp_path / "export"
    if out_exists:
        out.mkdir()
        (out / "keep.txt").write_text("mine")
    with pytest.raises(SystemExit, match=named):
        export_train_step.export_step(workdir, out, step, changes)
    if out_exists:
        assert (out / "keep.txt").read_text() == "mine" and len(list(out.iterdir())) == 1
    else:
        assert not out.exists() and not (tmp_path / "export.new").exists()
