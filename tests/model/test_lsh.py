"""LSH attention (dil_jax.model.lsh) against NumPy references written from its definition.

The references share no code with the kernel: full attention is a float64 softmax; the
restricted reference rebuilds, from the sort orders alone, the set of keys each query is shown
by any round (its chunk and the previous one) and takes a float64 softmax over that set plus the
token's own key. Float32 tolerances: scores are dot products of 8-wide vectors of size ~1 (each
rounded to ~1e-7 relative), probabilities and contexts are convex combinations of values ~1, so
the kernel's float32 result lies within a few 1e-7 of the float64 one; 1e-5 leaves two orders of
magnitude and is far below the differences a wrong mask or chunk would make (>= 1e-2 here).
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dil_jax.model.lsh import (
    derived_num_buckets,
    hash_rotations,
    hash_vectors,
    lsh_attention,
    sort_items,
)

ATOL = 1e-5  # float32 rounding of 8-wide dot products and softmaxes, see the module docstring


def _inputs(seed: int, batch=2, heads=2, n=24, head_dim=8, pad=(0, 5)):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.normal(size=(batch, heads, n, head_dim)).astype(np.float32)
               for _ in range(3))
    mask = np.ones((batch, n), np.int32)
    for row, count in enumerate(pad[:batch]):
        if count:
            mask[row, -count:] = 0
    return q, k, v, mask


def _softmax_attention(q, k, v, allowed):
    """float64 reference: q [n, d], k, v [n, d], allowed [n, n] bool -> [n, d]."""
    scores = q.astype(np.float64) @ k.astype(np.float64).T
    scores = np.where(allowed, scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    return weights @ v.astype(np.float64)


def _full_reference(q, k, v, mask, exclude_self=False):
    out = np.zeros(q.shape)
    n = q.shape[2]
    for b in range(q.shape[0]):
        allowed = np.broadcast_to(mask[b][None, :] > 0, (n, n)).copy()
        if exclude_self:
            # Reformer's rule: self only when no other key is available.
            others = allowed & ~np.eye(n, dtype=bool)
            has_other = others.any(-1, keepdims=True)
            allowed = np.where(has_other, others, np.eye(n, dtype=bool))
        for h in range(q.shape[1]):
            out[b, h] = _softmax_attention(q[b, h], k[b, h], v[b, h], allowed)
    return out


def _real_rows(out, mask):
    return [out[b, :, mask[b] > 0] for b in range(len(mask))]


@pytest.mark.parametrize("num_hashes", [1, 3])
@pytest.mark.parametrize("exclude_self", [False, True])
def test_one_chunk_is_full_attention(num_hashes, exclude_self):
    """n <= bucket_size: one chunk (one bucket) holds every token -> full attention."""
    q, k, v, mask = _inputs(0)
    out = lsh_attention(q, k, v, mask, jax.random.key(1), num_hashes=num_hashes,
                        bucket_size=32, exclude_self=exclude_self)
    want = _full_reference(q, k, v, mask, exclude_self)
    for got_rows, want_rows in zip(_real_rows(np.asarray(out), mask), _real_rows(want, mask)):
        np.testing.assert_allclose(got_rows, want_rows, atol=ATOL)


def test_num_buckets_one_with_many_chunks_sees_neighbouring_chunks_only():
    """With one bucket and several chunks the sort is by position: a query sees its own chunk
    and the previous one (cyclically), plus itself — not full attention."""
    q, k, v, mask = _inputs(1, batch=1, n=32, pad=(0,))
    bucket = 4
    out = np.asarray(lsh_attention(q, k, v, mask, jax.random.key(0), num_hashes=1,
                                   bucket_size=bucket, num_buckets=1))
    # Items sorted by (position, role): chunk c (2 * bucket items) holds tokens
    # c*bucket .. c*bucket + bucket - 1, as keys and queries.
    n, chunks = 32, 32 // bucket
    token_chunk = np.arange(n) // bucket
    allowed = ((token_chunk[None, :] == token_chunk[:, None])
               | (token_chunk[None, :] == (token_chunk[:, None] - 1) % chunks))
    want = np.stack([_softmax_attention(q[0, h], k[0, h], v[0, h], allowed)
                     for h in range(2)])
    np.testing.assert_allclose(out[0], want, atol=ATOL)
    full = _full_reference(q, k, v, mask)[0]
    assert np.abs(out[0] - full).max() > 1e-2  # the restriction is real


def test_sort_is_a_permutation_the_unsort_inverts_exactly():
    q, k, _, mask = _inputs(2, n=40, pad=(0, 7))
    n, buckets = 40, 8
    rotation = hash_rotations(jax.random.key(3), 1, 2, 8, buckets)[0]
    qb, kb = hash_vectors(q, rotation, buckets), hash_vectors(k, rotation, buckets)
    order, undo = (np.asarray(a) for a in sort_items(qb, kb, mask, buckets))
    items = np.arange(2 * n)
    for b in range(2):
        for h in range(2):
            assert sorted(order[b, h]) == list(items)  # a permutation of the 2n items
            np.testing.assert_array_equal(order[b, h][undo[b, h]], items)  # exact inverse
            buckets_of = np.concatenate([np.asarray(kb)[b, h], np.asarray(qb)[b, h]])
            buckets_of = np.where(np.tile(mask[b], 2) > 0, buckets_of, buckets)
            sorted_buckets = buckets_of[order[b, h]]
            assert np.all(np.diff(sorted_buckets) >= 0)  # grouped by bucket, padding last
            positions = (order[b, h] % n)
            same = np.diff(sorted_buckets) == 0
            assert np.all(np.diff(positions)[same] >= 0)  # by position inside a bucket
    # Values: gathered in sorted order and scattered back, bit for bit.
    values = np.random.default_rng(0).normal(size=(2, 2, 2 * n, 8)).astype(np.float32)
    sorted_values = np.take_along_axis(values, order[..., None], axis=2)
    np.testing.assert_array_equal(np.take_along_axis(sorted_values, undo[..., None], axis=2),
                                  values)


def test_hash_is_angular_and_scale_free():
    rotation = hash_rotations(jax.random.key(0), 1, 1, 8, 6)[0]
    x = np.random.default_rng(1).normal(size=(1, 1, 50, 8)).astype(np.float32)
    buckets = np.asarray(hash_vectors(x, rotation, 6))
    np.testing.assert_array_equal(np.asarray(hash_vectors(3.0 * x, rotation, 6)), buckets)
    # argmax over [xR; -xR]: -x lands in the opposite bucket (b + n/2 mod n).
    np.testing.assert_array_equal(np.asarray(hash_vectors(-x, rotation, 6)), (buckets + 3) % 6)
    rotated = x[0, 0] @ np.asarray(rotation)[0]  # head 0
    np.testing.assert_array_equal(buckets[0, 0],
                                  np.argmax(np.concatenate([rotated, -rotated], -1), -1))


def test_padding_gets_zero_weight():
    """Padded tokens' queries, keys and values can be anything: real outputs do not change by
    a single bit (they sort last and their keys get exactly zero weight)."""
    q, k, v, mask = _inputs(3, n=40, pad=(6, 11))
    kwargs = dict(num_hashes=3, bucket_size=4)
    out = np.asarray(lsh_attention(q, k, v, mask, jax.random.key(5), **kwargs))
    padded = mask[:, None, :, None] == 0
    noise = np.random.default_rng(9).normal(size=q.shape).astype(np.float32) * 100
    changed = [np.where(padded, a + noise, a) for a in (q, k, v)]
    out_changed = np.asarray(lsh_attention(*changed, mask, jax.random.key(5), **kwargs))
    for got, want in zip(_real_rows(out_changed, mask), _real_rows(out, mask)):
        np.testing.assert_array_equal(got, want)


def test_deterministic_given_the_rng():
    q, k, v, mask = _inputs(4, n=40)
    kwargs = dict(num_hashes=2, bucket_size=4)
    first = np.asarray(lsh_attention(q, k, v, mask, jax.random.key(7), **kwargs))
    np.testing.assert_array_equal(
        np.asarray(lsh_attention(q, k, v, mask, jax.random.key(7), **kwargs)), first)
    other = np.asarray(lsh_attention(q, k, v, mask, jax.random.key(8), **kwargs))
    assert np.abs(other - first).max() > 1e-3  # another rng, other buckets


def _union_reference(q, k, v, mask, rng, num_hashes, bucket_size, exclude_self=False):
    """Softmax over the keys any round shows each query (its chunk and the previous one, from
    the sort orders) plus its own key once, float64; and the fraction of real (query, key)
    pairs shown."""
    batch, heads, n, _ = q.shape
    buckets = derived_num_buckets(n, bucket_size)
    rotations = hash_rotations(rng, num_hashes, heads, q.shape[-1], buckets)
    chunk, chunks = 2 * bucket_size, n // bucket_size
    orders = [np.asarray(sort_items(hash_vectors(q, rotation, buckets),
                                    hash_vectors(k, rotation, buckets), mask, buckets)[0])
              for rotation in rotations]
    out, shown, real_pairs = np.zeros(q.shape), 0, 0
    for b in range(batch):
        real = mask[b] > 0
        for h in range(heads):
            seen = np.zeros((n, n), bool)
            for round_orders in orders:
                order = round_orders[b, h]
                chunk_of = np.empty(2 * n, int)
                chunk_of[order] = np.arange(2 * n) // chunk
                key_chunk, query_chunk = chunk_of[:n], chunk_of[n:]
                window = ((key_chunk[None, :] == query_chunk[:, None])
                          | (key_chunk[None, :] == (query_chunk[:, None] - 1) % chunks))
                seen |= window
            seen &= real[None, :]
            np.fill_diagonal(seen, False)
            shown += (seen & real[:, None]).sum()
            real_pairs += real.sum() * (real.sum() - 1)
            scores = q[b, h].astype(np.float64) @ k[b, h].astype(np.float64).T
            self_score = np.diag(scores).copy()
            if exclude_self:
                self_score[:] = -1e5
            scores = np.where(seen, scores, -np.inf)
            top = np.maximum(scores.max(-1), self_score)
            weights = np.exp(scores - top[:, None])
            self_weight = np.exp(self_score - top)
            total = weights.sum(-1) + self_weight
            out[b, h] = ((weights @ v[b, h].astype(np.float64)
                          + self_weight[:, None] * v[b, h]) / total[:, None])
    return out, shown / real_pairs


@pytest.mark.parametrize("num_hashes,exclude_self", [(1, False), (2, True), (4, False)])
def test_rounds_combine_to_softmax_over_the_union_of_their_windows(num_hashes, exclude_self):
    """Reformer's log-sum-exp combination with the duplicate correction: softmax over the union
    of the keys every round shows a query, each counted once."""
    q, k, v, mask = _inputs(5, n=32, pad=(0, 9))
    rng = jax.random.key(11)
    out = np.asarray(lsh_attention(q, k, v, mask, rng, num_hashes=num_hashes, bucket_size=4,
                                   exclude_self=exclude_self))
    want, _ = _union_reference(q, k, v, mask, rng, num_hashes, 4, exclude_self)
    for got_rows, want_rows in zip(_real_rows(out, mask), _real_rows(want, mask)):
        np.testing.assert_allclose(got_rows, want_rows, atol=ATOL)


def _clustered(seed: int, n=64, heads=2, head_dim=8, clusters=8):
    """Queries and keys near a few shared directions (structured attention, as LSH assumes)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(clusters, head_dim))
    centres /= np.linalg.norm(centres, axis=-1, keepdims=True)

    def near():
        picks = rng.integers(0, clusters, size=(1, heads, n))
        return (3.0 * centres[picks] + 0.3 * rng.normal(size=(1, heads, n, head_dim))
                ).astype(np.float32)

    v = rng.normal(size=(1, heads, n, head_dim)).astype(np.float32)
    return near(), near(), v, np.ones((1, n), np.int32)


