"""The ragged passage cache (format /3): real tokens only, zarr v3 arrays on tensorstore, read by
rows. Expected values come from numpy written here (the padded arrays a cache is built from, the
int8 rule by hand), never from the cache's own code."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from dil_jax.open_domain.cache.build import build_passage_cache
from dil_jax.open_domain.cache.manifest import CacheKey
from dil_jax.open_domain.cache.ragged import (
    RaggedError,
    pack,
    row_lengths,
    token_index,
    unpack,
)
from dil_jax.open_domain.cache.storage import CacheStorageError, Storage
from dil_jax.open_domain.cache.store import CacheBrokenError, CacheMismatchError, PassageCache
from dil_jax.open_domain.cache.zarr_store import TokenGrid

from tests.helpers.index import zarr_array

ROWS, P_LEN, HIDDEN, PAD = 37, 12, 6, 5
# Shards of 16 tokens, chunks of 4: ~230 real tokens make 15 shard files per array.
GRID = TokenGrid(4, 16)


def _windows(seed: int = 0, rows: int = ROWS):
    """ids, mask [rows, P_LEN] int32, offsets [rows, P_LEN, 2]: rows of 1..P_LEN real tokens,
    padded as window_contexts pads (PAD ids, -1 offsets)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, P_LEN + 1, rows)
    column = np.arange(P_LEN)[None, :]
    real = column < lengths[:, None]
    ids = np.where(real, rng.integers(100, 999, (rows, P_LEN)), PAD).astype(np.int32)
    offsets = np.where(real[..., None], rng.integers(0, 500, (rows, P_LEN, 2)), -1)
    return ids, real.astype(np.int32), offsets.astype(np.int32)


def _states(windows) -> np.ndarray:
    """A stand-in encoder: [n, P_LEN, HIDDEN] float32 from each token's id and position
    (padding slots too, as a real encoder fills them)."""
    ids = windows.ids.astype(np.float32)[..., None]
    width = np.arange(1, HIDDEN + 1, dtype=np.float32)
    return np.sin(ids * 0.01 * width + np.arange(P_LEN, dtype=np.float32)[None, :, None])


def _key(storage: str = "float32") -> CacheKey:
    return CacheKey(model="m", architecture="bert", num_lower_layers=1, hidden_size=HIDDEN,
                    tokenizer="t", max_passage_len=P_LEN, storage=Storage.parse(storage),
                    passages="p")


def _build(folder: Path, storage: str = "float32") -> PassageCache:
    ids, mask, offsets = _windows()
    return build_passage_cache(folder, _key(storage), ids, mask, offsets, _states,
                               chunk_passages=5, pad_id=PAD, grid=GRID)


def _int8_by_hand(x: np.ndarray) -> np.ndarray:
    """x [..., width] -> what per-token symmetric int8 gives back: s = max|x| / 127,
    round(x / s) * s."""
    scale = np.abs(x).max(axis=-1, keepdims=True) / 127
    return np.round(x / np.where(scale > 0, scale, 1)) * scale


# ------------------------------------------------------------------ ragged rows (numpy)


def test_pack_and_unpack_round_trip_the_padded_rows():
    ids, mask, offsets = _windows(1)
    lengths = row_lengths(mask)
    assert lengths.tolist() == [int(row.sum()) for row in mask]
    flat = pack(offsets, lengths)
    by_hand = np.concatenate([offsets[r, :lengths[r]] for r in range(ROWS)])
    np.testing.assert_array_equal(flat, by_hand)
    np.testing.assert_array_equal(unpack(flat, lengths, P_LEN, -1), offsets)
    np.testing.assert_array_equal(unpack(pack(ids, lengths), lengths, P_LEN, PAD), ids)
    # The tokens of some rows, gathered from the flat array, are those rows' real tokens.
    starts = np.concatenate([[0], np.cumsum(lengths)])
    rows = np.array([30, 2, 2, 17])
    gathered = flat[token_index(starts[rows], lengths[rows])]
    np.testing.assert_array_equal(unpack(gathered, lengths[rows], P_LEN, -1), offsets[rows])


