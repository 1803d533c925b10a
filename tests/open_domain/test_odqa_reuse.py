"""The passage cache's first-upper-block arrays (`--cache-reuse`) and compressed storages, read by
the open-domain reader: the same answers and scores as without them, checked on open, refused
when they belong to another model or storage, broken files named.

A tiny random BERT (4 layers, hidden 32, 4 heads) with the MiniLM vocabulary, so the embedded
MiniLM tokenizer builds the index; the sample passages in 32-token windows.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from dil_jax.checkpoints import load_hf_checkpoint
from dil_jax.model.delayed import DelayedInteractionModel
from dil_jax.model.encoder_config import ReaderOverrides
from dil_jax.model.span_reader import PADDED_LOGIT
from dil_jax.open_domain.cache.build import build_passage_cache
from dil_jax.open_domain.cache.reuse import reuse_encoder
from dil_jax.open_domain.cache.storage import Storage
from dil_jax.open_domain.cache.store import (
    REUSE_LSE_ARRAY,
    REUSE_WIDE_ARRAYS,
    CacheBrokenError,
    CacheMismatchError,
    PassageCache,
    WindowBatch,
    cache_bytes_per_token,
)
from dil_jax.open_domain.index.corpus import Document, split_documents
from dil_jax.open_domain.index.folder import build_index, build_reader_cache, window_arrays
from dil_jax.open_domain.reader import OpenDomainReader
from dil_jax.open_domain.retrieval.engines import bm25_tokenize
from dil_jax.readers import EncoderReader
from dil_jax.samples import SAMPLE_PASSAGES
from dil_jax.tokenization import load_tokenizer

from tests.helpers import load_script, run_cli
from tests.helpers.index import zarr_array

P_LEN, STRIDE, Q_LEN = 32, 16, 16


def _zarr_bytes(folder: Path, name: str, tokens: int, row_bytes: int) -> int:
    """The bytes of one uncompressed zarr array of a ragged cache, by hand: its metadata
    (zarr.json, as written), then per shard file every chunk its tokens reach, stored whole
    (chunk_tokens rows and a 4-byte crc32c), and the shard's index (16 bytes per chunk of a
    whole shard, and its crc32c)."""
    metadata = json.loads((folder / name / "zarr.json").read_text())
    shard = metadata["chunk_grid"]["configuration"]["chunk_shape"][0]
    chunk = metadata["codecs"][0]["configuration"]["chunk_shape"][0]
    total = (folder / name / "zarr.json").stat().st_size
    for start in range(0, tokens, shard):
        chunks = -(-min(shard, tokens - start) // chunk)
        total += chunks * (chunk * row_bytes + 4) + 16 * (shard // chunk) + 4
    return total


@pytest.fixture(scope="module")
def tiny(hf_folder_factory, minilm_dir):
    folder = hf_folder_factory("bert", vocab_size=30522)[0]
    config, params, _ = load_hf_checkpoint(folder, ReaderOverrides(max_question_len=Q_LEN))
    return (EncoderReader(DelayedInteractionModel(config), params, load_tokenizer(minilm_dir)),
            folder)


def _index(root, tokenizer):
    documents = [Document(f"d{i}", f"T{i}", text) for i, text in enumerate(SAMPLE_PASSAGES)]
    return build_index(root / "index", split_documents(documents, "paragraphs"), tokenizer,
                       max_passage_len=P_LEN, doc_stride=STRIDE,
                       split={"strategy": "paragraphs"})


def _cache(index, reader, k, dtype="float32", reuse=True):
    loaded = reader.with_config(num_lower_layers=k)
    cache = build_reader_cache(
        index, loaded, storage=Storage.parse(dtype),
        encode=loaded.passage_encoder(batch_size=4),
        reuse=reuse_encoder(loaded, batch_size=4) if reuse else None)
    return loaded, cache


def _questions(index) -> list[str]:
    # The last question shares a word with every passage: every window is read.
    every = " ".join(bm25_tokenize(passage.text)[0] for passage in index.passages)
    return ["Who wrote Pride and Prejudice?", "When did Apollo 11 land on the Moon?",
            f"What links {every}?"]


def _read_spied(reader, questions):
    """(ReadResult, [(p_stats given, SpanScores) per read_pairs call])."""
    calls = []
    original = reader.grid.read_pairs

    def spy(*args, **kwargs):
        scores = original(*args, **kwargs)
        calls.append((kwargs.get("p_stats") is not None, scores))
        return scores

    reader.grid.read_pairs = spy
    return reader.read(questions), calls


@pytest.mark.parametrize("k", [3, 1])  # l = 4: k = l - 1 and k < l - 1
def test_reader_with_cached_reuse_equals_the_reader_without(tiny, tmp_path, k):
    """Same answers, and span/null scores within float32 rounding: the merge reorders a
    softmax's sums and the stored form rounds lse = m + log l once, a few float32 ulps (~1e-7
    relative) per step, carried through at most 3 blocks with LayerNorm; logits are O(1) here, so
    1e-5 is ~100 ulps of headroom (measured: at most 1.0e-6), while a wrong merge (lse without
    log l) is off by 2e-2."""
    base, _ = tiny
    index = _index(tmp_path, base.tokenizer)
    loaded, cache = _cache(index, base, k)
    assert cache.has_reuse and json.loads((cache.directory / "manifest.json").read_text())[
        "reuse"] is True
    questions = _questions(index)
    runs = {}
    for cached in (False, True):
        reader = OpenDomainReader(index, loaded, cache,
                                  top_p=len(index.passages), batch_size=4, chunk_size=8,
                                  cached_reuse=cached)
        assert reader.reads_cached_reuse == cached
        runs[cached] = _read_spied(reader, questions)
    (plain, plain_calls), (reused, reused_calls) = runs[False], runs[True]
    assert [given for given, _ in plain_calls] == [False] * len(plain_calls)
    assert [given for given, _ in reused_calls] == [True] * len(reused_calls)
    for before, after in zip(plain.candidates, reused.candidates, strict=True):
        assert [(c.passage_index, c.text, c.char_start) for c in before] == \
            [(c.passage_index, c.text, c.char_start) for c in after]
        np.testing.assert_allclose([c.reader_score for c in after],
                                   [c.reader_score for c in before], rtol=1e-5, atol=1e-5)
    for (_, before), (_, after) in zip(plain_calls, reused_calls, strict=True):
        for a, b in zip(before.arrays, after.arrays, strict=True):
            assert np.isfinite(a).all() and (np.abs(a) < -PADDED_LOGIT / 2).any()
            np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)
    # The reader as it was before the reuses (`pair_reuse=False`: every row of every upper
    # block, full attention in each pair), the reference `benchmarks/odqa_speed.py` times.
    reference = OpenDomainReader(index, loaded, cache,
                                 top_p=len(index.passages), batch_size=4, chunk_size=8,
                                 cached_reuse=False, pair_reuse=False)
    assert not reference.grid.reuse and not reference.reads_cached_reuse
    for before, after in zip(reference.read(questions).candidates, reused.candidates,
                             strict=True):
        assert [(c.passage_index, c.text, c.char_start) for c in before] == \
            [(c.passage_index, c.text, c.char_start) for c in after]
        np.testing.assert_allclose([c.reader_score for c in after],
                                   [c.reader_score for c in before], rtol=1e-5, atol=1e-5)


def test_prescreened_pairs_read_the_reuse_cache_as_before(tiny, tmp_path, minilm_dir):
    """Kept tokens attend only kept keys: prescreened pairs never take the cached statistics,
    and read exactly what they read from a cache without them."""
    from dil_jax.open_domain.index.sentences import build_sentence_store
    from dil_jax.open_domain.reader import ReaderPrescreen
    from dil_jax.prescreening.screen import SentenceRule

    from tests.helpers import random_prescreener

    base, _ = tiny
    index = _index(tmp_path, base.tokenizer)
    loaded, cache = _cache(index, base, 3)
    prescreener = random_prescreener(minilm_dir)
    screen = ReaderPrescreen(prescreener, SentenceRule(top_m=1),
                             build_sentence_store(index, prescreener))
    runs = {}
    for cached in (False, True):
        reader = OpenDomainReader(index, loaded, cache, top_p=4,
                                  batch_size=4, chunk_size=8, prescreen=screen,
                                  cached_reuse=cached)
        runs[cached] = _read_spied(reader, _questions(index))
    for _, calls in runs.values():
        assert calls and not any(given for given, _ in calls)
    for before, after in zip(runs[False][1], runs[True][1], strict=True):
        for a, b in zip(before[1].arrays, after[1].arrays, strict=True):
            np.testing.assert_array_equal(a, b)


def test_nothing_to_store_at_k_0_or_k_l(tiny):
    base, _ = tiny
    for k in (0, base.config.num_layers):
        assert reuse_encoder(base.with_config(num_lower_layers=k)) is None


@pytest.mark.parametrize("dtype", ["bfloat16", "int8", "pca8", "pq8"])
def test_compressed_cache_reads_its_round_trip_and_is_refused_under_another_name(
        tiny, tmp_path, dtype):
    base, _ = tiny
    index = _index(tmp_path, base.tokenizer)
    k = 3
    loaded, cache = _cache(index, base, k, dtype)
    storage, hidden, heads = Storage(dtype), base.config.hidden_size, base.config.num_heads
    # What was stored is the storage's round trip of a fresh computation (writer = reader), on
    # the real tokens (padding slots read as 0: a ragged cache stores none).
    arrays = window_arrays(index)
    real = np.asarray(arrays["mask"])[..., None] != 0
    fresh = loaded.passage_encoder(batch_size=4)(WindowBatch.of(
        np.arange(len(arrays["ids"])), arrays["ids"], arrays["mask"], arrays["offsets"]))
    # The real tokens row after row, as a read decodes them (one [tokens, width] batch: a
    # matrix product's float32 rounding depends on the shapes it is given, pca's and pq's
    # inverse rotation among them).
    tokens = real[..., 0]
    expected = np.zeros_like(fresh)
    expected[tokens] = cache.states.round_trip(fresh[tokens])
    np.testing.assert_array_equal(cache.read_states(range(len(cache))), expected)
    upper = reuse_encoder(loaded, batch_size=4)(fresh, np.asarray(arrays["mask"]))
    stored = cache.read_reuse(range(len(cache)))
    for name in REUSE_WIDE_ARRAYS:
        np.testing.assert_array_equal(stored[name],
                                      storage.without_pca().round_trip(upper[name]) * real)
    np.testing.assert_array_equal(stored[REUSE_LSE_ARRAY], upper[REUSE_LSE_ARRAY] * real)
    # Bytes per real token from the files: the scheme's codes (and scales, basis) on the
    # real tokens only, in the zarr layout counted by hand (`_zarr_bytes`); pq8: 8 uint8 codes
    # a token, a mean, a full-width rotation and 8 x 256 centroids of hidden / 8.
    sizes = cache_bytes_per_token(cache)
    tokens = int(real.sum())
    folder = cache.directory
    code_bytes = {"int8": hidden, "bfloat16": 2 * hidden, "pca8": 8, "pq8": 8}[dtype]
    expected = _zarr_bytes(folder, "states", tokens, code_bytes)
    if storage.scaled:
        expected += _zarr_bytes(folder, "states.scale", tokens, 4)
    if storage.has_basis:
        expected += (_zarr_bytes(folder, "states.pca_mean", hidden, 4)
                     + _zarr_bytes(folder, "states.pca_basis", hidden,
                                   4 * (storage.pca_dim or hidden)))
    if storage.pq_codes:
        expected += _zarr_bytes(folder, "states.pq_codebook", 8, 4 * 256 * hidden // 8)
    assert sizes["states"] == pytest.approx(expected / tokens)
    wide = storage.without_pca()
    expected_reuse = _zarr_bytes(folder, REUSE_LSE_ARRAY, tokens, 4 * heads)
    for name in REUSE_WIDE_ARRAYS:
        expected_reuse += _zarr_bytes(folder, name, tokens, wide.code_width(hidden)
                                      * wide.code_dtype.itemsize)
        if wide.scaled:
            expected_reuse += _zarr_bytes(folder, f"{name}.scale", tokens, 4)
    assert sizes["reuse"] == pytest.approx(expected_reuse / tokens)
    # The reader checks it on open (states and reuse arrays within the storage's own error)...
    opened = index.open_cache(loaded, Storage.parse(dtype))
    reader = OpenDomainReader(index, loaded, opened, top_p=4, batch_size=4,
                              chunk_size=8)
    assert reader.reads_cached_reuse
    result = reader.read(_questions(index))
    assert all(np.isfinite(c.reader_score) for cs in result.candidates for c in cs)
    # ... and a reader asking for another storage is refused, naming both.
    for other in ("float32", "int8" if dtype != "int8" else "pca8"):
        with pytest.raises(CacheMismatchError,
                           match=f"stores its states as '{dtype}' and this run reads '{other}' "
                                 f"\\(--cache-dtype {other}\\); give --cache-dtype {dtype}"):
            index.open_cache(loaded, Storage.parse(other))


def _other_query(params, layer: int):
    """params with the first upper block's query kernel changed: the same lower states (blocks
    1..k untouched), other q and attention statistics."""
    other = jax.tree.map(lambda x: x, params)
    block = dict(other[f"block_{layer}"])
    attention = dict(block["attention"])
    attention["query"] = dict(attention["query"],
                              kernel=attention["query"]["kernel"] * 1.5 + 0.1)
    block["attention"] = attention
    other[f"block_{layer}"] = block
    return other


def test_stats_of_another_model_are_refused_naming_the_file(tiny, tmp_path):
    base, _ = tiny
    index = _index(tmp_path, base.tokenizer)
    k = 2
    loaded, cache = _cache(index, base, k)
    other_params = _other_query(base.params, k)
    _, other = _cache(index, base.with_params(other_params), k)
    assert other.directory != cache.directory
    for name in ("upper_context", "upper_logsumexp"):
        shutil.rmtree(cache.directory / name)
        shutil.copytree(other.directory / name, cache.directory / name)
    # The file digests recorded at build time catch the copy first ...
    with pytest.raises(CacheBrokenError,
                       match=f"{cache.directory / 'upper_context' / 'c'}/.*: broken passage "
                             r"cache \(its sha256 differs"):
        index.open_cache(loaded)
    # ... and without them (a cache of older code) the recomputed arrays do.
    manifest_path = cache.directory / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    del manifest["files"], manifest["digest_sample"]
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(CacheBrokenError,
                       match=f"{cache.directory / 'upper_context'}: the stored "
                             "first-upper-block array upper_context does not match"):
        index.open_cache(loaded)
    # `dil-jax index` (the builder) rebuilds the broken cache instead of failing on it.
    _cache(index, base, k)
    index.open_cache(loaded)


def test_truncated_or_corrupt_stats_files_are_named(tiny, tmp_path):
    base, _ = tiny
    index = _index(tmp_path, base.tokenizer)
    _, cache = _cache(index, base, 3, "int8")
    lse = cache.directory / "upper_logsumexp" / "c" / "0" / "0"
    size = lse.stat().st_size
    with lse.open("r+b") as stream:
        stream.truncate(size // 2)
    with pytest.raises(CacheBrokenError, match=f"{lse}: broken passage cache"):
        PassageCache.open(cache.directory)
    shutil.rmtree(cache.directory)
    _, cache = _cache(index, base, 3, "int8")
    context_scale = cache.directory / "upper_context.scale" / "zarr.json"
    with context_scale.open("r+b") as stream:
        stream.write(b"not zarr metadata")
    with pytest.raises(CacheBrokenError, match=f"{context_scale}: broken passage cache"):
        PassageCache.open(cache.directory)
    # Unchecked against the digests, the metadata itself is refused, naming it.
    with pytest.raises(CacheBrokenError, match=f"{context_scale}: broken passage cache "
                                               r"\(unreadable"):
        PassageCache.open(cache.directory, verify="none")


def test_pq_states_are_float32_within_the_quantizer_error_faiss_measures(tiny, tmp_path):
    """A pq8 cache of the tiny index read back against the float32 states it was built from.
    The bound is the quantizer's own, measured by faiss on the same states: faiss's
    ProductQuantizer holding the cache's codebook (read from its zarr arrays) encodes and
    decodes the rotated states; as the rotation is orthonormal and a stored code is its
    sub-vector's nearest centroid, each token's error is at most faiss's (to float32
    rounding), and all but ties are equal."""
    faiss = pytest.importorskip("faiss")
    base, _ = tiny
    index = _index(tmp_path, base.tokenizer)
    loaded, cache = _cache(index, base, 3, "pq8", reuse=False)
    arrays = window_arrays(index)
    real = np.asarray(arrays["mask"]) != 0
    fresh = np.asarray(loaded.passage_encoder(batch_size=4)(WindowBatch.of(
        np.arange(len(arrays["ids"])), arrays["ids"], arrays["mask"], arrays["offsets"])))
    x = fresh[real].astype(np.float64)
    read = cache.read_states(range(len(cache)))
    assert not read[~real].any()  # padding slots: none stored, read as 0
    mean, basis, codebook = (zarr_array(cache.directory / f"states.{suffix}")
                             for suffix in ("pca_mean", "pca_basis", "pq_codebook"))
    quantizer = faiss.ProductQuantizer(x.shape[1], 8, 8)
    faiss.copy_array_to_vector(codebook.ravel(), quantizer.centroids)
    rotated = np.ascontiguousarray((x - mean) @ basis, np.float32)
    faiss_error = np.sum((rotated - quantizer.decode(quantizer.compute_codes(rotated))) ** 2,
                         axis=1)
    error = np.sum((x - read[real]) ** 2, axis=1)
    rounding = 1e-5 * np.sum(x ** 2, axis=1)  # float32 rotations there and back
    assert np.all(error <= faiss_error * (1 + 1e-4) + rounding)
    assert np.sum(error) >= np.sum(faiss_error) * (1 - 1e-4) - np.sum(rounding)
    # A quantizer, not a constant: far below the states' own variance.
    assert np.sum(error) < 0.5 * np.sum((x - x.mean(axis=0)) ** 2)


def test_reuse_arrays_asked_of_a_cache_without_them_are_refused(tiny, tmp_path):
    base, _ = tiny
    index = _index(tmp_path, base.tokenizer)
    _, plain = _cache(index, base, 3, reuse=False)
    assert not plain.has_reuse
    assert sorted(p.name for p in plain.directory.iterdir()) == [
        "ids", "manifest.json", "offsets", "states", "token_starts"]
    with pytest.raises(CacheMismatchError, match=r"--cache-reuse.*delete"):
        _cache(index, base, 3, reuse=True)
    shutil.rmtree(plain.directory)
    _cache(index, base, 3, reuse=True)
    # A cache with them serves a run that does not ask for them.
    assert _cache(index, base, 3, reuse=False)[1].has_reuse


@pytest.mark.parametrize("dtype", ["pca6", "pq8"])
def test_interrupted_fitted_build_resumes_with_its_basis(tiny, tmp_path, dtype):
    base, _ = tiny
    index = _index(tmp_path, base.tokenizer)
    loaded = base.with_config(num_lower_layers=2)
    config = loaded.config
    manifest = index.cache_key(loaded, Storage.parse(dtype))
    arrays = window_arrays(index)
    encode = loaded.passage_encoder(batch_size=4)
    reuse = reuse_encoder(loaded, batch_size=4)
    args = (manifest, arrays["ids"], arrays["mask"], arrays["offsets"])
    options = dict(chunk_passages=3, reuse=reuse, num_heads=config.num_heads)
    whole = build_passage_cache(tmp_path / "whole", *args, encode, **options)
    calls = []

    def failing(windows):
        if len(calls) == 3:  # the basis' sample, then two chunks
            raise KeyboardInterrupt("simulated interruption")
        calls.append(len(windows.ids))
        return encode(windows)

    with pytest.raises(KeyboardInterrupt):
        build_passage_cache(tmp_path / "resumed", *args, failing, **options)
    resumed = build_passage_cache(tmp_path / "resumed", *args, encode, **options)
    names = sorted(path.name for path in whole.directory.iterdir() if path.is_dir())
    assert {"states", "states.pca_basis", "upper_context.scale"} <= set(names)
    # pca6 stores int8 coordinates with scales, pq8 uint8 codes and a codebook.
    assert ("states.pq_codebook" in names) == (dtype == "pq8")
    assert ("states.scale" in names) == (dtype == "pca6")
    for name in names:  # every zarr array: codes, scales, the basis, the tokens
        np.testing.assert_array_equal(zarr_array(resumed.directory / name),
                                      zarr_array(whole.directory / name))


def test_cli_builds_and_reads_a_compressed_reuse_cache(tiny, tmp_path, capsys):
    _, folder = tiny
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"doc{i}", "title": f"T{i}", "text": text})
                              + "\n" for i, text in enumerate(SAMPLE_PASSAGES)))
    common = ["--checkpoint", str(folder), "--tokenizer", "default", "--max-question-len",
              str(Q_LEN), "--batch-size", "2", "--chunk-size", "8"]
    index = tmp_path / "index"
    build = ["index", "--out", str(index), "--corpus", f"jsonl:{corpus}", "--k", "3",
             "--max-passage-len", str(P_LEN), "--doc-stride", str(STRIDE), *common]
    status, _, err = run_cli([*build, "--cache-dtype", "int4"], capsys)
    assert status == 2 and "--cache-dtype" in err and "'int4'" in err
    status, _, err = run_cli([*build, "--cache-dtype", "pca64"], capsys)
    assert status == 1 and "'pca64'" in err and "1..32" in err
    status, _, err = run_cli([*build, "--cache-dtype", "int8", "--cache-reuse"], capsys)
    assert status == 0, err
    [cache] = index.glob("cache-k3-*")
    manifest = json.loads((cache / "manifest.json").read_text())
    assert manifest["dtype"] == "int8" and manifest["reuse"] is True
    ask = ["ask", "Who wrote Pride and Prejudice?", "--index", str(index), "--k", "3",
           "--top-p", "2", *common]
    status, out, err = run_cli([*ask, "--cache-dtype", "int8"], capsys)
    assert status == 0 and "A: " in out, err
    status, _, err = run_cli([*ask, "--cache-dtype", "float32"], capsys)
    assert status == 1
    assert "stores its states as 'int8'" in err and "give --cache-dtype int8" in err
    status, out, err = run_cli(ask, capsys)  # no --cache-dtype: the cache's own storage
    assert status == 0 and "A: " in out, err


def test_cli_builds_a_pq_cache_and_reads_it_without_faiss(tiny, tmp_path, capsys,
                                                         monkeypatch):
    """`index --cache-dtype pq8` on the sample passages, read back by `ask` and `odqa-eval`
    with faiss unimportable (reading needs none); bad names and a missing faiss are one line."""
    _, folder = tiny
    squad = _sample_squad(tmp_path)
    common = ["--checkpoint", str(folder), "--tokenizer", "default", "--max-question-len",
              str(Q_LEN), "--batch-size", "2", "--chunk-size", "8", "--k", "3"]
    index = tmp_path / "index"
    build = ["index", "--out", str(index), "--corpus", f"squad:{squad}", "--max-passage-len",
             str(P_LEN), "--doc-stride", str(STRIDE), *common]
    with monkeypatch.context() as without:
        without.setitem(sys.modules, "faiss", None)  # `import faiss` raises ImportError
        status, _, err = run_cli([*build, "--cache-dtype", "pq8"], capsys)
    assert status == 1 and not index.exists(), err  # refused before anything is built
    [line] = err.strip().splitlines()
    assert "--cache-dtype pq8" in line and "pip install 'dil_jax[pq]'" in line
    for bad in ("pq0", "pqx"):  # no hidden size makes these valid: argparse refuses them
        status, _, err = run_cli([*build, "--cache-dtype", bad], capsys)
        assert status == 2 and "--cache-dtype" in err and f"'{bad}'" in err, err
    status, _, err = run_cli([*build, "--cache-dtype", "pq7"], capsys)  # 7 does not divide 32
    assert status == 1 and "'pq7'" in err and "one of 1, 2, 4, 8, 16, 32" in err, err
    status, _, err = run_cli([*build, "--cache-dtype", "pq8", "--cache-reuse"], capsys)
    assert status == 0, err
    [cache] = index.glob("cache-k3-*")
    assert json.loads((cache / "manifest.json").read_text())["dtype"] == "pq8"
    assert zarr_array(cache / "states").dtype == np.uint8
    assert zarr_array(cache / "states").shape[1] == 8  # [real tokens, M]
    assert zarr_array(cache / "states.pq_codebook").shape == (8, 256, 4)
    assert zarr_array(cache / "upper_key").dtype == np.int8  # int8, as pca's
    # The rotation and codebook are digested like every array (checked on open).
    files = json.loads((cache / "manifest.json").read_text())["files"]
    assert {"states.pq_codebook/zarr.json", "states.pca_basis/zarr.json"} <= set(files)
    assert any(name.startswith("states.pq_codebook/c/") for name in files)
    monkeypatch.setitem(sys.modules, "faiss", None)
    ask = ["ask", "Who wrote Pride and Prejudice?", "--index", str(index), "--top-p", "2",
           *common]
    for storage in ([], ["--cache-dtype", "pq8"]):  # the cache's own storage, or named
        status, out, err = run_cli([*ask, *storage], capsys)
        assert status == 0 and "A: " in out, err
    status, _, err = run_cli([*ask, "--cache-dtype", "pq16"], capsys)
    assert status == 1 and "stores its states as 'pq8'" in err and "give --cache-dtype pq8" in err
    status, _, err = run_cli(["odqa-eval", "--index", str(index), "--data", str(squad), "--p",
                              "2", "--cache-dtype", "pq8", "--out", str(tmp_path / "eval"),
                              *common], capsys)
    assert status == 0, err
    [result] = json.loads((tmp_path / "eval" / "results.json").read_text())["results"].values()
    assert 0 <= result["by_p"]["2"]["F1"] <= 100


def _sample_squad(tmp_path) -> Path:
    """A two-article SQuAD v1.1 file made of the sample passages and three questions."""
    questions = [("Who wrote Pride and Prejudice?", "Jane Austen"),
                 ("When did Apollo 11 land on the Moon?", "20 July 1969"),
                 ("What is the capital of France?", "Paris")]
    data = {"version": "1.1", "data": []}
    for number, text in enumerate(SAMPLE_PASSAGES):
        qas = [{"id": f"q{number}-{i}", "question": question,
                "answers": [{"text": answer, "answer_start": text.index(answer)}]}
               for i, (question, answer) in enumerate(questions) if answer in text]
        data["data"].append({"title": f"A{number % 2}",
                             "paragraphs": [{"context": text, "qas": qas}]})
    squad = tmp_path / "squad.json"
    squad.write_text(json.dumps(data))
    return squad


def _benchmark(name: str):
    """A script of benchmarks/ imported as a module."""
    return load_script(f"benchmarks/{name}.py")


def test_compression_benchmark_runs_on_a_tiny_reader_and_resumes(tiny, tmp_path,
                                                                  monkeypatch):
    """benchmarks/cache_compression.py end to end on the tiny reader and a two-article SQuAD
    file made of the sample passages: every scheme's row, bytes per real token from its files
    (pq8's counted here by hand), the other storages holding the float32 cache's own states;
    killed in its second row, a rerun keeps the first row and the second's questions read, and
    a rerun of other settings is refused naming the row file."""
    base, folder = tiny
    squad = _sample_squad(tmp_path)
    bench = _benchmark("cache_compression")
    out = tmp_path / "out"
    argv = ["--checkpoint", str(folder), "--tokenizer", "default", "--k", "3",
            "--max-question-len", str(Q_LEN), "--data", str(squad),
            "--schemes", "float32", "int8", "pca8", "pq8", "--reuse", "--top-p", "3",
            "--max-passage-len", str(P_LEN), "--doc-stride", str(STRIDE),
            "--predict-max-passage-len", str(P_LEN), "--predict-doc-stride",
            str(STRIDE), "--batch-size", "2", "--chunk-size", "8", "--out", str(out)]
    predict = bench.predict_scores

    def killed_in_int8(reader, examples, cache, *args):
        if cache.storage.name == "int8":
            raise KeyboardInterrupt("simulated kill")
        return predict(reader, examples, cache, *args)

    monkeypatch.setattr(bench, "predict_scores", killed_in_int8)
    with pytest.raises(KeyboardInterrupt):
        bench.main(argv)
    name = f"k3-{folder.name}"
    rows_dir, progress = out / name / "rows", out / name / "progress" / "int8.jsonl"
    assert sorted(path.name for path in rows_dir.iterdir()) == ["float32.json"]
    kept, read = (rows_dir / "float32.json").read_text(), progress.read_text()
    assert len(read.splitlines()) == 2  # the settings, then the block of 3 questions
    monkeypatch.setattr(bench, "predict_scores", predict)
    rows = bench.main(argv)
    assert (rows_dir / "float32.json").read_text() == kept and progress.read_text() == read
    assert [row["scheme"] for row in rows] == ["float32", "int8", "pca8", "pq8"]
    assert all(row["reads_cached_reuse"] and row["reader"] == name for row in rows)
    hidden, heads = base.config.hidden_size, base.config.num_heads
    states = [row["bytes_per_real_token"]["states"] for row in rows]
    assert states[0] > 4 * hidden and hidden + 4 < states[1] < 4 * hidden and states[2] < states[1]
    # pq8: 8 uint8 codes a real token, a mean, a rotation and a codebook, in zarr's layout.
    pq8 = out / name / "caches" / "pq8"
    tokens = json.loads((pq8 / "manifest.json").read_text())["num_tokens"]
    by_hand = (_zarr_bytes(pq8, "states", tokens, 8) + _zarr_bytes(pq8, "states.pca_mean",
                                                                   hidden, 4)
               + _zarr_bytes(pq8, "states.pca_basis", hidden, 4 * hidden)
               + _zarr_bytes(pq8, "states.pq_codebook", 8, 4 * 256 * hidden // 8))
    assert rows[3]["bytes_per_real_token"]["states"] == pytest.approx(by_hand / tokens)
    # What the reuse arrays add (stored here): int8 q, k, v, context and float32 statistics.
    assert rows[1]["reuse_if_stored"] == 4 * (hidden + 4) + 4 * heads
    # The int8 cache holds the float32 cache's states, quantized (by hand here).
    caches = {scheme: PassageCache.open(out / name / "caches" / scheme, verify="none")
              for scheme in ("float32", "int8")}
    x = caches["float32"].read_states(range(len(caches["float32"])))
    scale = np.abs(x).max(axis=-1, keepdims=True) / 127
    np.testing.assert_allclose(caches["int8"].read_states(range(len(x))),
                               np.round(x / np.where(scale > 0, scale, 1)) * scale,
                               rtol=0, atol=1e-6)
    for row in rows:
        assert row["open_domain"]["questions"] == 3 and 0 <= row["predict"]["F1"] <= 100
    record = json.loads((out / name / "cache_compression.json").read_text())
    assert record["rows"][1]["bytes_per_real_token"] == rows[1]["bytes_per_real_token"]
    assert record["k"] == 3 and record["hidden"] == hidden
    # What tools/wikipedia_projection.py takes from such a record: the measured bytes.
    projection = load_script("tools/wikipedia_projection.py")
    projected = projection.storage_row("pq8", record["rows"][3], hidden, heads, 1e6, 1e4,
                                       "c.json")
    assert projected["source"] == "measured (c.json)"
    assert projected["states_bytes_per_token"] == rows[3]["bytes_per_real_token"]["states"]
    assert (out / name / "cache_compression.md").read_text().count("\n") == 6
    with pytest.raises(SystemExit, match=r"rows/float32.json: made with top_p = 3, this run "
                                         r"has 2; delete it"):
        bench.main([*argv[:argv.index("--top-p")], "--top-p", "2",
                    *argv[argv.index("--top-p") + 2:]])


def test_odqa_speed_benchmark_reads_the_same_answers_four_ways(tiny, tmp_path):
    """benchmarks/odqa_speed.py end to end on the tiny reader: for each k, the reader before the
    reuses, with the pair program's reuses, with padding trimmed and with the cached arrays, on
    the same questions;
    the same answers and reader scores within float32 rounding (as above), and the record."""
    _, folder = tiny
    squad = _sample_squad(tmp_path)
    rows = _benchmark("odqa_speed").main([
        "--checkpoint", str(folder), "--tokenizer", "default", "--ks", "3", "1",
        "--max-question-len", str(Q_LEN), "--data", str(squad), "--limit", "3", "--top-p", "3",
        "--max-passage-len", str(P_LEN), "--doc-stride", str(STRIDE), "--repeats", "1",
        "--batch-size", "2", "--chunk-size", "8", "--work", str(tmp_path / "work"),
        "--out", str(tmp_path / "out" / "odqa_speed")])
    assert [(row["k"], row["mode"]) for row in rows] == [
        (k, mode) for k in (3, 1) for mode in ("before", "pair reuse", "+ trim", "+ cache")]
    for row in rows:
        assert row["same_answer_share"] == 1.0 and row["max_score_difference"] < 1e-5
        assert row["reads_cached_reuse"] == (row["mode"] == "+ cache")
        assert row["speedup"] > 0 and len(row["walls_s"]) == 1
        # The same answers as `before` of its k: the same EM / F1, without and with IR.
        before = next(r for r in rows if r["k"] == row["k"] and r["mode"] == "before")
        assert [row[m] for m in ("em", "f1", "em_ir", "f1_ir")] == [
            before[m] for m in ("em", "f1", "em_ir", "f1_ir")]
    record = json.loads((tmp_path / "out" / "odqa_speed.json").read_text())
    assert record["questions"] == 3 and len(record["rows"]) == 8
    assert (tmp_path / "out" / "odqa_speed.md").read_text().count("| 3 | ") == 4


def test_odqa_speed_scores_answers_without_and_with_the_ir_score():
    """EM / F1 of a read's answers, by hand. Question 1 has two candidates, question 2 none
    (EM 0, F1 0). F1 of "Paris France" against "Paris": precision 1/2, recall 1 -> 2/3."""
    from types import SimpleNamespace

    from dil_jax.open_domain.scoring import Candidate

    answer_scores = _benchmark("odqa_speed").answer_scores

    def candidate(index, text, reader, bm25):
        return Candidate(passage_index=index, rank=index, text=text, char_start=0,
                         char_end=len(text), reader_score=reader, bm25_score=bm25)

    examples = [SimpleNamespace(answer_texts=["Paris"]), SimpleNamespace(answer_texts=["x"])]
    read = SimpleNamespace(candidates=[[candidate(0, "Paris France", 3.0, 0.0),
                                        candidate(1, "Paris", 1.0, 10.0)], []])
    scores = answer_scores(examples, read, 0.9)
    # Reader alone: "Paris France" (EM 0, F1 2/3); fused at 0.9 with BM25's 0.1 weight:
    # standardized reader (1, -1), BM25 (-1, 1): 0.9 - 0.1 = 0.8 vs -0.8: still "Paris France".
    assert scores == {"em": 0.0, "f1": 100 * (2 / 3) / 2, "em_ir": 0.0,
                      "f1_ir": 100 * (2 / 3) / 2}
    scores = answer_scores(examples, read, 0.1)  # BM25 weighs 0.9: "Paris" wins fused
    assert scores["em_ir"] == 50.0 and scores["f1_ir"] == 50.0 and scores["em"] == 0.0


def test_odqa_speed_benchmark_rows_of_window_pruning(tiny, tmp_path):
    """The pruned modes (issue 63), at a split and for the full reader (k = 0): the exact stop
    gives the fused answers of the full read from no more pairs; stop:H reads what it reads;
    pairs and tokens recorded in every row."""
    _, folder = tiny
    squad = _sample_squad(tmp_path)
    rows = _benchmark("odqa_speed").main([
        "--checkpoint", str(folder), "--tokenizer", "default", "--ks", "3", "0",
        "--max-question-len", str(Q_LEN), "--data", str(squad), "--limit", "3", "--top-p", "3",
        "--max-passage-len", str(P_LEN), "--doc-stride", str(STRIDE), "--repeats", "1",
        "--batch-size", "2", "--chunk-size", "8", "--work", str(tmp_path / "work"),
        "--modes", "before", "stop", "stop:H", "--prune-high", "-100",
        "--out", str(tmp_path / "out" / "odqa_speed")])
    assert [(row["k"], row["mode"]) for row in rows] == [
        (k, mode) for k in (3, 0) for mode in ("before", "stop", "stop:H")]
    for before, stop, guess in (rows[:3], rows[3:]):
        assert stop["same_fused_answer_share"] == 1.0 and stop["max_score_difference"] < 1e-5
        assert stop["pruning"]["high"] is None and guess["pruning"]["high"] == -100
        assert guess["pairs_per_question"] <= stop["pairs_per_question"] <= \
            before["pairs_per_question"]
    assert all(row["tokens_per_pair"] > 0 for row in rows)


@pytest.mark.parametrize("cached", [True, False])
def test_a_resident_passage_side_reads_what_a_padded_copy_reads(tiny, tmp_path, cached):
    """A served reader (`passage_rows` set) keeps its passage side on the devices and writes
    only each read's rows into it (`ResidentRows`); rows past them hold an earlier read's. The
    same candidates and scores as the reader that pads a fresh copy every read, question by
    question (so a later read writes fewer rows over more: the every-window question first)
    and under the exact window pruning (rounds of different row counts). Identical pairs run
    the same programs on the same values: only the chunk a pair lands in differs, which
    changes float32 summation order, so 1e-5 as above."""
    from dil_jax.open_domain.pruning import WindowPruning

    base, _ = tiny
    index = _index(tmp_path, base.tokenizer)
    loaded, cache = _cache(index, base, 3)
    questions = _questions(index)[::-1]

    def reader(passage_rows, pruning=None):
        return OpenDomainReader(index, loaded, cache, top_p=len(index.passages), batch_size=1,
                                chunk_size=4, cached_reuse=cached, passage_rows=passage_rows,
                                pruning=pruning)

    total = int(np.asarray(index.windows.count).sum())
    for pruning in (None, WindowPruning(mu=0.5)):
        copied, resident = reader(None, pruning), reader(total, pruning)
        assert resident.reads_cached_reuse == cached
        for question in questions:
            before, after = copied.read([question]), resident.read([question])
            assert before.pairs_read == after.pairs_read
            assert [(c.passage_index, c.text, c.char_start) for c in before.candidates[0]] == \
                [(c.passage_index, c.text, c.char_start) for c in after.candidates[0]]
            np.testing.assert_allclose([c.reader_score for c in after.candidates[0]],
                                       [c.reader_score for c in before.candidates[0]],
                                       rtol=1e-5, atol=1e-5)
