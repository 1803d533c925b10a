"""How a passage cache stores its float arrays: the storage schemes and their round trips.

A stored array is [rows, p_len, width] float32 (width = hidden for lower states); one token's
`width` values are one row of the scheme. `--cache-dtype` names the scheme:

  float32   the values                                            4 * width bytes per token
  bfloat16  rounded to bfloat16, kept as uint16 bits              2 * width
  int8      per-token symmetric int8: s = max|x| / 127 per token,  width + 4 (codes + a float32 s)
            code = round(x / s); x^ = code * s, |x - x^| <= s / 2
  pca<d>    x - mu projected on the top-d principal directions     d + 4, plus the basis
            (fitted on the cache's own states), the d coordinates  (4 * width * (d + 1) bytes
            stored as int8 as above; x^ = mu + B c^                once per cache)

All functions here are pure numpy; the files are `dil_jax.open_domain.cache.store`'s business. Every
scheme's error bound is checked by `tests/open_domain/test_odqa_compression.py` against numpy
written there.
"""

from __future__ import annotations

import dataclasses
import re

import ml_dtypes
import numpy as np

from dil_jax.errors import DilJaxError

# The schemes by name (pca takes its dimension: pca64, pca96, ...).
STORAGE_NAMES = ("float32", "bfloat16", "int8", "pca<d>")
INT8_MAX = 127
SCALE_BYTES = 4  # one float32 scale per token row


class CacheStorageError(DilJaxError, ValueError):
    """An unknown or impossible cache storage name (--cache-dtype); names the value."""


@dataclasses.dataclass(frozen=True)
class PcaBasis:
    """An orthonormal down-projection: mean [width], basis [width, d] (orthonormal columns)."""

    mean: np.ndarray
    basis: np.ndarray

    def project(self, x: np.ndarray) -> np.ndarray:
        """x: [..., width] -> coordinates [..., d] float32."""
        return ((np.asarray(x, np.float32) - self.mean) @ self.basis).astype(np.float32)

    def reconstruct(self, coordinates: np.ndarray) -> np.ndarray:
        """coordinates: [..., d] -> [..., width] float32, mu + B c."""
        return (np.asarray(coordinates, np.float32) @ self.basis.T + self.mean).astype(np.float32)


def fit_pca(samples: np.ndarray, dim: int) -> PcaBasis:
    """The top-`dim` principal directions of `samples` [n, width] (rows = token states).

    The eigenvectors of the centered covariance, computed in float64: a width x width matrix
    whatever n, so a large sample fits in memory. The directions equal the right singular vectors
    of the centered samples (up to sign), so the squared reconstruction error of the samples is
    the sum of the discarded squared singular values.
    """
    samples = np.asarray(samples, np.float64)
    if samples.ndim != 2 or not 0 < dim <= samples.shape[1]:
        raise CacheStorageError(f"PCA needs [n, width] samples and 0 < d <= width, got "
                                f"{samples.shape} and d = {dim}")
    mean = samples.mean(axis=0)
    centered = samples - mean
    _, vectors = np.linalg.eigh(centered.T @ centered)  # ascending eigenvalues
    basis = vectors[:, ::-1][:, :dim]
    return PcaBasis(mean.astype(np.float32), np.ascontiguousarray(basis, np.float32))