def test_a_mask_that_is_not_ones_then_zeros_is_refused_naming_the_row():
    mask = np.ones((3, 4), np.int32)
    mask[2, 1] = 0
    with pytest.raises(RaggedError, match="row 2: its mask is not ones then zeros"):
        row_lengths(mask)


def test_padding_that_reads_back_otherwise_is_refused_naming_the_window(tmp_path):
    ids, mask, offsets = _windows()
    ids[9, -1] = 7 if mask[9, -1] == 0 else ids[9, -1]
    ids[int(np.argmin(mask[:, -1])), -1] = 7  # a padding slot that is not the pad id
    with pytest.raises(RaggedError, match=r"cache: windows .*ids: row \d+ holds something "
                                          r"else than 5 in its padding slots"):
        build_passage_cache(tmp_path / "cache", _key(), ids, mask, offsets, _states,
                            chunk_passages=5, pad_id=PAD, grid=GRID)
    assert not (tmp_path / "cache").exists()


# ------------------------------------------------------------------ the store


@pytest.mark.parametrize("storage", ["float32", "int8"])
def test_rows_read_from_the_store_equal_the_padded_arrays(tmp_path, storage):
    """Rows in any order, repeated, across shards: the arrays the cache was built from (states:
    their real tokens, through the storage's rule by hand; padding slots 0). The same through a
    file:// URL, the kvstore path an object store takes."""
    ids, mask, offsets = _windows()
    cache = _build(tmp_path / "cache", storage)
    states = _states(type("W", (), {"ids": ids})) * mask[..., None]
    expected = states if storage == "float32" else _int8_by_hand(states)
    files = list((tmp_path / "cache" / "states" / "c").rglob("*"))
    assert len([f for f in files if f.is_file()]) > 5  # many shards: rows cross them
    url = PassageCache.open(f"file://{tmp_path / 'cache'}", _key(storage))
    for opened in (cache, url):
        for rows in ([36, 0, 5, 5, 20], list(range(ROWS)), []):
            np.testing.assert_array_equal(opened.ids[rows], ids[rows])
            np.testing.assert_array_equal(opened.mask[rows], mask[rows])
            np.testing.assert_array_equal(opened.offsets[rows], offsets[rows])
            np.testing.assert_allclose(opened.read_states(rows), expected[rows],
                                       rtol=0, atol=1e-6)
    assert cache.num_tokens == url.num_tokens == int(mask.sum())
    assert int(cache.offsets[4, 0, 1]) == offsets[4, 0, 1]


# pq3 over HIDDEN = 6: 3 sub-vectors of 2; enough rows for more real tokens than a codebook's
# 256 centroids (so faiss's k-means fits it, not the sample as its own codebook).
PQ_ROWS = 80


def test_pq_rows_read_by_row_equal_a_full_read_and_the_codes_decoded_by_hand(tmp_path):
    """A pq3 cache: [real tokens, 3] uint8 codes and, as side arrays, the rotation and the
    codebook. Rows read in any order, repeated, across shards, equal the full read's rows; both
    equal the stored codes decoded here in float64 from the zarr arrays (centroids, inverse
    rotation; padding slots 0), and each stored code is its sub-vector's nearest centroid of
    the rotated float32 state (brute force here)."""
    pytest.importorskip("faiss")
    ids, mask, offsets = _windows(seed=2, rows=PQ_ROWS)
    folder = tmp_path / "cache"
    cache = build_passage_cache(folder, _key("pq3"), ids, mask, offsets, _states,
                                chunk_passages=5, pad_id=PAD, grid=GRID)
    tokens = int(mask.sum())
    assert cache.num_tokens == tokens > 256
    whole = cache.read_states(range(PQ_ROWS))
    for rows in ([PQ_ROWS - 1, 0, 5, 5, 40], list(range(PQ_ROWS))[::-1], []):
        np.testing.assert_array_equal(cache.read_states(rows), whole[rows])
    codes = zarr_array(folder / "states")
    mean, basis, codebook = (zarr_array(folder / f"states.{suffix}").astype(np.float64)
                             for suffix in ("pca_mean", "pca_basis", "pq_codebook"))
    assert codes.dtype == np.uint8 and codes.shape == (tokens, 3)
    assert basis.shape == (HIDDEN, HIDDEN) and codebook.shape == (3, 256, 2)
    centroids = np.concatenate([codebook[m, codes[:, m]] for m in range(3)], axis=1)
    real = mask == 1
    np.testing.assert_allclose(whole[real], centroids @ basis.T + mean, rtol=0, atol=1e-5)
    assert not whole[~real].any()
    x = _states(type("W", (), {"ids": ids}))[real].astype(np.float64)
    rotated = (x - mean) @ basis
    for m in range(3):
        distances = np.sum((rotated[:, None, 2 * m:2 * m + 2] - codebook[m][None]) ** 2, -1)
        stored = distances[np.arange(tokens), codes[:, m]]
        np.testing.assert_allclose(stored, distances.min(axis=1), rtol=1e-5, atol=1e-9)


