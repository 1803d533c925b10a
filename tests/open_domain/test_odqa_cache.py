"""The passage cache returns exactly what encode_lower computed, refuses a mismatched reader,
and resumes an interrupted build without redoing finished chunks."""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import pytest

from dil_jax.checkpoints import load_hf_checkpoint, params_fingerprint
from dil_jax.model.delayed import DelayedInteractionModel
from dil_jax.model.encoder_config import ReaderOverrides
from dil_jax.model.span_reader import PASSAGE_SEGMENT
from dil_jax.open_domain.cache.build import build_passage_cache
from dil_jax.open_domain.cache.check import reader_cache_key
from dil_jax.open_domain.cache.manifest import CacheKey, CacheManifest
from dil_jax.open_domain.cache.storage import Storage
from dil_jax.open_domain.cache.store import (
    CacheMismatchError,
    PassageCache,
    WindowBatch,
)
from dil_jax.open_domain.cache.zarr_store import TokenGrid
from dil_jax.reading.grid import PairGrid

P_LEN = 16


@pytest.fixture(scope="module")
def reader_parts(hf_folder_factory):
    config, params, _ = load_hf_checkpoint(hf_folder_factory("bert")[0],
                                           ReaderOverrides(num_lower_layers=2, max_question_len=8))
    rng = np.random.default_rng(0)
    lengths = rng.integers(3, P_LEN + 1, 10)
    ids = np.zeros((10, P_LEN), np.int32)
    for row, n in enumerate(lengths):
        ids[row, :n] = [*rng.integers(5, 99, n - 1), 3]
    mask = (ids > 0).astype(np.int32)
    # As window_contexts makes them: characters of the tokens, NO_OFFSET for padding.
    offsets = np.full((10, P_LEN, 2), -1, np.int32)
    for row, n in enumerate(lengths):
        offsets[row, :n - 1] = np.stack([np.arange(n - 1) * 3, np.arange(n - 1) * 3 + 2], -1)
    return config, params, ids, mask, offsets


def _encoder(config, params):
    reader = PairGrid(DelayedInteractionModel(config), batch_size=4)
    return lambda windows: np.asarray(reader.encode_passages(params, windows.ids, windows.mask))


def _all(ids, mask, offsets) -> WindowBatch:
    """Every row as one WindowBatch."""
    return WindowBatch.of(np.arange(len(ids)), ids, mask, offsets)