def quantize_int8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-row int8: x [..., width] -> (codes [..., width] int8, scale [...] float32).

    scale = max|x| / 127 over the row; code = round(x / scale), so |x - code * scale| <= scale/2.
    An all-zero row has scale 0 and codes 0 (decoded exactly).
    """
    x = np.asarray(x, np.float32)
    scale = (np.abs(x).max(axis=-1) / INT8_MAX).astype(np.float32)
    safe = np.where(scale > 0, scale, 1.0)[..., None]
    codes = np.clip(np.rint(x / safe), -INT8_MAX, INT8_MAX).astype(np.int8)
    return codes, scale


def dequantize_int8(codes: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """(codes [..., width] int8, scale [...]) -> [..., width] float32."""
    return np.asarray(codes, np.float32) * np.asarray(scale, np.float32)[..., None]


@dataclasses.dataclass(frozen=True)
class Storage:
    """One storage scheme, by its `--cache-dtype` name (see the module docstring).

    Made from text once, by `parse` (the flag, a cache manifest); carried as this value from
    there to the cache's writer and reader."""

    name: str

    @classmethod
    def parse(cls, name: str, width: int | None = None) -> Storage:
        """The scheme called `name`; width (optional) checks that a PCA's d fits it."""
        match = re.fullmatch(r"pca([0-9]+)", name)
        if name not in ("float32", "bfloat16", "int8") and not match:
            raise CacheStorageError(f"unknown cache storage {name!r}; choose one of "
                                    f"{', '.join(STORAGE_NAMES)} (e.g. pca64)")
        if match and not 0 < int(match.group(1)):
            raise CacheStorageError(f"cache storage {name!r}: d must be >= 1")
        storage = cls(name)
        return storage if width is None else storage.check_width(width)

    def check_width(self, width: int) -> Storage:
        """Itself, when arrays `width` wide (the hidden size) can be stored so: a PCA's d must
        not exceed it (CacheStorageError otherwise)."""
        if self.pca_dim is not None and self.pca_dim > width:
            raise CacheStorageError(f"cache storage {self.name!r}: d must be in 1..{width} (the "
                                    "hidden size)")
        return self

    @property
    def pca_dim(self) -> int | None:
        """d of a pca<d> scheme, else None."""
        return int(self.name[3:]) if self.name.startswith("pca") else None

    @property
    def scaled(self) -> bool:
        """Whether rows carry an int8 scale (int8 and pca<d>)."""
        return self.name == "int8" or self.pca_dim is not None

    @property
    def code_dtype(self) -> np.dtype:
        return np.dtype({"float32": np.float32, "bfloat16": np.uint16}.get(self.name, np.int8))

    def code_width(self, width: int) -> int:
        """Values stored per token for arrays `width` wide."""
        return self.pca_dim or width

    def bytes_per_token(self, width: int) -> int:
        """Stored bytes of one token row (the PCA basis and .npy headers not counted)."""
        return self.code_width(width) * self.code_dtype.itemsize + SCALE_BYTES * self.scaled

    def without_pca(self) -> Storage:
        """The scheme for arrays that have no PCA basis of their own: int8 for pca<d>."""
        return INT8 if self.pca_dim is not None else self

    def encode(self, x: np.ndarray, pca: PcaBasis | None = None
               ) -> tuple[np.ndarray, np.ndarray | None]:
        """x [..., width] float -> (codes [..., code_width], scale [...] or None)."""
        x = np.asarray(x, np.float32)
        if self.name == "float32":
            return x, None
        if self.name == "bfloat16":
            return x.astype(ml_dtypes.bfloat16).view(np.uint16), None
        if self.pca_dim is not None:
            x = self._basis(pca).project(x)
        return quantize_int8(x)

    def decode(self, codes: np.ndarray, scale: np.ndarray | None = None,
               pca: PcaBasis | None = None) -> np.ndarray:
        """`encode`'s output -> [..., width] float32."""
        if self.name == "float32":
            return np.asarray(codes, np.float32)
        if self.name == "bfloat16":
            return np.asarray(codes).view(ml_dtypes.bfloat16).astype(np.float32)
        values = dequantize_int8(codes, scale)
        return values if self.pca_dim is None else self._basis(pca).reconstruct(values)

    def round_trip(self, x: np.ndarray, pca: PcaBasis | None = None) -> np.ndarray:
        """What reading `x` back from this storage gives: decode(encode(x))."""
        return self.decode(*self.encode(x, pca), pca=pca)

    def _basis(self, pca: PcaBasis | None) -> PcaBasis:
        if pca is None or pca.basis.shape[1] != self.pca_dim:
            raise CacheStorageError(f"storage {self.name} needs a PCA basis with {self.pca_dim} "
                                    "directions")
        return pca


# The schemes code names itself (the default, and those of arrays without a choice).
FLOAT32 = Storage("float32")
INT8 = Storage("int8")
