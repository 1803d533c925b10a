"""Sentence embeddings from a real pretrained sentence encoder (the embedded all-MiniLM-L6-v2).

sentence-transformers' recipe for that model: `[CLS] s [SEP]`, all blocks, mean pooling of the
last hidden states over the real tokens, then L2 normalisation. Here the "all blocks" encoder is
`encode_lower` with k = l on the question segment (token type 0, positions from 0), i.e. exactly
`BertModel`'s last hidden state.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from dil_jax.model import DelayedInteractionModel, Params
from dil_jax.modeling import QUESTION_SEGMENT
from dil_jax.tokenization import Segments


def mean_pool(states: jax.Array, mask: jax.Array) -> jax.Array:
    """[batch, seq, hidden] states, [batch, seq] mask -> [batch, hidden] L2-normalised means."""
    weights = mask[..., None].astype(states.dtype)
    mean = (states * weights).sum(axis=1) / jnp.maximum(weights.sum(axis=1), 1.0)
    return mean / jnp.maximum(jnp.linalg.norm(mean, axis=-1, keepdims=True), 1e-12)


def encode_texts(tokenizer, texts: Sequence[str], max_len: int) -> Segments:
    """`[CLS] text [SEP]` segments (long texts cut, silently: this is an embedding, not a read)."""
    encoded = tokenizer(list(texts), truncation=True, max_length=max_len, padding="max_length",
                        return_attention_mask=True, return_token_type_ids=False)
    ids = np.asarray(encoded["input_ids"], np.int32)
    mask = np.asarray(encoded["attention_mask"], np.int32)
    return Segments(ids, mask, np.full(ids.shape + (2,), -1, np.int32))


def sentence_embeddings(model: DelayedInteractionModel, params: Params, tokenizer,
                        texts: Sequence[str], *, max_len: int = 64,
                        batch_size: int = 64) -> np.ndarray:
    """[len(texts), hidden] float32 unit vectors."""
    if model.config.num_lower_layers != model.config.num_layers:
        model = DelayedInteractionModel(
            model.config.replace(num_lower_layers=model.config.num_layers))

    @jax.jit
    def embed(ids, mask):
        states = model.encode_lower(params, ids, mask, QUESTION_SEGMENT)
        return mean_pool(states.astype(jnp.float32), mask)

    segments = encode_texts(tokenizer, texts, max_len)
    n = len(texts)
    padded = -(-max(n, 1) // batch_size) * batch_size
    ids = np.pad(segments.ids, ((0, padded - n), (0, 0)))
    mask = np.pad(segments.mask, ((0, padded - n), (0, 0)))
    out = [np.asarray(embed(ids[i:i + batch_size], mask[i:i + batch_size]))
           for i in range(0, padded, batch_size)]
    return np.concatenate(out)[:n]
