"""Each passage-cache storage scheme against its own error bound, computed here with numpy:
int8 |x - x^| <= s/2 with s = max|x|/127 per token; bfloat16 relative 2^-8; PCA's error is the
discarded variance of a numpy SVD (plus, stored, exactly its int8 coordinates' error)."""

from __future__ import annotations

import numpy as np
import pytest

from dil_jax.open_domain.cache.storage import (
    CacheStorageError,
    Storage,
    dequantize_int8,
    fit_pca,
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
                                                            "pca64", "pca96")] == [
        4 * 384, 2 * 384, 384 + 4, 64 + 4, 96 + 4]
    assert Storage("pca64").without_pca() == Storage("int8")
    assert Storage("bfloat16").without_pca() == Storage("bfloat16")
    for bad in ("int4", "float16", "pca", "pca0", "PCA64"):
        with pytest.raises(CacheStorageError, match=repr(bad)):
            Storage.parse(bad)
    with pytest.raises(CacheStorageError, match=r"'pca33'.*1\.\.32"):
        Storage.parse("pca33", width=32)
    with pytest.raises(CacheStorageError, match="needs a PCA basis"):
        Storage("pca8").encode(np.ones((2, 32), np.float32))
