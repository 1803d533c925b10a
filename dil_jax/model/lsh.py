"""Reformer LSH attention (Kitaev et al. 2020) for readers with separate query and key weights.

Pure functions of arrays and an explicit rng; `SelfAttention.attend_lsh` calls `lsh_attention`.

What is computed, per hash round r (independent random rotations R_r of each head):

  1. Angular LSH: a vector x falls in bucket argmax([x R_r ; -x R_r]) (num_buckets / 2
     rotations). Padded tokens go to an extra last bucket, so they sort after every real token
     whatever their values.
  2. Shared-QK, the decision for pretrained readers: Reformer ties W_q = W_k so that a token's
     query and key share one bucket; BERT-style checkpoints have separate W_q and W_k, and
     tying them (or hashing by keys alone) would change the function the weights were trained
     for. So Q and K are KEPT and hashed JOINTLY with the same rotations: every token is two
     items, its query and its key, each with its own bucket; all 2n items are sorted by
     (bucket, position, role). Items of one bucket are then adjacent, so a query meets the keys
     most aligned with it (the point of angular LSH), and with one bucket this is exactly full
     attention. The cost: sorted chunks hold both roles, so the score tiles are [2b, 4b] rather
     than Reformer's [b, 2b] (b = bucket_size): 4x Reformer's kernel, still O(n b) not O(n^2).
  3. The sorted items are cut into chunks of 2b items; a query item attends to the key items of
     its own chunk and of the previous one (the first chunk looks at the last; with one chunk,
     only itself). Padded keys get MASK_BIAS (exactly zero weight).
  4. Rounds are combined as Reformer does, by their log-sum-exp weights, with its duplicate
     correction: a key visible to a query in c of the rounds has log(c) subtracted from its score
     in each, so the result is softmax over the UNION of the keys any round showed the query.
     More rounds show more keys; the union of all keys is full attention.
  5. A token's own key is taken out of the chunks and added once as a separate term, so every
     query has at least one key. With exclude_self (Reformer's rule for shared-QK models, where
     q.q dominates) its score is SELF_SCORE: it gets weight only when no other key is visible.
     Without it (the default, for pretrained readers whose full attention has the self term) it
     keeps its real score q_i . k_i.

No attention-probability dropout is applied in LSH layers (the hidden dropout still is).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from dil_jax.rounding import ceil_div, round_up

# Added to attention scores of padding keys, here and in attention.py (full attention). float32
# min as in Hugging Face: exp() underflows to an exact 0, so masked keys get exactly zero weight
# and padding never changes a real token's state.
MASK_BIAS = float(jnp.finfo(jnp.float32).min)
# Reformer's self-attention score when a token may attend to itself only as a last resort:
# exp(SELF_SCORE - s) is an exact float32 0 beside any real score s > -1e5 + 104.
SELF_SCORE = -1e5


def derived_num_buckets(seq_len: int, bucket_size: int, num_buckets: int = 0) -> int:
    """Buckets of angular LSH over `seq_len` tokens: `num_buckets` if set (> 0), else one per
    `bucket_size` tokens, rounded up to an even count (argmax over [xR; -xR]); 1 if one chunk
    holds the whole sequence."""
    if num_buckets > 0:
        return num_buckets
    per_chunk = ceil_div(seq_len, bucket_size)
    return 1 if per_chunk <= 1 else round_up(per_chunk, 2)


def hash_rotations(rng: jax.Array, num_hashes: int, num_heads: int, head_dim: int,
                   num_buckets: int) -> jax.Array:
    """Random rotations [num_hashes, heads, head_dim, max(num_buckets // 2, 1)], N(0, 1).

    Round r is drawn from fold_in(rng, r): more rounds keep the earlier ones, so the keys a
    query sees with more hashes are a superset of those it saw with fewer."""
    shape = (num_heads, head_dim, max(num_buckets // 2, 1))
    return jnp.stack([jax.random.normal(jax.random.fold_in(rng, r), shape, jnp.float32)
                      for r in range(num_hashes)])


def hash_vectors(vectors: jax.Array, rotations: jax.Array, num_buckets: int) -> jax.Array:
    """Angular LSH buckets: vectors [batch, heads, seq, head_dim], rotations [heads, head_dim,
    num_buckets // 2] -> [batch, heads, seq] int32 in 0..num_buckets-1 (argmax of [xR; -xR]).
    Scale-free: a vector and any positive multiple of it share a bucket."""
    if num_buckets == 1:
        return jnp.zeros(vectors.shape[:-1], jnp.int32)
    rotated = jnp.einsum("bhsd,hdr->bhsr", vectors.astype(jnp.float32), rotations)
    return jnp.argmax(jnp.concatenate([rotated, -rotated], axis=-1), axis=-1).astype(jnp.int32)


def sort_items(query_buckets: jax.Array, key_buckets: jax.Array, mask: jax.Array,
               num_buckets: int) -> tuple[jax.Array, jax.Array]:
    """The sort of one round's 2n items by (bucket, position, role) and its inverse.

    query_buckets, key_buckets: [batch, heads, n] int; mask: [batch, n] (1 = token) ->
    (order, undo), each [batch, heads, 2n] int32. Item i < n is token i's key, item n + i its
    query; sorted[t] = items[order[t]] and items[i] = sorted[undo[i]]. Padded tokens take bucket
    num_buckets (after every real one).
    """
    n = mask.shape[-1]
    real = mask[:, None, :] > 0
    buckets = jnp.concatenate([jnp.where(real, key_buckets, num_buckets),
                               jnp.where(real, query_buckets, num_buckets)], axis=-1)
    position = jnp.tile(jnp.arange(n, dtype=jnp.int32), 2)
    role = jnp.repeat(jnp.arange(2, dtype=jnp.int32), n)  # 0 = key, 1 = query
    # Unique per item, so the order is a total order (no ties for argsort to break).
    sort_key = buckets * (2 * n) + 2 * position + role
    order = jnp.argsort(sort_key, axis=-1).astype(jnp.int32)
    undo = jnp.argsort(order, axis=-1).astype(jnp.int32)
    return order, undo


def _gather(values: jax.Array, index: jax.Array) -> jax.Array:
    """values [batch, heads, n, ...] at index [batch, heads, m] along axis 2 -> [batch, heads,
    m, ...]."""
    index = index.reshape(index.shape + (1,) * (values.ndim - 3))
    return jnp.take_along_axis(values, index, axis=2)


def _with_previous_chunk(chunks: jax.Array, num_chunks: int) -> jax.Array:
    """[batch, heads, chunks, c, ...] -> [batch, heads, chunks, 2c, ...]: each chunk followed
    by the previous one (chunk 0 by the last); a single chunk is left alone (no duplicates)."""
    if num_chunks == 1:
        return chunks
    return jnp.concatenate([chunks, jnp.roll(chunks, 1, axis=2)], axis=3)


def _visible(row_chunk: jax.Array, col_chunk: jax.Array, num_chunks: int) -> jax.Array:
    """Whether a key in chunk col_chunk is seen by a query in chunk row_chunk (its own chunk or
    the previous one, cyclically)."""
    return (col_chunk == row_chunk) | (col_chunk == (row_chunk - 1) % num_chunks)


def _round_part(query: jax.Array, key: jax.Array, value: jax.Array, mask: jax.Array,
                order: jax.Array, undo: jax.Array, query_chunks: jax.Array,
                key_chunks: jax.Array, bucket_size: int, compute_dtype: Any
                ) -> tuple[jax.Array, jax.Array]:
    """One round's chunked attention of every query over the keys of its window, self excluded.

    query, key, value: [batch, heads, n, head_dim] (query pre-scaled); mask [batch, n];
    order, undo: this round's `sort_items` [batch, heads, 2n]; query_chunks, key_chunks:
    [rounds, batch, heads, n], each item's chunk in every round (for the duplicate count) ->
    (log-sum-exp [batch, heads, n], normalised context [batch, heads, n, head_dim] float32) per
    query, un-sorted.
    """
    batch, heads, n, head_dim = query.shape
    items = 2 * n
    chunk = 2 * bucket_size
    num_chunks = items // chunk
    token = order % n  # [batch, heads, 2n]
    is_key = order < n
    shape = (batch, heads, num_chunks, chunk)
    rows = _gather(query, token).reshape(*shape, head_dim)
    cols_key = _with_previous_chunk(_gather(key, token).reshape(*shape, head_dim), num_chunks)
    cols_value = _with_previous_chunk(_gather(value, token).reshape(*shape, head_dim),
                                      num_chunks)
    row_token = token.reshape(shape)
    col_token = _with_previous_chunk(row_token, num_chunks)
    real = jnp.broadcast_to(mask[:, None, :] > 0, (batch, heads, n))
    col_ok = _with_previous_chunk((is_key & _gather(real, token)).reshape(shape), num_chunks)
    # A token's own key is never taken from the chunks: it is added once, apart (see module).
    allowed = col_ok[..., None, :] & (row_token[..., :, None] != col_token[..., None, :])

    scores = jnp.einsum("bhcid,bhcjd->bhcij", rows, cols_key,
                        preferred_element_type=jnp.float32)
    # Duplicate correction: how many rounds show this key to this query (>= 1 where allowed,
    # since this round does), so that the union of all rounds counts each key once.
    num_rounds = query_chunks.shape[0]
    if num_rounds > 1:
        count = jnp.zeros(scores.shape, jnp.int32)
        for other in range(num_rounds):
            row_loc = _gather(query_chunks[other], row_token.reshape(batch, heads, items))
            col_loc = _gather(key_chunks[other], col_token.reshape(batch, heads, -1))
            row_loc = row_loc.reshape(shape)[..., :, None]
            col_loc = col_loc.reshape(*shape[:3], -1)[..., None, :]
            count = count + _visible(row_loc, col_loc, num_chunks).astype(jnp.int32)
        scores = scores - jnp.log(jnp.maximum(count, 1).astype(jnp.float32))
    scores = jnp.where(allowed, scores, MASK_BIAS)
    lse = jax.nn.logsumexp(scores, axis=-1)
    probs = jnp.exp(scores - lse[..., None])
    context = jnp.einsum("bhcij,bhcjd->bhcid", probs.astype(compute_dtype), cols_value,
                         preferred_element_type=jnp.float32)
    # Un-sort; the queries are items n..2n-1.
    undo_query = undo[..., n:]
    context = _gather(context.reshape(batch, heads, items, head_dim), undo_query)
    lse = _gather(lse.reshape(batch, heads, items), undo_query)
    return lse, context


def lsh_attention(query: jax.Array, key: jax.Array, value: jax.Array, mask: jax.Array,
                  rng: jax.Array, *, num_hashes: int, bucket_size: int, num_buckets: int = 0,
                  exclude_self: bool = False, compute_dtype: Any = jnp.float32) -> jax.Array:
    """Bidirectional LSH attention (see the module docstring for what is computed).

    query, key, value: [batch, heads, n, head_dim], the query pre-scaled by 1/sqrt(head_dim);
    mask: [batch, n] (1 = token, 0 = padding); rng: the key of the hash rotations (the same rng,
    the same buckets) -> context [batch, heads, n, head_dim] in compute_dtype. num_buckets: 0 =
    `derived_num_buckets`. Exactly full attention when one chunk holds every token (n <=
    bucket_size). Sequences are padded to a multiple of bucket_size (padding masked).
    """
    _, heads, n, head_dim = query.shape
    padded = round_up(n, bucket_size)
    if padded != n:
        widen = [(0, 0), (0, 0), (0, padded - n), (0, 0)]
        query, key, value = (jnp.pad(a, widen) for a in (query, key, value))
        mask = jnp.pad(mask, [(0, 0), (0, padded - n)])
    buckets = derived_num_buckets(padded, bucket_size, num_buckets)
    rotations = hash_rotations(rng, num_hashes, heads, head_dim, buckets)
    sorts, query_chunks, key_chunks = [], [], []
    for rotation in rotations:
        order, undo = sort_items(hash_vectors(query, rotation, buckets),
                                 hash_vectors(key, rotation, buckets), mask, buckets)
        sorts.append((order, undo))
        chunk_of_item = undo // (2 * bucket_size)
        key_chunks.append(chunk_of_item[..., :padded])
        query_chunks.append(chunk_of_item[..., padded:])
    query_chunks, key_chunks = jnp.stack(query_chunks), jnp.stack(key_chunks)
    parts = [_round_part(query, key, value, mask, order, undo, query_chunks, key_chunks,
                         bucket_size, compute_dtype) for order, undo in sorts]
    lses = jnp.stack([lse for lse, _ in parts])  # [rounds, batch, heads, n]
    contexts = jnp.stack([context for _, context in parts])
    window_lse = jax.nn.logsumexp(lses, axis=0)
    window = jnp.sum(jnp.exp(lses - window_lse)[..., None] * contexts, axis=0)
    # The token's own key, once: merged with the windows by the log-sum-exp rule.
    self_score = jnp.einsum("bhnd,bhnd->bhn", query, key, preferred_element_type=jnp.float32)
    if exclude_self:
        self_score = jnp.full_like(self_score, SELF_SCORE)
    top = jnp.maximum(window_lse, self_score)
    window_weight = jnp.exp(window_lse - top)[..., None]
    self_weight = jnp.exp(self_score - top)[..., None]
    context = ((window * window_weight + value.astype(jnp.float32) * self_weight)
               / (window_weight + self_weight))
    return context[:, :, :n].astype(compute_dtype)
