"""The training loop: resume after interruption, checkpoint retention, metrics, data order."""

import json

import numpy as np
import pytest

from dil_jax.train import data as data_lib
from dil_jax.train.checkpointing import TrainCheckpointer
from dil_jax.train.loop import train

from tests.helpers.training import (
    BEST_BY_F1,
    STEPS,
    flat_params,
    max_abs_diff,
    scripted_f1,
    tiny_config,
)

# Every run here has num_train_steps STEPS (10; tests/helpers/training.py says why); shorter
# runs stop with `stop_after_step`.


def test_interrupted_run_resumes_to_the_same_params(tmp_path):
    overrides = {"num_train_steps": STEPS, "checkpoint.every_steps": 4}
    straight = train(tiny_config(tmp_path / "straight", overrides))
    # Stop after step 6: the latest checkpoint is step 4, so steps 5-6 are redone on resume,
    # from the restored data position and dropout key.
    interrupted = tiny_config(tmp_path / "interrupted", overrides)
    first = train(interrupted, stop_after_step=6)
    assert int(first.state.step) == 6
    assert TrainCheckpointer(tmp_path / "interrupted" / "checkpoints",
                             every_steps=4).latest_step() == 4
    resumed = train(interrupted)
    assert int(resumed.state.step) == STEPS
    assert max_abs_diff(flat_params(straight.state.params),
                        flat_params(resumed.state.params)) < 1e-6
    meta = json.loads((tmp_path / "interrupted" / "checkpoints" / "8" / "meta" /
                       "metadata").read_text())
    # 128 windows / batch 8 = 16 steps per epoch.
    assert (meta["step"], meta["epoch"], meta["position_in_epoch"], meta["data_seed"]) == (
        8, 0, 8, 0)
    assert len(meta["rng_key"]) == 2


def test_checkpoints_keep_last_k_plus_best_metrics_and_export(tmp_path):
    result = train(tiny_config(tmp_path, {"num_train_steps": STEPS, "checkpoint.every_steps": 2,
                                          "checkpoint.keep": 2, "log.tensorboard": "true"}))
    steps = TrainCheckpointer(tmp_path / "checkpoints", every_steps=2,
                              best_metric="val_loss", best_mode="min").all_steps()
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    evals = {line["step"]: line["val_loss"] for line in lines if line["split"] == "eval"}
    best = min(evals, key=evals.get)
    assert result.best_step == best
    assert sorted(steps) == sorted({STEPS - 2, STEPS, best})
    assert any(line["split"] == "train" and "examples_per_sec" in line for line in lines)
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    trained_from = json.loads((tmp_path / "params" / "trained_from.json").read_text())
    assert trained_from["step"] == best
    from dil_jax.checkpoints import load_params

    config, params = load_params(tmp_path / "params")
    assert config.num_lower_layers == 1 and config.hidden_size == 32
    assert len(flat_params(params)) == len(flat_params(result.state.params))


def test_resume_ignores_a_half_written_step_and_refuses_another_data_order(tmp_path):
    overrides = {"num_train_steps": STEPS, "checkpoint.every_steps": 2}
    train(tiny_config(tmp_path, overrides), stop_after_step=2)
    # What a save killed mid-write leaves: orbax's temporary folder, never renamed to "4".
    partial = tmp_path / "checkpoints" / "4.orbax-checkpoint-tmp" / "state"
    partial.mkdir(parents=True)
    (partial / "garbage").write_bytes(b"\0" * 10)
    checkpointer = TrainCheckpointer(tmp_path / "checkpoints", every_steps=2)
    assert checkpointer.latest_step() == 2 and checkpointer.all_steps() == [2]
    # Resuming restores step 2 and writes step 4 over the leftover.
    assert int(train(tiny_config(tmp_path, overrides), stop_after_step=4).state.step) == 4
    assert checkpointer.latest_step() is not None
    assert TrainCheckpointer(tmp_path / "checkpoints", every_steps=2).all_steps() == [2, 4]
    with pytest.raises(ValueError, match="data order"):
        train(tiny_config(tmp_path, {**overrides, "data_seed": 5}))


