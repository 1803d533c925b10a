"""A trained QANet / BiDAF read or trained further with other run settings.

- `Reader.with_config` on a QANet: LSH attention in both encoders, with one chunk holding every
  token (bucket_size >= the segment), is exactly full attention (`model/lsh.py`, rule 3): the
  same params give the plain reader's logits up to float32 summation order;
- a field the params depend on (word_scale, d_model) is refused by name, with both values;
- the trainer's warm start (config.model.checkpoint = an export, config.model.reader another
  run setting): the student reads with the new setting and starts from the export's params to
  the bit; a changed word_scale is refused by its config key before any step.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from dil_jax.checkpoints.char_readers import save_char_reader
from dil_jax.errors import UsageError
from dil_jax.model.encoder_config import ConfigError
from dil_jax.readers import load_reader
from dil_jax.train.char_data import char_windows
from dil_jax.train.setup import load_run_models
from dil_jax.train.train_config import TrainConfig

from tests.helpers.qanet import pointing_features, trainer_config


@pytest.fixture(scope="module")
def tiny_export(tmp_path_factory):
    """{"qanet": folder, "bidaf": folder}: freshly initialised tiny readers (configs/tiny.py)
    saved as the trainer exports them."""
    root = tmp_path_factory.mktemp("exports")
    folders = {}
    for kind in ("qanet", "bidaf"):
        config = TrainConfig.of(trainer_config(kind, root / f"run_{kind}", steps=1))
        student = load_run_models(config, None).student
        folders[kind] = save_char_reader(root / kind, student.params, student.config)
    return folders


def _start_logits(reader, batch) -> np.ndarray:
    return np.asarray(reader.outputs(reader.params, batch).start_logits)


def test_lsh_with_one_chunk_reads_a_trained_qanet_as_full_attention(tiny_export):
    reader = load_reader(tiny_export["qanet"], with_tokenizer=False)
    batch = char_windows(pointing_features(1, 8)).batch(np.arange(8))  # 16 passage tokens
    lsh = reader.with_config(lsh_encoders=("embedding", "model"), lsh_bucket_size=64)
    assert lsh.config.lsh_encoders == ("embedding", "model") and lsh.params is reader.params
    plain, approximated = _start_logits(reader, batch), _start_logits(lsh, batch)
    real = batch["p_mask"].astype(bool)
    # Logits are O(1-10); another summation order of d_model-wide float32 sums through ~20
    # sublayers moves them by a few ulps each: 1e-4 absolute is ~100x that, far below the
    # differences another attention pattern makes (a different key set changes them by O(0.1)).
    np.testing.assert_allclose(approximated[real], plain[real], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kind, change, value", [
    ("qanet", "word_scale", 18.0), ("qanet", "d_model", 16), ("bidaf", "word_scale", 18.0),
    ("bidaf", "hidden", 7)])
def test_a_field_the_params_depend_on_is_refused_by_name(tiny_export, kind, change, value):
    reader = load_reader(tiny_export[kind], with_tokenizer=False)
    with pytest.raises(ConfigError, match=rf"{change} = {value!r} \(trained with "
                                          rf"{getattr(reader.config, change)!r}\)"):
        reader.with_config(**{change: value})


def test_an_unknown_field_is_named_as_unknown(tiny_export):
    reader = load_reader(tiny_export["qanet"], with_tokenizer=False)
    with pytest.raises(ConfigError, match=r"unknown QANetConfig field\(s\) \['lsh_layers'\]"):
        reader.with_config(lsh_layers=(0,))


def test_the_trainer_warm_starts_a_trained_qanet_with_lsh_attention(tiny_export, tmp_path):
    config = trainer_config("qanet", tmp_path / "run", steps=1,
                            **{"model.checkpoint": str(tiny_export["qanet"]),
                               "model.reader.lsh_encoders": "embedding,model",
                               "model.reader.dropout": 0.2})
    student = load_run_models(TrainConfig.of(config), None).student
    trained = load_reader(tiny_export["qanet"], with_tokenizer=False)
    assert student.config == trained.config.replace(lsh_encoders=("embedding", "model"),
                                                    dropout=0.2)
    jax.tree.map(np.testing.assert_array_equal, student.params, trained.params)


@pytest.mark.parametrize("kind", ["qanet", "bidaf"])
def test_the_trainer_refuses_a_warm_start_that_changes_the_params_meaning(
        tiny_export, tmp_path, kind):
    config = trainer_config(kind, tmp_path / "run", steps=1,
                            **{"model.checkpoint": str(tiny_export[kind]),
                               "model.reader.word_scale": 18.0})
    with pytest.raises(UsageError, match=r"config.model.reader against config.model.checkpoint"
                                         r" = .*word_scale = 18.0 \(trained with 1.0\)"):
        load_run_models(TrainConfig.of(config), None)