def _real(states: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """states [n, p_len, hidden] with the padding slots 0: what a ragged cache gives back (it
    stores real tokens only)."""
    return states * (np.asarray(mask) != 0)[..., None]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cache_reads_equal_encode_lower(reader_parts, tmp_path, dtype):
    config, params, ids, mask, offsets = reader_parts
    manifest = reader_cache_key(config, params_fingerprint(params),
                                "tok", P_LEN, "passages-v1", Storage.parse(dtype))
    encode = _encoder(config, params)
    cache = build_passage_cache(tmp_path / "cache", manifest, ids, mask, offsets, encode,
                                chunk_passages=3)
    subset = [7, 2, 9]
    expected = _real(encode(_all(ids, mask, offsets))[subset], mask[subset])
    if dtype == "bfloat16":
        expected = expected.astype(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(cache.read_states(subset), expected)
    direct = DelayedInteractionModel(config).encode_lower(params, ids[subset], mask[subset],
                                                          PASSAGE_SEGMENT)
    np.testing.assert_allclose(cache.read_states(subset), _real(np.asarray(direct),
                                                                mask[subset]),
                               atol=1e-5 if dtype == "float32" else 0.05)
    for name, array in (("ids", ids), ("mask", mask), ("offsets", offsets)):
        np.testing.assert_array_equal(getattr(cache, name)[subset], array[subset])
    # Ragged zarr arrays (folders), no padding slots: the mask is the row lengths.
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [
        "ids", "manifest.json", "offsets", "states", "token_starts"]
    assert cache.num_tokens == int(mask.sum())


def test_mismatched_reader_is_refused(reader_parts, tmp_path):
    config, params, ids, mask, offsets = reader_parts
    manifest = reader_cache_key(config, params_fingerprint(params), "tok", P_LEN, "passages-v1")
    build_passage_cache(tmp_path / "cache", manifest, ids, mask, offsets,
                        _encoder(config, params))
    other_k = reader_cache_key(config.replace(num_lower_layers=3), params_fingerprint(params),
                               "tok", P_LEN,
                              "passages-v1")
    with pytest.raises(CacheMismatchError, match="num_lower_layers = 2, but the reader has "
                                                 "num_lower_layers = 3"):
        PassageCache.open(tmp_path / "cache", other_k)
    changed = {**params, "qa_outputs": {"kernel": params["qa_outputs"]["kernel"] + 1,
                                        "bias": params["qa_outputs"]["bias"]}}
    other_model = reader_cache_key(config, params_fingerprint(changed), "tok", P_LEN, "passages-v1")
    with pytest.raises(CacheMismatchError, match="cache built with model = "):
        PassageCache.open(tmp_path / "cache", other_model)
    with pytest.raises(CacheMismatchError, match="tokenizer"):
        PassageCache.open(tmp_path / "cache", dataclasses.replace(manifest, tokenizer="other"))


# Shards of 8 tokens (chunks of 4): a 10-row cache of 3..16 tokens a row has several, so an
# interrupted build has written some of them.
SMALL_GRID = TokenGrid(4, 8)


def _resumed_chunks(mask: np.ndarray, chunks_done: int, chunk: int) -> list[list[int]]:
    """The chunks a build interrupted after `chunks_done` chunks encodes again, by hand: it
    wrote every whole shard of SMALL_GRID the finished rows filled; it resumes at the chunk
    of the first row whose tokens are not all in them."""
    ends = np.cumsum(mask.sum(axis=1))  # token after each row's last
    written = ends[chunks_done * chunk - 1] // SMALL_GRID.shard_tokens * SMALL_GRID.shard_tokens
    first = int(np.argmax(ends > written))
    rows = list(range(first // chunk * chunk, len(mask)))
    return [rows[i:i + chunk] for i in range(0, len(rows), chunk)]


def test_interrupted_build_resumes(reader_parts, tmp_path):
    config, params, ids, mask, offsets = reader_parts
    manifest = reader_cache_key(config, params_fingerprint(params), "tok", P_LEN, "passages-v1")
    encode = _encoder(config, params)
    calls = []

    def failing(windows):
        if len(calls) == 2:
            raise KeyboardInterrupt("simulated interruption")
        calls.append(len(windows.ids))
        return encode(windows)

    with pytest.raises(KeyboardInterrupt):
        build_passage_cache(tmp_path / "cache", manifest, ids, mask, offsets, failing,
                            chunk_passages=3, grid=SMALL_GRID)
    with pytest.raises(CacheMismatchError, match="unfinished build exists"):
        PassageCache.open(tmp_path / "cache")

    resumed = []

    def counting(windows):
        resumed.append(windows.rows.tolist())  # the index rows it is asked for
        return encode(windows)

    cache = build_passage_cache(tmp_path / "cache", manifest, ids, mask, offsets, counting,
                                chunk_passages=3, grid=SMALL_GRID)
    expected = _resumed_chunks(mask, 2, 3)
    assert calls == [3, 3] and resumed == expected and len(expected) < 4  # not from row 0
    np.testing.assert_array_equal(cache.read_states(range(10)),
                                  _real(encode(_all(ids, mask, offsets)), mask))
    assert not list(tmp_path.glob(".cache.partial"))


def test_a_resumed_build_does_not_count_what_it_wrote_again(reader_parts, tmp_path,
                                                             monkeypatch):
    """After a disk filled during `index`, the rerun was refused: the free-space check counted
    the whole cache again, whose written part the partial build holds on disk. A disk with
    room for the whole less what the partial build holds (and the spare) resumes it, where a
    new build of the same cache is refused."""
    import collections

    from dil_jax.open_domain.cache import build as cache_build

    config, params, ids, mask, offsets = reader_parts
    manifest = reader_cache_key(config, params_fingerprint(params), "tok", P_LEN, "passages-v1")
    encode = _encoder(config, params)
    calls = []

    def failing(windows):
        if len(calls) == 2:
            raise KeyboardInterrupt("simulated: the disk filled")
        calls.append(len(windows.ids))
        return encode(windows)

    with pytest.raises(KeyboardInterrupt):
        build_passage_cache(tmp_path / "cache", manifest, ids, mask, offsets, failing,
                            chunk_passages=3, grid=SMALL_GRID)
    staging = tmp_path / ".cache.partial"
    held = cache_build.allocated_bytes(staging)
    # Real tokens x (float32 states + int32 id + two int32 offsets) + int64 token starts.
    whole = int(mask.sum()) * (4 * config.hidden_size + 12) + 8 * 11
    assert 0 < held
    usage = collections.namedtuple("usage", "total used free")
    spare = 16 << 20  # the least spare
    monkeypatch.setattr(cache_build.shutil, "disk_usage",
                        lambda path: usage(0, 0, max(whole - held, 0) + spare))
    with pytest.raises(cache_build.DiskSpaceError, match=r"\(10 of 10 windows to write\)"):
        build_passage_cache(tmp_path / "other", manifest, ids, mask, offsets, encode,
                            chunk_passages=3, grid=SMALL_GRID)
    cache = build_passage_cache(tmp_path / "cache", manifest, ids, mask, offsets, encode,
                                chunk_passages=3, grid=SMALL_GRID)
    np.testing.assert_array_equal(cache.read_states(range(10)),
                                  _real(encode(_all(ids, mask, offsets)), mask))


def test_build_that_would_not_fit_is_refused_before_writing(reader_parts, tmp_path,
                                                             monkeypatch):
    """A cache whose arrays would not fit in the disk's free space is refused before anything is
    written, naming what and how much; the bytes are a hand count per real token: float32
    states 4 x hidden, int32 ids + 2 offsets 12 (no mask, no padding), and with the reuse
    arrays four more hidden-wide float32 arrays and a float32 per head; plus an int64 token
    start per row and one more."""
    import collections

    from dil_jax.open_domain.cache import build as cache_build
    from dil_jax.open_domain.cache.storage import Storage

    config, params, ids, mask, offsets = reader_parts
    hidden = config.hidden_size
    key = CacheKey(model="m", architecture="bert", num_lower_layers=1, hidden_size=384,
                   tokenizer="t", max_passage_len=P_LEN, storage=Storage("float32"), passages="p")
    assert cache_build.cache_bytes_per_window_token(
        CacheManifest(key, num_passages=1, reuse=True, num_heads=12), True) == \
        384 * 4 * 5 + 12 * 4
    manifest = reader_cache_key(config, params_fingerprint(params), "tok", P_LEN, "passages-v1")
    needed = int(mask.sum()) * (4 * hidden + 12) + 8 * 11
    usage = collections.namedtuple("usage", "total used free")
    margin = 16 << 20  # the least spare (5% of this small cache is less)
    monkeypatch.setattr(cache_build.shutil, "disk_usage",
                        lambda path: usage(0, 0, needed + margin - 1))
    with pytest.raises(cache_build.DiskSpaceError,
                       match=rf"the passage cache cache \(10 of 10 windows to write\) needs "
                             rf"{needed / 2**20:.1f} MiB and .* free"):
        build_passage_cache(tmp_path / "cache", manifest, ids, mask, offsets,
                            _encoder(config, params))
    assert not list(tmp_path.iterdir())
    monkeypatch.setattr(cache_build.shutil, "disk_usage",
                        lambda path: usage(0, 0, needed + margin))
    build_passage_cache(tmp_path / "cache", manifest, ids, mask, offsets,
                        _encoder(config, params))
    assert (tmp_path / "cache" / "manifest.json").exists()


def test_a_shard_encodes_its_own_index_rows(reader_parts, tmp_path):
    """A shard's arrays start at its first row, but its encoder is told the index's rows (a
    reader of characters finds each window's passage text by them)."""
    config, params, ids, mask, offsets = reader_parts
    manifest = reader_cache_key(config, params_fingerprint(params), "tok", P_LEN, "passages-v1")
    encode = _encoder(config, params)
    seen = []

    def recording(windows):
        seen.append(windows.rows.tolist())
        np.testing.assert_array_equal(windows.ids, ids[windows.rows])
        return encode(windows)

    build_passage_cache(tmp_path / "shard", manifest, ids[6:], mask[6:], offsets[6:], recording,
                        chunk_passages=3, shard=dict(index=1, count=2, start=6, stop=10))
    assert seen == [[6, 7, 8], [9]]


def test_sharded_build_is_checked_for_all_its_shards(reader_parts, tmp_path, monkeypatch):
    """A sharded build whose shards each fit the free space but not all together is refused by
    process 0 before any shard starts: every shard writes to the same disk. The bytes are the
    hand count above, for all 10 windows (shards of rows 0-5 and 6-9 at chunks of 3)."""
    import collections

    from dil_jax.open_domain.cache import build as cache_build
    from dil_jax.open_domain.cache.shards import build_sharded_passage_cache
    from dil_jax.open_domain.cache.store import ShardWaitError

    config, params, ids, mask, offsets = reader_parts
    manifest = reader_cache_key(config, params_fingerprint(params), "tok", P_LEN, "passages-v1")
    whole = int(mask.sum()) * (4 * config.hidden_size + 12) + 8 * 11
    margin = 16 << 20  # the least spare (5% of this small cache is less)
    usage = collections.namedtuple("usage", "total used free")

    def build():
        return build_sharded_passage_cache(
            tmp_path / "cache", manifest, ids, mask, offsets, _encoder(config, params),
            process_index=0, process_count=2, chunk_passages=3,
            wait_timeout_s=0.0)

    # Room for the larger shard (6 windows), not for all 10.
    monkeypatch.setattr(cache_build.shutil, "disk_usage",
                        lambda path: usage(0, 0, whole + margin - 1))
    with pytest.raises(cache_build.DiskSpaceError,
                       match=r"the passage cache cache \(10 of 10 windows to write, 2 shards "
                             r"together\) needs"):
        build()
    assert not list(tmp_path.iterdir())
    # Room for all 10: process 0 builds its shard, then waits for process 1's (not started).
    monkeypatch.setattr(cache_build.shutil, "disk_usage",
                        lambda path: usage(0, 0, whole + margin))
    with pytest.raises(ShardWaitError, match="shard-00001-of-00002"):
        build()
    assert (tmp_path / ".cache.partial" / "shards" / "shard-00000-of-00002" /
            "manifest.json").is_file()


@pytest.mark.parametrize("kind", ["qanet", "bidaf", "encoder"])
def test_a_readers_key_names_the_settings_that_change_its_passage_states(kind):
    """The same weights with another word scale (or LSH in QANet's embedding encoder, in a BERT
    reader's lower blocks) compute other passage states, so they need another cache: the key's
    model differs. At the defaults, and with LSH only after the cached side (QANet's model
    encoder, a BERT reader's upper blocks), the key is the params' fingerprint alone, as caches
    built before these settings existed recorded it."""
    from dil_jax.checkpoints.fingerprint import params_fingerprint
    from dil_jax.model.bidaf_config import BiDAFConfig
    from dil_jax.model.encoder_config import EncoderConfig
    from dil_jax.model.qanet_config import QANetConfig

    params = {"w": np.arange(6, dtype=np.float32)}
    base = {"qanet": QANetConfig(), "bidaf": BiDAFConfig(),
            "encoder": EncoderConfig(num_layers=4, num_lower_layers=2)}[kind]

    def model(config):
        return reader_cache_key(config, params_fingerprint(params),
                                "tok", P_LEN, "passages-v1").model

    assert model(base) == params_fingerprint(params)
    if kind == "encoder":
        assert model(base.replace(lsh_attention_layers=(2, 3))) == model(base)
        others = [base.replace(lsh_attention_layers=(0, 1)),
                  base.replace(lsh_attention_layers=(1, 3)),
                  base.replace(lsh_attention_layers=(0, 1), lsh_num_hashes=4)]
    else:
        others = [base.replace(word_scale=18.0), base.replace(word_scale=2.0)]
    if kind == "qanet":
        assert model(base.replace(lsh_encoders=("model",))) == model(base)
        others += [base.replace(lsh_encoders=("embedding",)),
                   base.replace(lsh_encoders=("embedding",), lsh_bucket_size=32)]
    keys = [model(config) for config in others]
    assert len(set(keys)) == len(keys) and model(base) not in keys
