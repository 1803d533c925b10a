"""BiDAF through the project's trainer (`dil-jax train`, config.model.kind = "bidaf"): a tiny
BiDAF learns the pointing task of tests/test_qanet_trainer.py (chance and the assertions:
`qanet_helpers.learnt_pointing`), and its export reads back as a BiDAF (the manifest's kind)."""

from __future__ import annotations

import pytest

from dil_jax.checkpoints.char_readers import load_char_reader
from dil_jax.errors import CheckpointError
from dil_jax.model.bidaf import BiDAFConfig
from dil_jax.train.loop import train

from qanet_helpers import learnt_pointing, pointing_features, trainer_config


def test_tiny_bidaf_learns_through_the_trainer(tmp_path):
    # 200 steps at lr 1e-2 (measured on this task: val loss 0.18, accuracy 0.96).
    config = trainer_config("bidaf", tmp_path / "run", steps=200)
    validation = pointing_features(1, 256)
    result = train(config, train_features=pointing_features(0, 4096), val_features=validation)
    assert isinstance(result.model.config, BiDAFConfig)
    learnt_pointing(tmp_path / "run", validation)
    model, _ = load_char_reader(tmp_path / "run" / "params", kind="bidaf")
    assert model.config == result.model.config
    with pytest.raises(CheckpointError, match="a bidaf reader, not a qanet one"):
        load_char_reader(tmp_path / "run" / "params", kind="qanet")
