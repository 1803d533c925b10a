"""A random-init tiny BERT on synthetic windows: tests and smoke runs, no checkpoint needed.

    dil-jax train --config configs/tiny.py --config.workdir=/tmp/tiny
"""

import ml_collections

from dil_jax.train.default_config import base_config


def get_config() -> ml_collections.ConfigDict:
    c = base_config()
    c.workdir = "runs/tiny"
    c.batch_size = 8
    c.num_train_steps = 40
    c.model.checkpoint = ""
    c.model.encoder = ml_collections.ConfigDict({
        "architecture": "bert", "vocab_size": 128, "hidden_size": 32, "num_layers": 2,
        "num_heads": 2, "intermediate_size": 64, "max_position_embeddings": 64,
        "embedding_size": 32, "hidden_dropout": 0.1, "attention_dropout": 0.1})
    c.model.num_lower_layers = 1
    c.model.max_question_len = 8
    c.optim.learning_rate = 3e-3
    c.optim.warmup_steps = 4
    c.data.featurizer = "dil_jax.train.data:synthetic"
    c.eval.evaluator = ""  # synthetic data has no answer texts: validation loss only
    c.data.max_passage_len = 16
    c.eval.batch_size = 16
    c.checkpoint.every_steps = 10
    c.checkpoint.best_metric = "val_loss"
    c.checkpoint.best_mode = "min"
    c.log.every_steps = 5
    return c
