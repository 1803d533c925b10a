"""Warm start: a delayed student initialised from a fine-tuned full reader's exported params
(`model.checkpoint = FULL_RUN/params`), distilled from that same reader as teacher."""

import numpy as np

from dil_jax.train.loop import train
from dil_jax.train.setup import load_run_models
from dil_jax.train.train_config import TrainConfig

from tests.helpers.training import flat_params, tiny_config


def test_student_starts_from_the_teachers_fine_tuned_weights(tmp_path):
    # The "fine-tuned full reader": 3 steps of the tiny model at k = 0, exported to params/.
    full = train(tiny_config(tmp_path / "full", {"num_train_steps": 3,
                                                 "model.num_lower_layers": 0}))
    exported = tmp_path / "full" / "params"
    teacher_weights = flat_params(full.state.params)
    student_config = tiny_config(tmp_path / "student", {
        "model.checkpoint": str(exported),
        "model.num_lower_layers": 1, "teacher.checkpoint": str(exported),
        "loss.kd_weight": 1.0, "loss.lrs_weight": 1.0, "log.every_steps": 1})
    models = load_run_models(TrainConfig.of(student_config), evaluate_fn=None)
    assert models.student.config.num_lower_layers == 1
    assert models.teacher.config.num_lower_layers == 0
    student_weights = flat_params(models.student.params)
    # Every weight of the student, QA head included, is the teacher's: nothing re-initialised.
    assert student_weights.keys() == teacher_weights.keys()
    for name, value in teacher_weights.items():
        np.testing.assert_array_equal(student_weights[name], value, err_msg=name)
        np.testing.assert_array_equal(flat_params(models.teacher.params)[name], value,
                                      err_msg=name)
    # ... and it trains from there with KD + LRS from the same teacher.
    result = train(student_config, stop_after_step=2)
    assert int(result.state.step) == 2
    assert result.last_metrics["kd"] > 0 and result.last_metrics["lrs"] > 0