def test_data_order_is_a_function_of_seed_and_step():
    n, batch = 10, 4
    per_epoch = data_lib.steps_per_epoch(n, batch)
    assert per_epoch == 2
    epoch0 = np.concatenate([data_lib.global_batch_rows(s, n, batch, 3) for s in range(2)])
    assert len(set(epoch0.tolist())) == 8  # no window twice in an epoch
    again = data_lib.global_batch_rows(1, n, batch, 3)
    assert np.array_equal(again, epoch0[4:])
    assert not np.array_equal(data_lib.global_batch_rows(2, n, batch, 3), epoch0[:4])
    assert data_lib.data_position(5, per_epoch) == (2, 1)


def test_features_are_validated():
    features = data_lib.synthetic_features(num_questions=2, question_len=8, passage_len=16)
    features.start_positions[0] = 99
    with pytest.raises(ValueError, match="inside the window"):
        data_lib.windows_from_features(features)


def test_early_stopping_stops_after_patience_and_exports_the_best(tmp_path):
    # F1 by evaluation (one per step): best at step 2, then 2 evaluations without a new best.
    evaluate_fn, f1_by_call = scripted_f1(10.0, 20.0, 15.0, 12.0, 30.0, 40.0)
    overrides = {"num_train_steps": STEPS, "checkpoint.every_steps": 1, "eval.patience": 2,
                 **BEST_BY_F1}
    result = train(tiny_config(tmp_path, overrides), evaluate_fn=evaluate_fn)
    assert result.stopped_early and int(result.state.step) == 4 and result.best_step == 2
    assert json.loads((tmp_path / "params" / "trained_from.json").read_text())["step"] == 2
    # A rerun continues nothing: the checkpoints say the run stopped.
    again = train(tiny_config(tmp_path, overrides), evaluate_fn=evaluate_fn)
    assert again.stopped_early and int(again.state.step) == 4
    assert next(f1_by_call) == 30.0  # no evaluation ran


def test_early_stopping_needs_a_metric(tmp_path):
    from dil_jax.errors import UsageError

    with pytest.raises(UsageError, match="eval.patience = 2 needs a metric"):
        train(tiny_config(tmp_path, {"eval.patience": 2, "checkpoint.best_metric": ""}))


def test_lengths_past_the_position_table_are_refused_before_training(tmp_path):
    from dil_jax.model.delayed import InputError

    # The tiny model has 64 positions: passages of 16 from position 60 do not fit.
    with pytest.raises(InputError, match="offset 60: .*config.data.max_passage_len"):
        train(tiny_config(tmp_path, {"model.passage_position_offset": 60}))
    assert not (tmp_path / "checkpoints").exists()


def test_evaluations_every_few_checkpoints_and_best_only_among_them(tmp_path):
    # Checkpoints every 2 steps, evaluations every 4 (and at the end): evaluations at steps 4, 8
    # and 10 only; the best is chosen among them, and the checkpoints between serve resuming.
    f1_by_call = iter([30.0, 20.0, 10.0])
    evaluated_at = []

    def evaluate_fn(params):
        evaluated_at.append(len(evaluated_at))
        return {"exact": 0.0, "f1": next(f1_by_call)}

    overrides = {"num_train_steps": STEPS, "checkpoint.every_steps": 2, "eval.every_steps": 4,
                 "checkpoint.keep": 1, **BEST_BY_F1}
    result = train(tiny_config(tmp_path, overrides), evaluate_fn=evaluate_fn)
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines if line["split"] == "eval"] == [4, 8, STEPS]
    assert result.best_step == 4
    steps = TrainCheckpointer(tmp_path / "checkpoints", every_steps=2, keep=1).all_steps()
    assert sorted(steps) == [4, STEPS]  # the best and the last


def test_evaluations_must_fall_on_checkpoints(tmp_path):
    from dil_jax.errors import UsageError

    with pytest.raises(UsageError, match="eval.every_steps = 3 is not a multiple of "
                                         "config.checkpoint.every_steps = 2"):
        train(tiny_config(tmp_path, {"checkpoint.every_steps": 2, "eval.every_steps": 3}))