def test_without_faiss_a_pq_build_is_refused_before_anything_is_written(tmp_path,
                                                                        monkeypatch):
    monkeypatch.setitem(sys.modules, "faiss", None)  # `import faiss` raises ImportError
    ids, mask, offsets = _windows()
    with pytest.raises(CacheStorageError, match=r"--cache-dtype pq3 .*faiss.*not installed: "
                                                r"pip install 'dil_jax\[pq\]'"):
        build_passage_cache(tmp_path / "cache", _key("pq3"), ids, mask, offsets, _states,
                            chunk_passages=5, pad_id=PAD, grid=GRID)
    assert list(tmp_path.iterdir()) == []  # no cache, no staging folder


def _shard_files(folder: Path) -> dict[str, list[Path]]:
    """The shard files of each per-token array of a ragged cache folder, in token order."""
    arrays = {}
    for array in sorted(p for p in folder.iterdir() if p.is_dir() and p.name != "token_starts"):
        arrays[array.name] = sorted((array / "c").iterdir(), key=lambda p: int(p.name))
    return {name: [shard / "0" if shard.is_dir() else shard for shard in shards]
            for name, shards in arrays.items()}


def test_reading_rows_reads_only_their_chunks(tmp_path):
    """Opening a cache reads no array whole, and reading rows reads only the shards their
    tokens lie in: every other shard file overwritten with garbage (and the digest check off,
    which would refuse it) changes nothing for them; a row in a garbled shard is refused,
    naming the file (its chunk's crc32c)."""
    ids, mask, offsets = _windows()
    _build(tmp_path / "cache")
    starts = np.concatenate([[0], np.cumsum(mask.sum(axis=1))])
    rows = [3, 4]
    kept = {int(t) // GRID.shard_tokens for r in rows for t in range(starts[r], starts[r + 1])}
    garbled = None
    for shards in _shard_files(tmp_path / "cache").values():
        for number, path in enumerate(shards):
            if number not in kept:
                path.write_bytes(os.urandom(path.stat().st_size))
                garbled = garbled or (number, path)
    cache = PassageCache.open(tmp_path / "cache", _key(), verify="none")
    states = _states(type("W", (), {"ids": ids})) * mask[..., None]
    np.testing.assert_array_equal(cache.read_states(rows), states[rows])
    np.testing.assert_array_equal(cache.offsets[rows], offsets[rows])
    number, path = garbled
    row = int(np.searchsorted(starts, number * GRID.shard_tokens, side="right") - 1)
    with pytest.raises(CacheBrokenError, match="unreadable"):
        cache.read_states([row])
    with pytest.raises(CacheBrokenError, match="changed since the cache was built"):
        PassageCache.open(tmp_path / "cache", _key())


def _flip(path: Path, offset: int, keep_time: bool) -> None:
    status = path.stat()
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))
    if keep_time:
        os.utime(path, ns=(status.st_atime_ns, status.st_mtime_ns))


