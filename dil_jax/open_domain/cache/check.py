"""Whether a passage cache serves a reader: the reader's side of the manifest, and its states.

This module holds what a cache is checked against: the fingerprints (`tokenizer_fingerprint`,
`texts_fingerprint`) and `reader_cache_key` (the `CacheKey` a reader expects, handed to
`PassageCache.open`), and `check_states`, which re-encodes a few stored rows and compares them
with what the cache holds. It is apart from `dil_jax.open_domain.cache.store` (the format and
`PassageCache`) because opening and reading a cache needs none of it; it imports from `cache`,
never the reverse.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np

from dil_jax.checkpoints.fingerprint import short_sha256
from dil_jax.open_domain.cache.manifest import CacheKey
from dil_jax.open_domain.cache.storage import FLOAT32, Storage
from dil_jax.open_domain.cache.store import (
    CacheBrokenError,
    PassageCache,
    ReuseEncoder,
    StatesEncoder,
    WindowBatch,
)

# Rows compared by `check_states`: first and last are enough to catch another k or model (every
# state of a row changes), and cost one tiny encoder call.
CHECKED_ROWS = 2
# Mean |stored - expected| / mean |expected| above which stored values are not this encoder's,
# where expected = the fresh values sent through the array's own storage (its round trip), so
# compression error does not count: re-encoding in float32 differs by ~1e-6 (more across devices,
# e.g. TF32 matmuls on a GPU: ~1e-3), which flips an int8 code or a bfloat16 rounding only near a
# rounding boundary (~4e-3 at most on the mean); another k or model differs by tens of percent.
CHECK_TOLERANCE = {"float32": 1e-3}
QUANTIZED_TOLERANCE = 1e-2


def tokenizer_fingerprint(tokenizer) -> str:
    vocab = sorted(tokenizer.get_vocab().items())
    return f"{type(tokenizer).__name__}:{short_sha256([json.dumps(vocab).encode()])}"


def texts_fingerprint(texts: Sequence[str]) -> str:
    return short_sha256([json.dumps(list(texts)).encode()])


def _mean_relative_difference(stored: np.ndarray, expected: np.ndarray, mask: np.ndarray
                              ) -> float:
    """mean |stored - expected| / mean |expected| over the real tokens (mask [rows, p_len]):
    padding rows are never read."""
    mask = np.asarray(mask, bool)
    scale = float(np.abs(expected[mask]).mean()) or 1.0
    return float(np.abs(stored[mask] - expected[mask]).mean()) / scale


def _tolerance(storage: Storage) -> float:
    return CHECK_TOLERANCE.get(storage.name, QUANTIZED_TOLERANCE)


def check_states(cache: PassageCache,
                 encode: StatesEncoder,
                 reuse: ReuseEncoder | None = None
                 ) -> None:
    """Refuses (CacheBrokenError) a cache whose stored states (or reuse arrays) are not these.

    Re-encodes CHECKED_ROWS sampled rows (the first and the last), sends the fresh values through
    each array's own storage (so compression error does not count) and compares them with the
    stored ones, so a manifest edited to claim another k (or model) is caught on open. With
    `reuse` and a cache holding the first-upper-block arrays, those are recomputed from the fresh
    states and compared too; a mismatch names the file. A k = 0 cache holds no states: nothing
    to compare.

    encode: a `WindowBatch` of the sampled rows -> [rows, passage_len, hidden] lower states.
    reuse: (states, mask) -> the first-upper-block arrays (`dil_jax.open_domain.cache.reuse`).
    """
    if cache.states is None or not len(cache):
        return
    rows = sorted({0, len(cache) - 1})[:CHECKED_ROWS]
    mask = np.asarray(cache.mask[rows])
    # A shard's own folder numbers its rows from its start in the index.
    first_row = int((cache.manifest.shard or {}).get("start", 0))
    windows = WindowBatch.of(np.asarray(rows), cache.ids, cache.mask, cache.offsets, first_row)
    fresh = np.asarray(encode(windows), dtype=np.float32)
    difference = _mean_relative_difference(cache.read_states(rows),
                                           cache.states.round_trip(fresh), mask)
    if not difference <= _tolerance(cache.storage):
        k = cache.manifest.key.num_lower_layers
        raise CacheBrokenError(
            f"{cache.directory}: the stored states do not match k={k} of this reader (mean "
            f"relative difference {difference:.3g} on {len(rows)} sampled passages): the cache "
            "was built by another model or k, or its manifest was edited; rerun `dil-jax index` "
            "with the same --out and reader to rebuild it")
    if reuse is None or cache.reuse is None:
        return
    for name, fresh_array in reuse(fresh, mask).items():
        stored = cache.reuse[name]
        difference = _mean_relative_difference(stored.read(rows),
                                               stored.round_trip(fresh_array), mask)
        if not difference <= _tolerance(stored.storage):
            raise CacheBrokenError(
                f"{stored.path}: the stored first-upper-block array {name} does not match this "
                f"reader's (mean relative difference {difference:.3g} on {len(rows)} sampled "
                "passages): it belongs to another model or k, or was edited; rerun `dil-jax "
                "index` with the same --out and reader to rebuild the cache")


def reader_cache_key(config, weights_id: str, tokenizer_id: str, max_passage_len: int,
                    passages_id: str, storage: Storage = FLOAT32) -> CacheKey:
    """The CacheKey of a reader: what a cache must have been built with to serve it.

    weights_id: the fingerprint of its weights (`Reader.weights_fingerprint`).

    storage: the scheme (`--cache-dtype`: float32, bfloat16, int8, pca<d> or pq<M>); a PCA
    wider than the hidden size, or a pq whose M does not divide it, is CacheStorageError.
    """
    model = weights_id
    # Settings outside the params that change a passage's state (QANet's / BiDAF's word scale,
    # LSH in a lower block): the same weights read otherwise need another cache. Only settings
    # away from their defaults count, so existing caches keep their keys.
    settings = config.cached_state_settings()
    if settings:
        model += "+" + short_sha256([json.dumps(settings, sort_keys=True).encode()])
    return CacheKey(model=model, architecture=config.architecture,
                    num_lower_layers=config.num_lower_layers, hidden_size=config.hidden_size,
                    tokenizer=tokenizer_id, max_passage_len=max_passage_len,
                    storage=storage.check_width(config.hidden_size), passages=passages_id)
