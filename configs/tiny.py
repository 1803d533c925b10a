"""A random-init tiny BERT on synthetic windows: tests and smoke runs, no checkpoint needed.

    dil-jax train --config configs/tiny.py --config.workdir=/tmp/tiny
    dil-jax train --config configs/tiny.py:qanet --config.workdir=/tmp/tiny_qanet   # or :bidaf

`:qanet` / `:bidaf`: a tiny QANet / BiDAF (random frozen word table, characters spelling each
synthetic token's id: dil_jax.train.char_data:synthetic) on the same windows; only the windows
that hold their answer train (these readers have no no-answer score).
"""

import ml_collections

from dil_jax.train.default_config import base_config
from dil_jax.train.reader_kinds import reader_section

# Every stage of each reader present, each small (one model block: half QANet's compile time);
# the other fields (config.model.reader has every one: `reader_section`) keep their defaults.
TINY_READERS = {
    "qanet": {"vocab_size": 128, "word_dim": 12, "max_chars": 4, "char_dim": 8,
              "char_filters": 10, "char_kernel": 3, "d_model": 16, "num_heads": 2, "ffn_dim": 20,
              "embedding_convs": 2, "embedding_kernel": 5, "model_blocks": 1, "model_convs": 2,
              "model_kernel": 3, "dropout": 0.05, "char_dropout": 0.05, "word_dropout": 0.05},
    "bidaf": {"vocab_size": 128, "word_dim": 12, "max_chars": 4, "char_dim": 8,
              "char_filters": 10, "char_kernel": 3, "hidden": 16, "dropout": 0.05,
              "char_dropout": 0.05},
}


def get_config(kind: str = "encoder") -> ml_collections.ConfigDict:
    if kind not in ("encoder", *TINY_READERS):
        raise ValueError(f"configs/tiny.py: unknown kind {kind!r} (encoder, qanet, bidaf)")
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
    c.data.doc_stride = 8  # a window every 8 tokens, as any reader of these lengths would read
    c.eval.batch_size = 16
    c.checkpoint.every_steps = 10
    c.checkpoint.best_metric = "val_loss"
    c.checkpoint.best_mode = "min"
    c.log.every_steps = 5
    if kind in TINY_READERS:
        c.model.kind = kind
        c.model.encoder = None
        c.model.num_lower_layers = 0
        c.model.reader = reader_section(kind, TINY_READERS[kind])
        c.model.word_table = "random"
        c.data.featurizer = "dil_jax.train.char_data:synthetic"
    return c