def test_a_flipped_byte_in_a_chunk_is_named_on_open_by_verify_and_on_read(tmp_path):
    """A byte flipped with the time put back (a failing disk, not a write): in a file the open
    check samples (every file smaller than the sample is hashed whole), opening names it; in
    one it does not sample (SAMPLED_FILES of the many), `verify="full"` names it, and so does
    the chunk's crc32c when a row reads it."""
    from dil_jax.open_domain.cache.digests import SAMPLED_FILES, sampled_names

    _build(tmp_path / "cache")
    folder = tmp_path / "cache"
    recorded = sorted(json.loads((folder / "manifest.json").read_text())["files"])
    sampled = sampled_names(recorded)
    assert len(recorded) > SAMPLED_FILES == len(sampled)
    shards = [f"states/c/{n}/0" for n in range(len(_shard_files(folder)["states"]))]
    checked = next(name for name in shards if name in sampled)
    unchecked = next(name for name in shards if name not in sampled)
    _flip(folder / checked, 5, keep_time=True)
    with pytest.raises(CacheBrokenError, match=f"{folder / checked}: broken passage cache "
                                               ".*sampled blocks differs"):
        PassageCache.open(folder, _key())
    with pytest.raises(CacheBrokenError, match=f"file://{folder}/{checked}: .*sampled blocks"):
        PassageCache.open(f"file://{folder}", _key())
    _flip(folder / checked, 5, keep_time=True)  # back as built
    _flip(folder / unchecked, 5, keep_time=True)
    PassageCache.open(folder, _key())  # not sampled: opens
    with pytest.raises(CacheBrokenError, match=f"{folder / unchecked}: .*its sha256 differs"):
        PassageCache.open(folder, _key(), verify="full")
    cache = PassageCache.open(folder, _key(), verify="none")
    with pytest.raises(CacheBrokenError, match=f"{folder / unchecked}.*[Dd]igest mismatch"):
        cache.read_states(range(ROWS))


def test_a_truncated_or_missing_file_is_refused_naming_it(tmp_path):
    _build(tmp_path / "cache")
    shards = _shard_files(tmp_path / "cache")["ids"]
    data = shards[1].read_bytes()
    shards[1].write_bytes(data[:-9])
    with pytest.raises(CacheBrokenError, match=f"{shards[1]}: broken passage cache "
                                               rf"\({len(data) - 9} bytes, the manifest "
                                               f"recorded {len(data)}"):
        PassageCache.open(tmp_path / "cache", _key())
    with pytest.raises(CacheBrokenError, match="states/c/1/0: .*shorter than the"):
        shards[1].write_bytes(data)
        states = _shard_files(tmp_path / "cache")["states"][1]
        states.write_bytes(states.read_bytes()[:-1])
        PassageCache.open(f"file://{tmp_path / 'cache'}", _key())
    states.unlink()
    with pytest.raises(CacheBrokenError, match=f"{states}: .*the file is missing"):
        PassageCache.open(tmp_path / "cache", _key())
    (tmp_path / "cache" / "offsets" / "zarr.json").unlink()
    with pytest.raises(CacheBrokenError, match="offsets/zarr.json: .*the array is missing"):
        PassageCache.open(tmp_path / "cache", _key(), verify="none")


def test_a_cache_of_an_unknown_format_is_another_format_not_a_broken_cache(tmp_path):
    """Code that knows /1../3 must not take a later format for a broken cache (which `dil-jax
    index` deletes): it is refused as another format; format /3 is what a build writes."""
    _build(tmp_path / "cache")
    path = tmp_path / "cache" / "manifest.json"
    manifest = json.loads(path.read_text())
    assert manifest["format"] == "dil_jax.passage_cache/3"
    assert manifest["num_tokens"] == int(_windows()[1].sum()) and manifest["pad_id"] == PAD
    path.write_text(json.dumps(dict(manifest, format="dil_jax.passage_cache/9")))
    with pytest.raises(CacheMismatchError, match="format 'dil_jax.passage_cache/9', expected "
                                                 "one of") as raised:
        PassageCache.open(tmp_path / "cache", _key())
    assert not isinstance(raised.value, CacheBrokenError)
