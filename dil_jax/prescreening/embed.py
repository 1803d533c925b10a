"""Sentence embeddings from a real pretrained sentence encoder (the embedded all-MiniLM-L6-v2).

sentence-transformers' recipe for that model: `[CLS] s [SEP]`, all blocks, mean pooling of the
last hidden states over the real tokens, then L2 normalisation. Here the "all blocks" encoder is
`encode_lower` with k = l on the question segment (token type 0, positions from 0), i.e. exactly
`BertModel`'s last hidden state.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np

from dil_jax.model.delayed import DelayedInteractionModel, Params
from dil_jax.model.span_reader import QUESTION_SEGMENT
from dil_jax.rounding import round_up

if TYPE_CHECKING:
    from dil_jax.readers.protocol import Reader


def mean_pool(states: jax.Array, mask: jax.Array) -> jax.Array:
    """[batch, seq, hidden] states, [batch, seq] mask -> [batch, hidden] L2-normalised means."""
    weights = mask[..., None].astype(states.dtype)
    mean = (states * weights).sum(axis=1) / jnp.maximum(weights.sum(axis=1), 1.0)
    return mean / jnp.maximum(jnp.linalg.norm(mean, axis=-1, keepdims=True), 1e-12)


@functools.partial(jax.jit, static_argnums=0)
def _embed(config, params: Params, ids: jax.Array, mask: jax.Array) -> jax.Array:
    """[batch, seq] ids and mask -> [batch, hidden]; jitted once per (config, shape), so calls
    with a few texts each (one batch of questions at a time) do not compile again."""
    states = DelayedInteractionModel(config).encode_lower(params, ids, mask, QUESTION_SEGMENT)
    return mean_pool(states.astype(jnp.float32), mask)


def sentence_embeddings(encoder: Reader, texts: Sequence[str], *, max_len: int = 64,
                        batch_size: int = 64, bucket: int = 16) -> np.ndarray:
    """[len(texts), hidden] float32 unit vectors of `encoder` (all its blocks, whatever its k).

    Texts longer than max_len tokens are cut (an embedding, not a read). Why sorted by length:
    sentences are short (about 30 tokens in SQuAD) and padding every batch to max_len would
    spend most of the work on padding; batches of similar lengths are padded to their longest,
    rounded up to `bucket` tokens (few shapes, one compilation each).
    """
    config = encoder.config.replace(num_lower_layers=encoder.config.num_layers)
    tokens = encoder.tokenizer(list(texts), truncation=True, max_length=max_len,
                       return_attention_mask=False, return_token_type_ids=False)["input_ids"]
    lengths = np.asarray([len(ids) for ids in tokens], np.int64)
    order = np.argsort(lengths, kind="stable")
    out = np.zeros((len(texts), config.hidden_size), np.float32)
    batch_size = min(batch_size, round_up(max(len(texts), 1), 8))  # a few questions: small batch
    for first in range(0, len(texts), batch_size):
        rows = order[first:first + batch_size]
        width = min(round_up(int(lengths[rows].max()), bucket), max_len)
        ids = np.zeros((batch_size, width), np.int32)
        for slot, row in enumerate(rows):
            ids[slot, :lengths[row]] = tokens[row]
        mask = (np.arange(width)[None] < np.pad(lengths[rows], (0, batch_size - len(rows)))
                [:, None]).astype(np.int32)
        out[rows] = np.asarray(_embed(config, encoder.params, ids, mask))[:len(rows)]
    return out
