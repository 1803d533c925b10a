"""BiDAF through the project's trainer (`dil-jax train`, config.model.kind = "bidaf"): a tiny
BiDAF learns the pointing task of tests/train/test_qanet_trainer.py (chance and the assertions:
`tests.helpers.qanet.learnt_pointing`), and its export reads back as a BiDAF (the manifest's
kind)."""

from __future__ import annotations

import pytest

from dil_jax.errors import CheckpointError
from dil_jax.model.bidaf_config import BiDAFConfig
from dil_jax.readers import load_reader
from dil_jax.train.loop import train

from tests.helpers.qanet import learnt_pointing, pointing_features, trainer_config


def test_tiny_bidaf_learns_through_the_trainer(tmp_path):
    # 200 steps at lr 1e-2 (measured on this task: val loss 0.18, accuracy 0.96).
    config = trainer_config("bidaf", tmp_path / "run", steps=200)
    validation = pointing_features(1, 256)
    result = train(config, train_features=pointing_features(0, 4096), val_features=validation)
    assert isinstance(result.student.config, BiDAFConfig)
    learnt_pointing(tmp_path / "run", validation)
    reader = load_reader(tmp_path / "run" / "params", kind="bidaf", with_tokenizer=False)
    assert reader.model.config == result.student.config
    with pytest.raises(CheckpointError, match="a bidaf reader, not a qanet one"):
        load_reader(tmp_path / "run" / "params", kind="qanet")


# Slow (not in CI): resuming is the trainer's, the same for every reader family; CI resumes
# runs to the same params in tests/train/test_train_loop.py and on whole groups in
# tests/train/test_train_distractors.py.
@pytest.mark.slow
def test_a_resumed_bidaf_run_equals_the_uninterrupted_one(tmp_path):
    # The batch of a step and its dropout keys are pure functions of (seed, step), and the
    # checkpoint holds the whole train state (the frozen table and the optimizer's state of
    # the trained collection): a run stopped after step 3 and resumed ends where one run of 6
    # steps ends, to the bit (the same programs on the same device).
    import jax
    import numpy as np

    features, validation = pointing_features(0, 256), pointing_features(1, 32)
    stopped = trainer_config("bidaf", tmp_path / "a", steps=6, **{"checkpoint.every_steps": 3})
    assert int(train(stopped, train_features=features, val_features=validation,
                     stop_after_step=3).state.step) == 3
    resumed = train(stopped, train_features=features, val_features=validation)
    straight = train(trainer_config("bidaf", tmp_path / "b", steps=6,
                                    **{"checkpoint.every_steps": 3}),
                     train_features=features, val_features=validation)
    assert int(resumed.state.step) == 6
    for a, b in zip(jax.tree.leaves(resumed.state.params), jax.tree.leaves(straight.state.params),
                    strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
