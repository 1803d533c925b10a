"""QANet's and BiDAF's word table: frozen (the default) or trained, and where it lives.

Both readers look words up in a [vocab_size, word_dim] table: by default the embedded MiniLM's
pre-trained WordPiece table, FROZEN, in its own variable collection (`{"params": trainable,
"frozen": {"word_table"}}`: no update, no weight decay, no Adam moments; the lookup stops its
gradient). With the config's `train_word_table` it is an ordinary trained parameter instead
(`params/word_table`, no "frozen" collection): how "word embeddings trained from scratch" (a
random table, `config.model.word_table = "random"`) or fine-tuned ones are trained and compared.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from dil_jax.model.delayed import InputError

FROZEN_COLLECTION = "frozen"
WORD_TABLE = "word_table"
# The standard deviation of a random word table (`init` without a table: tests and runs from
# scratch); the projection after it is learnt, so the scale only sets its start.
RANDOM_TABLE_STD = 1.0

Variables = dict[str, Any]  # {"params": ..., "frozen": {"word_table": ...}} (frozen table)


def collection(config: Any) -> str:
    """The variable collection the table lives in: "params" when trained, else "frozen"."""
    return "params" if config.train_word_table else FROZEN_COLLECTION


def declare(module: nn.Module, config: Any) -> nn.Variable:
    """The table variable of `module` (inside its setup), random rows when initialised."""
    return module.variable(
        collection(config), WORD_TABLE,
        lambda: RANDOM_TABLE_STD * jax.random.normal(
            module.make_rng("params"), (config.vocab_size, config.word_dim), jnp.float32))


def look_up(table: nn.Variable, ids: jax.Array, config: Any) -> jax.Array:
    """ids [batch, seq] -> word vectors [batch, seq, word_dim], times config.word_scale; no
    gradient into a frozen table."""
    words = jnp.take(table.value, ids, axis=0)
    if not config.train_word_table:
        words = jax.lax.stop_gradient(words)
    # A scale of 1 adds no op: the programs (and results) of readers without one stay as they were.
    return words if config.word_scale == 1.0 else words * config.word_scale


def with_table(variables: Variables, word_table: Any, config: Any) -> Variables:
    """`module.init`'s variables with `word_table` ([vocab_size, word_dim]; None: keep the
    random rows) in its collection; a frozen table's collection is always present."""
    out = {name: dict(values) for name, values in variables.items()}
    if not config.train_word_table:
        out.setdefault(FROZEN_COLLECTION, {})
    if word_table is not None:
        table = jnp.asarray(word_table, jnp.float32)
        if table.shape != (config.vocab_size, config.word_dim):
            raise InputError(f"word_table shape {tuple(table.shape)} does not fit the config: "
                             f"want ({config.vocab_size}, {config.word_dim}) (vocab_size, "
                             "word_dim)")
        out[collection(config)][WORD_TABLE] = table
    return out
