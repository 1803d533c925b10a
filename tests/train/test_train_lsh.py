"""Training with Reformer LSH attention in chosen blocks (`config.model.lsh_attention_layers`):
the student that trains, and the reader it exports, use LSH there; the k = 0 teacher never
does; bad specs are refused by name."""

import numpy as np
import pytest

from dil_jax.checkpoints import load_params
from dil_jax.errors import DilJaxError, UsageError
from dil_jax.model.delayed import DelayedInteractionModel
from dil_jax.train.config_rules import validate_config
from dil_jax.train.loop import train
from dil_jax.train.setup import load_run_models
from dil_jax.train.train_config import TrainConfig

from tests.helpers.training import tiny_config

# Passage windows of 16 tokens in chunks of 4: LSH attends within a chunk and the one before,
# so it cannot equal full attention (the check below that it is really in use).
LSH = {"model.lsh_attention_layers": "lower", "model.lsh_num_hashes": 2, "model.lsh_bucket_size": 4,
       "loss.kd_weight": 1.0, "loss.lrs_weight": 1.0, "teacher.checkpoint": "student_init"}


def test_lower_blocks_train_and_export_with_lsh(tmp_path):
    config = tiny_config(tmp_path / "run", {**LSH, "num_train_steps": 2})
    models = load_run_models(TrainConfig.of(config), evaluate_fn=None)
    assert models.student.config.lsh_attention_layers == (0,)  # k = 1: block 0
    assert (models.student.config.lsh_num_hashes, models.student.config.lsh_bucket_size) == (2, 4)
    assert models.teacher.config.lsh_attention_layers == ()

    # The student's forward is not full attention's on the same params (16 > 2 x 4 tokens).
    # Near-uniform attention at random init keeps the gap small (~5e-4 on logits of ~0.1);
    # float32 rounding of two width-32 blocks is ~1e-6 there, so 1e-4 separates the two.
    full_attention = DelayedInteractionModel(models.student.config.replace(
        lsh_attention_layers=()))
    rng = np.random.default_rng(0)
    question = rng.integers(1, 128, size=(2, 8)).astype(np.int32)
    passage = rng.integers(1, 128, size=(2, 16)).astype(np.int32)
    masks = np.ones_like(question), np.ones_like(passage)
    with_lsh = models.student.model(models.student.params, question, masks[0], passage, masks[1])
    without = full_attention(models.student.params, question, masks[0], passage, masks[1])
    assert float(np.max(np.abs(np.asarray(with_lsh.start_logits)
                               - np.asarray(without.start_logits)))) > 1e-4

    train(config)
    exported_config, _ = load_params(tmp_path / "run" / "params")
    assert exported_config.lsh_attention_layers == (0,)
    assert (exported_config.lsh_num_hashes, exported_config.lsh_bucket_size) == (2, 4)


@pytest.mark.parametrize("overrides,message", [
    ({"model.lsh_attention_layers": "lower", "model.num_lower_layers": 0}, "no lower blocks"),
    ({"model.lsh_attention_layers": "0,7"}, "7"),
])
def test_bad_lsh_layers_are_refused_by_name(tmp_path, overrides, message):
    with pytest.raises(DilJaxError, match=message):
        load_run_models(TrainConfig.of(tiny_config(tmp_path / "run", overrides)), evaluate_fn=None)


def test_lsh_layers_must_be_a_layer_list():
    with pytest.raises(UsageError, match="model.lsh_attention_layers"):
        validate_config(tiny_config("unused", {"model.lsh_attention_layers": "upper"}))
