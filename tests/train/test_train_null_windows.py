"""Sampling the answer-less training windows (data.null_window_fraction)."""

from __future__ import annotations

import numpy as np
import pytest

from dil_jax.errors import UsageError
from dil_jax.train.data import TrainingFeatures, synthetic_features, windows_from_features
from dil_jax.train.null_windows import sample_null_windows
from dil_jax.train.setup import load_run_models, training_windows
from dil_jax.train.train_config import TrainConfig

from tests.helpers.training import tiny_config


def _windows():
    features = synthetic_features(num_questions=40, windows_per_question=3, question_len=8,
                                  passage_len=16, vocab_size=128, null_fraction=0.5)
    # Mark the last question's windows as distillation-only (-1 / -1 and unlabelled).
    unlabelled = features.example_index == 39
    return windows_from_features(TrainingFeatures(
        **{**features.__dict__,
           "start_positions": np.where(unlabelled, -1, features.start_positions),
           "end_positions": np.where(unlabelled, -1, features.end_positions),
           "is_unlabelled": unlabelled}))


def test_every_answer_window_stays_and_a_share_of_the_null_ones():
    windows = _windows()
    null = (windows.start < 0) & windows.labelled
    n_null, n_answer = int(null.sum()), int((windows.start >= 0).sum())
    assert n_null > 10 and n_answer > 10
    kept = sample_null_windows(windows, 0.25, seed=3)
    # Every row of `kept` is one of the original rows, same ids, labels and question.
    original = {(tuple(p), int(q), int(s), int(e), bool(u))
                for p, q, s, e, u in zip(windows.p_ids, windows.question_index, windows.start,
                                         windows.end, windows.labelled)}
    rows = list(zip(map(tuple, kept.p_ids), kept.question_index.tolist(), kept.start.tolist(),
                    kept.end.tolist(), kept.labelled.tolist()))
    assert all((p, q, s, e, u) in original for p, q, s, e, u in rows)
    assert int((kept.start >= 0).sum()) == n_answer  # all answer windows
    assert int(((kept.start < 0) & kept.labelled).sum()) == round(0.25 * n_null)
    assert int((~kept.labelled).sum()) == int((~windows.labelled).sum())  # distillation-only
    again = sample_null_windows(windows, 0.25, seed=3)
    assert np.array_equal(again.p_ids, kept.p_ids)  # the seed fixes the subset
    assert sample_null_windows(windows, 1.0, seed=3).p_ids.shape == windows.p_ids.shape


def test_the_fraction_is_refused_out_of_range_and_with_shared_normalisation(tmp_path):
    with pytest.raises(UsageError, match="null_window_fraction = 0"):
        sample_null_windows(_windows(), 0.0, seed=0)
    config = tiny_config(tmp_path, {"data.null_window_fraction": 0.5, "loss.shared_norm": True,
                                    "data.windows_per_question": 2})
    settings = TrainConfig.of(config)
    student = load_run_models(settings, evaluate_fn=None).student
    with pytest.raises(UsageError, match="cannot be combined with config.loss.shared_norm"):
        training_windows(settings, student, synthetic_features())