def test_approaches_full_attention_as_hashes_grow():
    """On clustered queries/keys, more rounds show each query more keys (a superset: round r is
    drawn from fold_in(rng, r)) and the mean error against full attention falls from 1 to 8
    hashes, averaged over 4 inputs (the measured values: docs/architecture.md)."""
    errors, coverage = {}, {}
    for num_hashes in (1, 2, 4, 8):
        errs, covs = [], []
        for seed in range(4):
            q, k, v, mask = _clustered(seed)
            rng = jax.random.key(100 + seed)
            out = np.asarray(lsh_attention(q, k, v, mask, rng, num_hashes=num_hashes,
                                           bucket_size=8))
            errs.append(np.abs(out - _full_reference(q, k, v, mask)).mean())
            covs.append(_union_reference(q, k, v, mask, rng, num_hashes, 8)[1])
        errors[num_hashes], coverage[num_hashes] = np.mean(errs), np.mean(covs)
    hashes = sorted(errors)
    assert all(coverage[a] <= coverage[b] for a, b in itertools.pairwise(hashes)), coverage
    assert all(errors[a] > errors[b] for a, b in itertools.pairwise(hashes)), errors
    assert errors[8] < 0.5 * errors[1], errors



def test_gradients_flow_and_match_full_attention_in_one_chunk():
    """One chunk is full attention, so the gradients must be full attention's too (the sort
    and un-sort are gathers; their transposes are scatters)."""
    q, k, v, mask = _inputs(6, n=16, pad=(0, 3))

    def full(q, k, v):
        bias = jnp.where(jnp.asarray(mask)[:, None, None, :] > 0, 0.0, -1e30)
        probs = jax.nn.softmax(jnp.einsum("bhqd,bhkd->bhqk", q, k) + bias, axis=-1)
        return jnp.einsum("bhqk,bhkd->bhqd", probs, v)

    def lsh(q, k, v):
        return lsh_attention(q, k, v, mask, jax.random.key(0), num_hashes=2, bucket_size=16)

    weight = np.random.default_rng(0).normal(size=q.shape).astype(np.float32)
    weight = weight * mask[:, None, :, None]  # real rows only

    def loss(fn):
        return lambda *args: jnp.sum(fn(*args) * weight)

    got = jax.grad(loss(lsh), argnums=(0, 1, 2))(q, k, v)
    want = jax.grad(loss(full), argnums=(0, 1, 2))(q, k, v)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=ATOL)
