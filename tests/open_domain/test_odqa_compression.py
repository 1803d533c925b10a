"""Each passage-cache storage scheme against its own error bound, computed here with numpy:
int8 |x - x^| <= s/2 with s = max|x|/127 per token; bfloat16 relative 2^-8; PCA's error is the
discarded variance of a numpy SVD (plus, stored, exactly its int8 coordinates' error); pq<M>'s
codes are faiss's own nearest centroids (faiss's `compute_codes` / `decode` on the same rotated
rows), and a hand-built codebook decodes exactly."""

from __future__ import annotations

import dataclasses
import json
import sys

import numpy as np
import pytest

from dil_jax.open_domain.cache import storage as storage_module
from dil_jax.open_domain.cache.storage import (
    CacheStorageError,
    PcaBasis,
    Storage,
    dequantize_int8,
    fit_pca,
    fit_pq,
    quantize_int8,
)


def _states(rows: int = 300, width: int = 48, seed: int = 0) -> np.ndarray:
    """Token rows with a decaying spectrum, an offset mean, one outlier dimension (as BERT states
    have) and rows of very different norms."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, width)) * np.geomspace(3.0, 0.01, width)
    x = x @ np.linalg.qr(rng.normal(size=(width, width)))[0] + rng.normal(size=width)
    x[:, 5] *= 20.0
    return (x * rng.uniform(0.01, 10.0, (rows, 1))).astype(np.float32)


def test_int8_error_is_at_most_half_a_step_per_element():
    x = _states()
    x[3] = 0.0  # an all-zero token: scale 0, decoded exactly
    codes, scale = quantize_int8(x)
    expected_scale = np.abs(x).max(axis=1) / 127.0
    np.testing.assert_allclose(scale, expected_scale, rtol=1e-6)
    assert codes.dtype == np.int8 and np.abs(codes.astype(int)).max() == 127
    restored = dequantize_int8(codes, scale)
    error = np.abs(x - restored)
    # s/2 by construction, plus float32 rounding of code * s (a few ulps of |x|).
    assert np.all(error <= expected_scale[:, None] / 2 + 1e-6 * np.abs(x) + 1e-30)
    np.testing.assert_array_equal(restored[3], 0.0)
    np.testing.assert_array_equal(Storage("int8").round_trip(x), restored)


def test_bfloat16_relative_error_is_at_most_2_to_the_minus_8():
    x = _states(seed=1)
    restored = Storage("bfloat16").round_trip(x)
    # Round to nearest with an 8-bit significand: relative error <= 2^-8 (half an ulp of 2^-7).
    assert np.all(np.abs(x - restored) <= 2.0 ** -8 * np.abs(x))
    codes, scale = Storage("bfloat16").encode(x)
    assert codes.dtype == np.uint16 and scale is None


@pytest.mark.parametrize("dim", [4, 16, 47])
def test_pca_error_is_the_discarded_variance_plus_the_int8_error_of_its_coordinates(dim):
    x = _states(seed=2)
    basis = fit_pca(x, dim)
    centered = x.astype(np.float64) - x.astype(np.float64).mean(axis=0)
    singular = np.linalg.svd(centered, compute_uv=False)
    discarded = float(np.sum(singular[dim:] ** 2))
    # Float coordinates: the squared reconstruction error is the discarded variance.
    coordinates = basis.project(x)
    error = float(np.sum((x.astype(np.float64) - basis.reconstruct(coordinates)) ** 2))
    total = float(np.sum(singular ** 2))
    assert abs(error - discarded) <= 1e-5 * total
    # Stored (pca<d>): int8 coordinates with per-token scales. The quantisation error lies in the
    # basis' span, orthogonal to the discarded part, and the basis is orthonormal, so the
    # squared errors add up exactly and each coordinate is off by at most s/2.
    storage = Storage(f"pca{dim}")
    codes, scale = storage.encode(x, basis)
    assert codes.shape == (len(x), dim) and codes.dtype == np.int8
    expected_scale = np.abs(coordinates).max(axis=1) / 127.0
    np.testing.assert_allclose(scale, expected_scale, rtol=1e-6)
    coordinate_error = coordinates - dequantize_int8(codes, scale)
    assert np.all(np.abs(coordinate_error) <= expected_scale[:, None] / 2 * (1 + 1e-5))
    restored = storage.decode(codes, scale, basis)
    stored_error = float(np.sum((x.astype(np.float64) - restored) ** 2))
    expected = discarded + float(np.sum(coordinate_error.astype(np.float64) ** 2))
    assert abs(stored_error - expected) <= 1e-5 * total


def test_pca_basis_is_orthonormal_and_spans_the_top_singular_vectors():
    x = _states(seed=3)
    basis = fit_pca(x, 6)
    np.testing.assert_allclose(basis.basis.T @ basis.basis, np.eye(6), atol=1e-5)
    _, _, vt = np.linalg.svd(x - x.mean(axis=0), full_matrices=False)
    # The same subspace as numpy's top-6 right singular vectors (signs may differ).
    projector = vt[:6].T @ vt[:6]
    np.testing.assert_allclose(basis.basis @ basis.basis.T, projector, atol=1e-4)


def test_storage_names_and_bytes_per_token():
    assert [Storage.parse(n).bytes_per_token(384) for n in ("float32", "bfloat16", "int8",
                                                            "pca64", "pca96", "pq32", "pq48",
                                                            "pq64")] == [
        4 * 384, 2 * 384, 384 + 4, 64 + 4, 96 + 4, 32, 48, 64]
    assert Storage("pq32").code_dtype == np.uint8 and not Storage("pq32").scaled
    # Beside the codes: pca<d> its mean and d directions, pq<M> a full rotation and a codebook.
    assert Storage("pca64").basis_shapes(384) == {"pca_mean": (384,), "pca_basis": (384, 64)}
    assert Storage("pq32").basis_shapes(384) == {"pca_mean": (384,), "pca_basis": (384, 384),
                                                 "pq_codebook": (32, 256, 12)}
    assert Storage("int8").basis_shapes(384) == {}
    assert Storage("pca64").without_pca() == Storage("int8")
    assert Storage("pq32").without_pca() == Storage("int8")
    assert Storage("bfloat16").without_pca() == Storage("bfloat16")
    for bad in ("int4", "float16", "pca", "pca0", "PCA64", "pq", "pq0", "pqx", "PQ32", "pq032",
                "pq-8"):
        with pytest.raises(CacheStorageError, match=repr(bad)):
            Storage.parse(bad)
    with pytest.raises(CacheStorageError, match=r"'pca33'.*1\.\.32"):
        Storage.parse("pca33", width=32)
    # M must divide the hidden size; the message lists the M that do.
    with pytest.raises(CacheStorageError, match=r"'pq7'.*divide the hidden size 384: one of "
                                                r"1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, "
                                                r"128, 192, 384$"):
        Storage.parse("pq7", width=384)
    assert Storage.parse("pq384", width=384).pq_codes == 384
    with pytest.raises(CacheStorageError, match="needs a PCA basis"):
        Storage("pca8").encode(np.ones((2, 32), np.float32))
    with pytest.raises(CacheStorageError, match="needs a full-width rotation and a codebook"):
        Storage("pq8").encode(np.ones((2, 32), np.float32), fit_pca(_states(width=32), 32))


def _rotated(basis: PcaBasis, x: np.ndarray) -> np.ndarray:
    """(x - mu) B in float64, computed here."""
    return (x.astype(np.float64) - basis.mean) @ basis.basis.astype(np.float64)


@pytest.mark.parametrize("num_codes", [4, 12, 48])
def test_pq_codes_are_faiss_nearest_centroids_and_decode_as_faiss_does(num_codes):
    faiss = pytest.importorskip("faiss")
    width = 48
    basis = fit_pq(_states(rows=3000, width=width, seed=4), num_codes)
    x = _states(rows=500, width=width, seed=5)  # other rows than the fitted ones
    storage = Storage(f"pq{num_codes}")
    codes, scale = storage.encode(x, basis)
    assert codes.shape == (500, num_codes) and codes.dtype == np.uint8 and scale is None
    # faiss's own quantizer holding the same codebook, on the same rotated rows.
    quantizer = faiss.ProductQuantizer(width, num_codes, 8)
    faiss.copy_array_to_vector(basis.codebook.ravel(), quantizer.centroids)
    rotated = _rotated(basis, x)
    theirs = quantizer.compute_codes(np.ascontiguousarray(rotated, np.float32))
    # Equal but where two centroids tie to float32 rounding (none expected in 500 x M).
    assert np.mean(theirs == codes) >= 0.999
    # Decoding: faiss's reconstruction of our codes, rotated back here in float64.
    restored = storage.decode(codes, None, basis)
    expected = quantizer.decode(codes).astype(np.float64) @ basis.basis.T + basis.mean
    scale_of_x = float(np.abs(x).max())
    np.testing.assert_allclose(restored, expected, rtol=0, atol=1e-5 * scale_of_x)
    # The basis is a rotation: the error in x is the error of the rotated rows, and ours is the
    # nearest centroid's, so it is at most faiss's codes' error (to float32 rounding).
    ours = np.sum((x - restored.astype(np.float64)) ** 2)
    np.testing.assert_allclose(ours, np.sum((rotated - quantizer.decode(codes)) ** 2),
                               rtol=1e-4)
    faiss_error = np.sum((rotated - quantizer.decode(theirs)) ** 2)
    assert ours <= faiss_error * (1 + 1e-5)
    # And it is a quantizer: far below the rows' variance, and it is what round_trip gives.
    assert ours < 0.5 * np.sum((x - x.mean(axis=0)) ** 2)
    np.testing.assert_array_equal(storage.round_trip(x, basis), restored)


def test_pq_with_a_hand_built_codebook_decodes_its_centroids_exactly():
    rng = np.random.default_rng(6)
    num_codes, width = 4, 8
    # Centroids on a grid of step 1 (any two differ by >= 1 in some value), rotation = identity.
    codebook = rng.permutation(np.stack(np.meshgrid(*[np.arange(16.0)] * 2), -1).reshape(256, 2))
    codebook = np.stack([codebook + 100.0 * part for part in range(num_codes)]).astype(np.float32)
    basis = PcaBasis(np.zeros(width, np.float32), np.eye(width, dtype=np.float32), codebook)
    chosen = rng.integers(0, 256, size=(7, 5, num_codes))
    exact = np.concatenate([codebook[part, chosen[..., part]] for part in range(num_codes)], -1)
    noise = rng.uniform(-0.45, 0.45, exact.shape).astype(np.float32)  # < half the grid step
    storage = Storage("pq4")
    codes, _ = storage.encode(exact + noise, basis)
    np.testing.assert_array_equal(codes, chosen)
    np.testing.assert_array_equal(storage.decode(codes, None, basis), exact)


def test_pq_rotation_interleaves_the_principal_directions_and_its_fit_is_seeded():
    pytest.importorskip("faiss")
    x = _states(rows=2000, width=48, seed=7)
    basis = fit_pq(x, 8)
    assert {name: array.shape for name, array in basis.arrays().items()} == Storage(
        "pq8").basis_shapes(48)
    np.testing.assert_allclose(basis.basis.T @ basis.basis, np.eye(48), atol=1e-5)
    # Sub-vector m holds principal directions m, m + 8, ...: rotated coordinate j has the
    # variance of numpy's singular direction (j % 6) * 8 + j // 6 (6 = 48 / 8 per sub-vector).
    centered = x.astype(np.float64) - x.astype(np.float64).mean(axis=0)
    variances = np.linalg.svd(centered, compute_uv=False) ** 2 / len(x)
    order = [(j % 6) * 8 + j // 6 for j in range(48)]
    np.testing.assert_allclose(_rotated(basis, x).var(axis=0), variances[order], rtol=1e-3,
                               atol=1e-6 * variances[0])
    # The same samples give the same bits; another seed, another codebook.
    again = fit_pq(x, 8)
    assert basis.equals(again)
    assert not basis.equals(fit_pq(x, 8, seed=1))
    # What every shard of a cache must agree on: all three arrays.
    assert not basis.equals(dataclasses.replace(basis, codebook=None))
    assert not basis.equals(dataclasses.replace(basis, mean=basis.mean + 1))


def test_pq_fit_draws_its_sample_with_its_seed(monkeypatch):
    pytest.importorskip("faiss")
    x = _states(rows=1200, width=16, seed=8)
    monkeypatch.setattr(storage_module, "PQ_FIT_TOKENS", 700)
    drawn = np.sort(np.random.default_rng(storage_module.PQ_SEED).choice(1200, 700,
                                                                         replace=False))
    assert fit_pq(x, 4).equals(fit_pq(x[drawn], 4))


def test_pq_of_at_most_256_rows_keeps_each_row_as_a_centroid():
    pytest.importorskip("faiss")
    x = _states(rows=100, width=16, seed=9)
    basis = fit_pq(x, 4)
    # Every sample row is exactly a sequence of centroids: the round trip is the rotation's.
    restored = Storage("pq4").round_trip(x, basis)
    np.testing.assert_allclose(restored, x, rtol=0, atol=1e-5 * float(np.abs(x).max()))


def test_without_faiss_building_a_pq_cache_fails_in_one_line_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "faiss", None)  # `import faiss` raises ImportError
    for build in (Storage("pq8").check_buildable, lambda: fit_pq(_states(width=32), 8)):
        with pytest.raises(CacheStorageError) as raised:
            build()
        assert "--cache-dtype pq8" in str(raised.value)
        assert "pip install 'dil_jax[pq]'" in str(raised.value)
        assert "\n" not in str(raised.value)
    Storage("pca8").check_buildable()  # the other schemes need no faiss


def _float32_cache(folder, states: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """A ragged float32 passage cache of `states` [rows, p_len, width] whose row r holds
    lengths[r] real tokens (a stand-in encoder returns the rows asked for); returns the mask."""
    from dil_jax.open_domain.cache.build import build_passage_cache
    from dil_jax.open_domain.cache.manifest import CacheKey

    _, p_len, width = states.shape
    mask = (np.arange(p_len)[None, :] < np.asarray(lengths)[:, None]).astype(np.int32)
    ids = np.where(mask == 1, 7, 0).astype(np.int32)
    offsets = np.where(mask[..., None] == 1, 0, -1).astype(np.int32) * np.ones(2, np.int32)
    key = CacheKey(model="m", architecture="bert", num_lower_layers=1, hidden_size=width,
                   tokenizer="t", max_passage_len=p_len, storage=Storage("float32"),
                   passages="p")
    build_passage_cache(folder, key, ids, mask, offsets, lambda windows: states[windows.rows])
    return mask


def test_pq_variants_benchmark_measures_every_quantizer_on_a_cache(tmp_path):
    """benchmarks/pq_variants.py on a ragged float32 cache of synthetic states: a row per
    quantizer, its pq<M> row the storage's own round trip; the eigenvalue allocation deals the
    directions into equal sub-vectors."""
    pytest.importorskip("faiss")
    from tests.helpers import load_script

    bench = load_script("benchmarks/pq_variants.py")
    order = bench.eigen_allocation(np.geomspace(100.0, 1.0, 16), 4)
    assert sorted(order) == list(range(16))
    assert order[:4].tolist() == [0, 7, 8, 15]  # the largest, then the smallest sums fill up
    cache = tmp_path / "float32"
    states = _states(rows=40 * 30, width=16, seed=10).reshape(40, 30, 16)
    mask = _float32_cache(cache, states, np.random.default_rng(11).integers(10, 31, size=40))
    rows = bench.main(["--cache", str(cache), "--codes", "8", "--train", "600", "--test", "200",
                       "--out", str(tmp_path / "variants")])
    assert [row["variant"] for row in rows] == list(bench.VARIANTS)
    assert all(0 < row["variance_lost"] < 1 and 0 < row["cosine"] <= 1 for row in rows)
    # Its own pq8 row: Storage's round trip of the same draw, measured here.
    real = states[mask == 1]  # row after row, as the cache stores them
    drawn = np.random.default_rng(0).permutation(len(real))
    train, test = real[drawn[:600]], real[drawn[600:800]]
    storage = Storage("pq8")
    restored = storage.round_trip(test, storage.fit(train)).astype(np.float64)
    centered = test.astype(np.float64) - train.mean(axis=0)
    lost = np.sum((test - restored) ** 2) / np.sum(centered ** 2)
    [own] = [row for row in rows if row["variant"] == "pq-interleaved"]
    assert own["variance_lost"] == pytest.approx(lost, rel=1e-6)
    record = json.loads((tmp_path / "variants.json").read_text())
    assert record["test"] == 200
    [speed] = record["encoding"]
    assert speed["codes"] == 8 and speed["agreement"] >= 0.99 and speed["numpy_s"] > 0
