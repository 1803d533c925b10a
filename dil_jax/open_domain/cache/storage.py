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
  pq<M>     product quantization of all width PCA coordinates:    M, plus the rotation and
            y = (x - mu) B cut into M sub-vectors of width / M,   the codebook (4 * width *
            each stored as the uint8 index of its nearest of 256   (width + 1) + 4 * 256 *
            centroids; x^ = mu + B y^                             width bytes once per cache)

pq<M> details. B is the full-width PCA basis with its directions interleaved (sub-vector m holds
principal directions m, m + M, m + 2M, ...), so every sub-vector gets an equal share of the
spectrum, where in the PCA's own order the first sub-vectors would hold most of the variance
and lose more than without any rotation (`benchmarks/pq_variants.py`; docs/results/
open_domain_log.md, "pq<M>", has the comparison).
The codebook is trained by faiss's `ProductQuantizer` (k-means per sub-vector, seeded) on a sample
of the cache's states, at build time only: encoding (nearest centroid) and decoding (lookup,
inverse rotation) are numpy here, so a process that reads a pq cache, or checks one on open,
needs no faiss.

All functions here are pure numpy (but `train_pq_codebook`, faiss's k-means); storing them is
`dil_jax.open_domain.cache.ragged_store`'s business (a fitted scheme's side arrays by
`BASIS_SUFFIXES`). Every scheme's error bound is checked by
`tests/open_domain/test_odqa_compression.py` against numpy (and faiss) written there.
"""

from __future__ import annotations

import dataclasses
import math
import re
from types import ModuleType

import ml_dtypes
import numpy as np

from dil_jax.errors import DilJaxError

# The schemes by name (pca takes its dimension: pca64, pca96, ...; pq its codes per token: pq32).
STORAGE_NAMES = ("float32", "bfloat16", "int8", "pca<d>", "pq<M>")
INT8_MAX = 127
SCALE_BYTES = 4  # one float32 scale per token row
# pq<M>: centroids per sub-vector (a code is one uint8), and the sample its rotation and codebook
# are fitted on: up to PQ_FIT_TOKENS token states drawn with PQ_SEED (faiss's k-means uses at most
# 256 points per centroid: 65,536 is all it would take), k-means seeded with PQ_SEED too.
PQ_CENTROIDS = 256
PQ_FIT_TOKENS = 65536
PQ_SEED = 0
# Scores computed at once by `pq_encode`: tokens x 256 float32 (64 MiB).
PQ_ENCODE_SCORES = 1 << 24
# The setup.py extra that installs faiss (the codebook's training; reading needs none).
PQ_EXTRA = "pq"
# The side arrays a fitted scheme stores beside its codes (`{stem}.{suffix}`: a zarr array of a
# ragged cache, a .npy file of a padded one), by PcaBasis field.
BASIS_SUFFIXES = {"mean": "pca_mean", "basis": "pca_basis", "codebook": "pq_codebook"}


class CacheStorageError(DilJaxError, ValueError):
    """An unknown or impossible cache storage name (--cache-dtype); names the value."""


@dataclasses.dataclass(frozen=True)
class PcaBasis:
    """An orthonormal down-projection: mean [width], basis [width, d] (orthonormal columns);
    codebook [M, 256, width / M] for pq<M> (then d = width: the basis is a rotation, and its
    coordinates are product-quantized instead of stored as int8)."""

    mean: np.ndarray
    basis: np.ndarray
    codebook: np.ndarray | None = None

    def project(self, x: np.ndarray) -> np.ndarray:
        """x: [..., width] -> coordinates [..., d] float32."""
        return ((np.asarray(x, np.float32) - self.mean) @ self.basis).astype(np.float32)

    def reconstruct(self, coordinates: np.ndarray) -> np.ndarray:
        """coordinates: [..., d] -> [..., width] float32, mu + B c."""
        return (np.asarray(coordinates, np.float32) @ self.basis.T + self.mean).astype(np.float32)

    @classmethod
    def of(cls, arrays: dict[str, np.ndarray]) -> PcaBasis:
        """The basis of `arrays` (by suffix, BASIS_SUFFIXES): the inverse of `arrays()`."""
        return cls(**{field: np.asarray(arrays[suffix]) for field, suffix in BASIS_SUFFIXES.items()
                      if suffix in arrays})

    def arrays(self) -> dict[str, np.ndarray]:
        """The arrays a cache stores, by suffix (BASIS_SUFFIXES; no codebook: none)."""
        return {suffix: getattr(self, field) for field, suffix in BASIS_SUFFIXES.items()
                if getattr(self, field) is not None}

    def equals(self, other: PcaBasis) -> bool:
        """Whether both hold the same arrays, bit for bit (every shard of a cache must)."""
        mine, theirs = self.arrays(), other.arrays()
        return mine.keys() == theirs.keys() and all(np.array_equal(mine[suffix], theirs[suffix])
                                                    for suffix in mine)


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


def interleaved(width: int, parts: int) -> np.ndarray:
    """[width] the order that deals `width` directions (sorted by variance) to `parts` equal
    sub-vectors in turn: sub-vector m gets directions m, m + parts, m + 2 parts, ..."""
    return np.arange(width).reshape(width // parts, parts).T.reshape(-1)


def fit_pq(samples: np.ndarray, num_codes: int, seed: int = PQ_SEED) -> PcaBasis:
    """The pq<num_codes> rotation and codebook of `samples` [n, width] (token states).

    Up to PQ_FIT_TOKENS rows drawn with `seed`: their full-width PCA, its directions interleaved
    over the sub-vectors (`interleaved`), and a codebook trained on the rotated rows
    (`train_pq_codebook`). Needs faiss (`require_faiss`).
    """
    require_faiss(f"pq{num_codes}")  # every pq build needs it, whatever the sample
    samples = np.asarray(samples, np.float32)
    if samples.ndim != 2 or not len(samples) or samples.shape[1] % max(num_codes, 1):
        raise CacheStorageError(f"pq needs [n >= 1, width] samples with M dividing the width, "
                                f"got {samples.shape} and M = {num_codes}")
    if len(samples) > PQ_FIT_TOKENS:
        chosen = np.random.default_rng(seed).choice(len(samples), PQ_FIT_TOKENS, replace=False)
        samples = samples[np.sort(chosen)]
    width = samples.shape[1]
    pca = fit_pca(samples, width)
    rotation = PcaBasis(pca.mean, np.ascontiguousarray(pca.basis[:, interleaved(width,
                                                                                 num_codes)]))
    codebook = train_pq_codebook(rotation.project(samples), num_codes, seed)
    return dataclasses.replace(rotation, codebook=codebook)


def require_faiss(name: str = "pq<M>") -> ModuleType:
    """The faiss module; without it, CacheStorageError (one line naming the extra to install)
    for a build of the storage called `name`."""
    try:
        import faiss
    except ImportError:
        raise CacheStorageError(
            f"--cache-dtype {name} trains its codebook with faiss, which is not installed: pip "
            f"install 'dil_jax[{PQ_EXTRA}]' (faiss-cpu); reading a pq cache needs no faiss"
        ) from None
    return faiss


def train_pq_codebook(rotated: np.ndarray, num_codes: int, seed: int = PQ_SEED) -> np.ndarray:
    """[num_codes, 256, width / num_codes] float32: faiss's ProductQuantizer trained on
    `rotated` [n, width] (k-means of each sub-vector, seeded; every row is used). A sample of
    at most 256 rows is its own codebook (each row a centroid, repeated to fill 256: exact on
    the sample), as k-means needs more points than centroids."""
    rotated = np.ascontiguousarray(rotated, np.float32)
    rows, width = rotated.shape
    sub = width // num_codes
    if rows <= PQ_CENTROIDS:
        parts = rotated.reshape(rows, num_codes, sub).transpose(1, 0, 2)
        return np.ascontiguousarray(parts[:, np.arange(PQ_CENTROIDS) % rows])
    faiss = require_faiss(f"pq{num_codes}")
    quantizer = faiss.ProductQuantizer(width, num_codes, int(math.log2(PQ_CENTROIDS)))
    quantizer.cp.seed = seed
    # Every row is used (no subsampling of faiss's own), and a small corpus is no warning.
    quantizer.cp.max_points_per_centroid = -(-rows // PQ_CENTROIDS)
    quantizer.cp.min_points_per_centroid = 1
    quantizer.train(rotated)
    centroids = faiss.vector_to_array(quantizer.centroids)
    return centroids.reshape(num_codes, PQ_CENTROIDS, sub).astype(np.float32)


def pq_encode(rotated: np.ndarray, codebook: np.ndarray) -> np.ndarray:
    """rotated [..., width] -> codes [..., M] uint8: each sub-vector's nearest centroid of
    codebook [M, 256, width / M] (squared L2; the first of equals)."""
    num_codes, centroids, sub = codebook.shape
    flat = np.asarray(rotated, np.float32).reshape(-1, num_codes, sub)
    # |y - c|^2 = |y|^2 - 2 (y.c - |c|^2 / 2), and |y|^2 is the same for every centroid of y:
    # the nearest centroid has the largest [y, 1] . [c, -|c|^2 / 2], one matrix product.
    scoring = np.concatenate([codebook, -0.5 * np.square(codebook).sum(-1, keepdims=True)],
                             axis=-1).transpose(0, 2, 1).copy()  # [M, sub + 1, 256]
    codes = np.empty(flat.shape[:2], np.uint8)
    step = max(1, PQ_ENCODE_SCORES // centroids)
    block = np.ones((min(step, len(flat)), sub + 1), np.float32)
    # One 2-D product per sub-vector: numpy's stacked (3-D) matmul was several times slower,
    # (`benchmarks/pq_variants.py` times it against faiss's own `compute_codes`).
    for start in range(0, len(flat), step):
        stop = min(start + step, len(flat))
        for part in range(num_codes):
            block[:stop - start, :sub] = flat[start:stop, part]
            codes[start:stop, part] = (block[:stop - start] @ scoring[part]).argmax(axis=-1)
    return codes.reshape(np.shape(rotated)[:-1] + (num_codes,))


def pq_decode(codes: np.ndarray, codebook: np.ndarray) -> np.ndarray:
    """codes [..., M] -> [..., width] float32: the codes' centroids, sub-vectors in order."""
    num_codes, _, sub = codebook.shape
    parts = codebook[np.arange(num_codes), np.asarray(codes, np.intp)]  # [..., M, sub]
    return parts.reshape(np.shape(codes)[:-1] + (num_codes * sub,))


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
        """The scheme called `name`; width (optional) checks that a PCA's d, or a pq's M, fits
        it (`check_width`)."""
        match = re.fullmatch(r"(pca|pq)([0-9]+)", name)
        if name not in ("float32", "bfloat16", "int8") and not match:
            raise CacheStorageError(f"unknown cache storage {name!r}; choose one of "
                                    f"{', '.join(STORAGE_NAMES)} (e.g. pca64, pq32)")
        if match and (match.group(2) != str(int(match.group(2))) or not int(match.group(2))):
            size = "d" if match.group(1) == "pca" else "M"
            raise CacheStorageError(f"cache storage {name!r}: {size} must be a whole number "
                                    ">= 1, written without leading zeros")
        storage = cls(name)
        return storage if width is None else storage.check_width(width)

    def check_width(self, width: int) -> Storage:
        """Itself, when arrays `width` wide (the hidden size) can be stored so: a PCA's d must
        not exceed it, a pq's M must divide it (CacheStorageError otherwise)."""
        if self.pca_dim is not None and self.pca_dim > width:
            raise CacheStorageError(f"cache storage {self.name!r}: d must be in 1..{width} (the "
                                    "hidden size)")
        if self.pq_codes is not None and width % self.pq_codes:
            divisors = [m for m in range(1, width + 1) if width % m == 0]
            raise CacheStorageError(f"cache storage {self.name!r}: M must divide the hidden size "
                                    f"{width}: one of {', '.join(map(str, divisors))}")
        return self

    @property
    def pca_dim(self) -> int | None:
        """d of a pca<d> scheme, else None."""
        return int(self.name[3:]) if self.name.startswith("pca") else None

    @property
    def pq_codes(self) -> int | None:
        """M (codes, bytes, per token) of a pq<M> scheme, else None."""
        return int(self.name[2:]) if self.name.startswith("pq") else None

    @property
    def has_basis(self) -> bool:
        """Whether the scheme is fitted on the states and stores its fit (a PcaBasis) with
        them: pca<d> and pq<M>."""
        return self.pca_dim is not None or self.pq_codes is not None

    @property
    def scaled(self) -> bool:
        """Whether rows carry an int8 scale (int8 and pca<d>)."""
        return self.name == "int8" or self.pca_dim is not None

    @property
    def code_dtype(self) -> np.dtype:
        if self.pq_codes is not None:
            return np.dtype(np.uint8)
        return np.dtype({"float32": np.float32, "bfloat16": np.uint16}.get(self.name, np.int8))

    def code_width(self, width: int) -> int:
        """Values stored per token for arrays `width` wide."""
        return self.pca_dim or self.pq_codes or width

    def bytes_per_token(self, width: int) -> int:
        """Stored bytes of one token row (the basis, codebook and store metadata not counted)."""
        return self.code_width(width) * self.code_dtype.itemsize + SCALE_BYTES * self.scaled

    def basis_shapes(self, width: int) -> dict[str, tuple[int, ...]]:
        """The fitted side arrays (a PcaBasis, by BASIS_SUFFIXES suffix) stored beside the codes
        of arrays `width` wide, and their shapes: pca<d> mean [width] and basis [width, d];
        pq<M> those (d = width) and codebook [M, 256, width / M]; none for the others."""
        if not self.has_basis:
            return {}
        shapes = {"pca_mean": (width,), "pca_basis": (width, self.pca_dim or width)}
        if self.pq_codes is not None:
            shapes["pq_codebook"] = (self.pq_codes, PQ_CENTROIDS, width // self.pq_codes)
        return shapes

    def without_pca(self) -> Storage:
        """The scheme for arrays that have no basis of their own (the reuse arrays): int8 for
        pca<d> and pq<M>.

        Not a codebook of their own for pq<M>: the reuse arrays are the speed option (the
        first upper block's q, k, v and context, read instead of recomputed per pair), and q
        and k enter the attention logits, whose error exp() amplifies; int8 keeps each value
        within half a step, where a product quantizer of 32 bytes a token lost 14% of the
        k = 4 reader's states' variance (docs/results/open_domain_log.md, "pq<M>"). A cache
        that must be small stores pq<M> states without them."""
        return INT8 if self.has_basis else self

    def check_buildable(self) -> Storage:
        """Itself, when this process can build a cache so stored: CacheStorageError (one line,
        the extra to install) for pq<M> without faiss (`require_faiss`)."""
        if self.pq_codes is not None:
            require_faiss(self.name)
        return self

    def fit(self, samples: np.ndarray) -> PcaBasis:
        """The basis (pq<M>: and codebook) of a fitted scheme, from samples [n, width] of the
        states it will store (pq<M> needs faiss: `require_faiss`)."""
        if self.pq_codes is not None:
            return fit_pq(samples, self.pq_codes)
        if self.pca_dim is not None:
            return fit_pca(samples, self.pca_dim)
        raise CacheStorageError(f"storage {self.name} has nothing to fit")

    def encode(self, x: np.ndarray, pca: PcaBasis | None = None
               ) -> tuple[np.ndarray, np.ndarray | None]:
        """x [..., width] float -> (codes [..., code_width], scale [...] or None)."""
        x = np.asarray(x, np.float32)
        if self.name == "float32":
            return x, None
        if self.name == "bfloat16":
            return x.astype(ml_dtypes.bfloat16).view(np.uint16), None
        if self.pq_codes is not None:
            basis = self._basis(pca)
            return pq_encode(basis.project(x), basis.codebook), None
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
        if self.pq_codes is not None:
            basis = self._basis(pca)
            return basis.reconstruct(pq_decode(codes, basis.codebook))
        values = dequantize_int8(codes, scale)
        return values if self.pca_dim is None else self._basis(pca).reconstruct(values)

    def round_trip(self, x: np.ndarray, pca: PcaBasis | None = None) -> np.ndarray:
        """What reading `x` back from this storage gives: decode(encode(x))."""
        return self.decode(*self.encode(x, pca), pca=pca)

    def _basis(self, pca: PcaBasis | None) -> PcaBasis:
        width = None if pca is None else pca.basis.shape[0]
        shapes = {} if pca is None else {suffix: array.shape
                                         for suffix, array in pca.arrays().items()}
        if pca is None or shapes != self.basis_shapes(width):
            what = (f"a PCA basis with {self.pca_dim} directions" if self.pq_codes is None
                    else f"a full-width rotation and a codebook of {self.pq_codes} sub-vectors")
            raise CacheStorageError(f"storage {self.name} needs {what}")
        return pca


# The schemes code names itself (the default, and those of arrays without a choice).
FLOAT32 = Storage("float32")
INT8 = Storage("int8")
# What `index` and `demo` build a new cache with when --cache-dtype is not given: the storage
# issue 60's table (docs/results/cache_compression_i60/table.md; why: docs/results/
# open_domain_log.md, "The default storage, from the table") found as accurate as float32 for
# both bundled delayed readers, needing nothing beyond numpy; pq<M> needs faiss to build.
DEFAULT_STORAGE = INT8


def default_storage(k: int) -> Storage:
    """What a new cache at k is built with when --cache-dtype is not given: DEFAULT_STORAGE;
    float32 at k = 0, whose cache holds token ids only (the storage it records is moot, and
    float32 is what such caches have always recorded)."""
    return FLOAT32 if k == 0 else DEFAULT_STORAGE
