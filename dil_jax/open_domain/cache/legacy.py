"""Reading the padded caches of earlier builds (formats /1 and /2): `.npy` memory maps.

Kept so that caches written before the ragged store (`dil_jax.open_domain.cache.store`) open
and answer as they did; nothing writes this layout any more. A folder of it (a cache, or one
shard of a /2 cache) holds:

  ids.npy         [rows, p_len] int32   `p [SEP]` token ids
  mask.npy        [rows, p_len] int32
  offsets.npy     [rows, p_len, 2] int32 character offsets in the passage text
  states.npy      [rows, p_len, code_width] lower states in the manifest's storage
  states.scale.npy      [rows, p_len] float32 (int8, pca<d>)
  states.pca_mean.npy   [hidden], states.pca_basis.npy [hidden, d] float32 (pca<d>; pq<M>:
                  d = hidden, and states.pq_codebook.npy: `Storage.basis_shapes`)
  upper_*.npy     the first upper block's arrays (`reuse`), each with its `.scale.npy` if scaled

Every array is a read-only memory map, so reading rows touches only those rows (and the padding
slots between their tokens: every row is p_len wide on disk). Local folders only.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from dil_jax.open_domain.cache.errors import broken
from dil_jax.open_domain.cache.row_arrays import NumpyRows
from dil_jax.open_domain.cache.storage import PcaBasis, Storage


def load_array(path: Path, shape: tuple[int, ...]) -> np.ndarray:
    """The .npy at `path` as a read-only memory map of exactly `shape`, else CacheBrokenError."""
    if not path.is_file():
        raise broken(path, "the file is missing")
    try:
        array = np.load(path, mmap_mode="r")
    except (OSError, ValueError, EOFError) as error:  # a truncated file fails here
        raise broken(path, f"unreadable, truncated? ({error})") from error
    if array.shape != shape:
        raise broken(path, f"shape {array.shape}, the manifest implies {shape}")
    return array


class StoredArray:
    """One float array of a padded cache, [rows, p_len, width], in its storage (read-only).

    Files: `{stem}.npy` (codes, [rows, p_len, code_width]), `{stem}.scale.npy` ([rows, p_len],
    scaled schemes), `{stem}.pca_mean.npy` / `{stem}.pca_basis.npy` (pca<d>, pq<M>),
    `{stem}.pq_codebook.npy` (pq<M>). A file missing,
    truncated, or of the wrong shape or dtype is CacheBrokenError naming it.
    """

    def __init__(self, directory: Path, stem: str, storage: Storage,
                 shape: tuple[int, int, int]):
        rows, length, width = shape
        self.num_rows, self.p_len, self.width = shape
        self.storage, self.path = storage, directory / f"{stem}.npy"
        self.codes = load_array(self.path, (rows, length, storage.code_width(width)))
        if self.codes.dtype != storage.code_dtype:
            raise broken(self.path, f"dtype {self.codes.dtype} does not match the manifest's "
                                    f"storage {storage.name!r}")
        self.scale = (load_array(directory / f"{stem}.scale.npy", (rows, length))
                      if storage.scaled else None)
        self.pca = None
        if storage.has_basis:
            self.pca = PcaBasis.of({
                suffix: np.asarray(load_array(directory / f"{stem}.{suffix}.npy", shape))
                for suffix, shape in storage.basis_shapes(width).items()})

    def read(self, indices: Sequence[int]) -> np.ndarray:
        """[len(indices), p_len, width] float32: those rows, decoded."""
        rows = np.asarray(indices)
        return self.storage.decode(self.codes[rows],
                                   None if self.scale is None else self.scale[rows], self.pca)

    def round_trip(self, x: np.ndarray) -> np.ndarray:
        """What this array would hold for values x [..., width] (its storage's round trip)."""
        return self.storage.round_trip(x, self.pca)


class PaddedPart:
    """One folder of a padded cache (the cache, or one shard of it): `num_rows` rows."""

    def __init__(self, folder: Path, num_rows: int, p_len: int):
        self.folder, self.num_rows, self.p_len = folder, num_rows, p_len

    def rows(self, name: str) -> NumpyRows:
        """The token array `name` (ids, mask, offsets) as rows [num_rows, p_len(, 2)]."""
        tail = (2,) if name == "offsets" else ()
        return NumpyRows(load_array(self.folder / f"{name}.npy",
                                    (self.num_rows, self.p_len, *tail)))

    def stored(self, stem: str, storage: Storage, width: int) -> StoredArray:
        return StoredArray(self.folder, stem, storage, (self.num_rows, self.p_len, width))
