"""teacher.logits_file: the teacher's span scores computed once equal the live teacher's, KD
from them equals KD beside the live teacher, the file is reused only for the same teacher and
windows, and the configs it cannot serve are refused by key.

Tolerances: the stored scores come from the same jitted teacher over other batch compositions
(batches of 3 and a padded last batch here, the step's micro-batch of 8 beside it), so they may
differ from the in-step teacher's by float32 rounding of the matmul sums: a few ulps of logits of
size ~1 (2 blocks of width 32), far below 1e-5. A wrong row order, a missing window, padding
scores leaking into real ones or the wrong teacher differ by tenths.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from dil_jax.errors import UsageError
from dil_jax.train import losses
from dil_jax.train import teacher_logits as tl
from dil_jax.train.config_rules import validate_config
from dil_jax.train.loop import train
from dil_jax.train.setup import load_run_data, load_run_models
from dil_jax.train.step import compute_losses
from dil_jax.train.train_config import TrainConfig

from tests.helpers.training import tiny_config

TOL = 1e-5
KD_ONLY = {"teacher.checkpoint": "student_init", "loss.kd_weight": 1.0, "loss.lrs_weight": 0.0,
           "log.every_steps": 1}


def _run(tmp_path, overrides=None):
    config = TrainConfig.of(tiny_config(tmp_path / "run", {**KD_ONLY, **(overrides or {})}))
    models = load_run_models(config, evaluate_fn=None)
    data = load_run_data(config, models.student, 1, None, None)
    return config, models, data


def test_stored_scores_equal_the_live_teachers(tmp_path):
    _, models, data = _run(tmp_path)
    teacher, windows = models.teacher, data.train
    q_ids, q_mask = windows.q_ids[windows.question_index], windows.q_mask[windows.question_index]
    stored = tl.compute_teacher_logits(teacher, q_ids, q_mask, windows.p_ids, windows.p_mask,
                                       batch_size=3, fingerprint="f")
    live = teacher.model(teacher.params, q_ids, q_mask, windows.p_ids, windows.p_mask,
                         deterministic=True)
    assert len(windows) % 3  # the last batch is padded
    for got, want in ((stored.start, live.start_logits), (stored.end, live.end_logits),
                      (stored.null_start, live.null_start_logits),
                      (stored.null_end, live.null_end_logits)):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, np.asarray(want), rtol=TOL, atol=TOL)


def test_kd_from_stored_scores_equals_kd_beside_the_teacher(tmp_path):
    _, models, data = _run(tmp_path)
    teacher = models.teacher
    windows = data.train
    q_ids, q_mask = windows.q_ids[windows.question_index], windows.q_mask[windows.question_index]
    stored = tl.compute_teacher_logits(teacher, q_ids, q_mask, windows.p_ids, windows.p_mask,
                                       batch_size=5, fingerprint="f")
    rows = np.array([3, 0, 7, 7, 1, 2, 9, 4])
    valid = np.array([1, 1, 1, 0, 1, 1, 1, 1], bool)  # one padding window, as in a group
    live_batch = windows.batch(rows, valid)
    stored_batch = dataclasses.replace(windows, teacher_logits=stored).batch(rows, valid)
    assert set(stored_batch) - set(live_batch) == set(tl.BATCH_KEYS)
    weights = losses.LossWeights(ce=1.0, kd=1.0, lrs=0.0, temperature=2.0)
    # A student that is not its teacher's copy (student_init: the same weights read at k = 1),
    # so that KD is far from 0 and its rounding small against it.
    leaves, tree = jax.tree.flatten(models.student.params)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    student = models.student.with_params(jax.tree.unflatten(tree, [
        leaf + 0.1 * jax.random.normal(key, leaf.shape) for leaf, key in zip(leaves, keys)]))

    def loss_and_grads(batch, with_teacher):
        fn = lambda p: compute_losses(student, teacher.model if with_teacher else None,  # noqa: E731
                                      weights, p, teacher.params, batch, None,
                                      deterministic=True)
        (_, metrics), grads = jax.value_and_grad(fn, has_aux=True)(student.params)
        return metrics, grads

    live_metrics, live_grads = loss_and_grads(live_batch, True)
    stored_metrics, stored_grads = loss_and_grads(stored_batch, False)
    assert float(live_metrics["kd"]) > 0.05
    np.testing.assert_allclose(float(stored_metrics["kd"]), float(live_metrics["kd"]),
                               rtol=TOL)
    for got, want in zip(jax.tree.leaves(stored_grads), jax.tree.leaves(live_grads)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=TOL)


def test_training_from_the_file_matches_training_beside_the_teacher(tmp_path):
    path = tmp_path / "teacher.npz"
    steps = {"num_train_steps": 3}
    live = train(tiny_config(tmp_path / "live", {**KD_ONLY, **steps}))
    first = train(tiny_config(tmp_path / "stored", {**KD_ONLY, **steps,
                                                    "teacher.logits_file": str(path)}))
    assert path.is_file()
    for key in ("kd", "ce", "loss"):
        np.testing.assert_allclose(first.last_metrics[key], live.last_metrics[key], rtol=1e-4)



def test_a_matching_file_is_read_not_recomputed(tmp_path, monkeypatch):
    config, models, data = _run(tmp_path, {"teacher.logits_file": str(tmp_path / "t.npz")})
    first = tl.teacher_logits_for(config, models.teacher, data.train)

    def no_recompute(*args, **kwargs):
        raise AssertionError("the stored scores were computed again")

    monkeypatch.setattr(tl, "compute_teacher_logits", no_recompute)
    again = tl.teacher_logits_for(config, models.teacher, data.train)
    assert again.fingerprint == first.fingerprint
    np.testing.assert_array_equal(again.start, first.start)


def test_another_teacher_replaces_a_stale_file(tmp_path):
    config, models, data = _run(tmp_path, {"teacher.logits_file": str(tmp_path / "t.npz")})
    first = tl.teacher_logits_for(config, models.teacher, data.train)
    other = models.teacher.with_params(jax.tree.map(lambda x: x * 1.01, models.teacher.params))
    second = tl.teacher_logits_for(config, other, data.train)
    assert second.fingerprint != first.fingerprint
    assert tl.load_teacher_logits(tmp_path / "t.npz").fingerprint == second.fingerprint
    assert not np.allclose(second.start, first.start)


def test_a_file_it_did_not_write_is_refused_and_kept(tmp_path):
    path = tmp_path / "t.npz"
    config, models, data = _run(tmp_path, {"teacher.logits_file": str(path)})
    for content in (b"not an npz", None):
        if content is None:  # a readable npz without the format mark: someone's data
            np.savez(path, start=np.zeros(3))
        else:
            path.write_bytes(content)
        before = path.read_bytes()
        with pytest.raises(UsageError, match="config.teacher.logits_file .* not replaced"):
            tl.teacher_logits_for(config, models.teacher, data.train)
        assert path.read_bytes() == before


@pytest.mark.parametrize("overrides, message", [
    ({"loss.lrs_weight": 1.0}, "LRS needs its hidden states"),
    ({"loss.kd_weight": 0.0, "loss.ce_weight": 1.0}, "only read for KD"),
    ({"teacher.checkpoint": ""}, "needs config.teacher.checkpoint"),
])
def test_configs_it_cannot_serve_are_refused(tmp_path, overrides, message):
    config = tiny_config(tmp_path, {**KD_ONLY, "teacher.logits_file": str(tmp_path / "t.npz"),
                                    **overrides})
    with pytest.raises(UsageError, match=message):
        validate_config(config)
