"""One folder of a ragged cache (format /3): its arrays' names and shapes, and reading it by row.

A ragged folder (a cache, or one shard of a sharded cache; local, or at a URL) holds, besides
its manifest.json, one zarr v3 array per name (`dil_jax.open_domain.cache.zarr_store`), T being
the folder's real tokens (`num_tokens` in its manifest):

  token_starts   [rows + 1] int64   row r is tokens token_starts[r] .. token_starts[r + 1] - 1
  ids            [T] int32          `p [SEP]` token ids (padding reads back as the pad_id)
  offsets        [T, 2] int32       character offsets in the passage text (padding: NO_OFFSET)
  states         [T, code_width]    lower states in the storage's codes (absent for k = 0;
                                    pq<M>: [T, M] uint8)
  states.scale   [T] float32        per-token scales (scaled schemes)
  states.pca_mean [hidden], states.pca_basis [hidden, d] float32 (pca<d>; pq<M>: d = hidden,
                 the rotation), states.pq_codebook [M, 256, hidden / M] float32 (pq<M>): the
                 fitted side arrays (`storage.BASIS_SUFFIXES`), each stored whole
  upper_*        the first upper block's arrays (`reuse`), as states (`.scale` where scaled)

The mask is not stored: a row's real tokens are a prefix of it (`cache.ragged`). `RaggedPart`
reads rows [n] back as the padded arrays [n, p_len, ...] a padded cache gives.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dil_jax.open_domain.cache.errors import broken
from dil_jax.open_domain.cache.location import Location
from dil_jax.open_domain.cache.manifest import CacheManifest
from dil_jax.open_domain.cache.ragged import mask_of, token_index, unpack
from dil_jax.open_domain.cache.storage import PcaBasis, Storage
from dil_jax.open_domain.cache.zarr_store import (
    TokenGrid,
    create_array,
    open_array,
    read_all,
    read_tokens,
    write_tokens,
)
from dil_jax.tokenization import NO_OFFSET

TOKEN_STARTS = "token_starts"
# The token arrays: name -> (per-token shape, dtype, what padding slots read back as; None:
# the manifest's pad_id). All zstd-compressed (`zarr_store`).
TOKEN_ARRAYS = {"ids": ((), np.int32, None), "offsets": ((2,), np.int32, NO_OFFSET)}


def stored_arrays(stem: str, storage: Storage, width: int
                  ) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """The per-token arrays of one stored float array `stem` [rows, p_len, width]: name ->
    (per-token shape, dtype): the codes, and the scales of a scaled scheme."""
    arrays = {stem: ((storage.code_width(width),), storage.code_dtype)}
    if storage.scaled:
        arrays[f"{stem}.scale"] = ((), np.dtype(np.float32))
    return arrays


def write_pca(location: Location, stem: str, pca: PcaBasis) -> None:
    """Stores the side arrays of the array `stem` (`PcaBasis.arrays`, by `BASIS_SUFFIXES`)
    under `location`, each whole, as zarr arrays `{stem}.{suffix}`."""
    for suffix, array in pca.arrays().items():
        values, name = np.asarray(array, np.float32), f"{stem}.{suffix}"
        grid = TokenGrid(max(len(values), 1), max(len(values), 1))
        write_tokens(create_array(location, name, values.shape, np.float32, grid), 0, values,
                     location / name)


def read_pca(location: Location, stem: str, storage: Storage, width: int) -> PcaBasis | None:
    """The side arrays `write_pca` stored (None for a scheme without any); CacheBrokenError
    naming an array that is missing or not of the shape `Storage.basis_shapes` says."""
    side = {suffix: read_all(open_array(location, f"{stem}.{suffix}", shape, np.float32),
                             location / f"{stem}.{suffix}")
            for suffix, shape in storage.basis_shapes(width).items()}
    return PcaBasis.of(side) if side else None


class RaggedPart:
    """One ragged folder, read by local row (module docstring). Opening it opens every array
    (reads each `zarr.json`): a missing array, or one of another shape or dtype than the
    manifest implies, is CacheBrokenError naming it."""

    def __init__(self, location: Location, manifest: CacheManifest):
        self.location = location
        self.num_rows, self.p_len = manifest.num_passages, manifest.key.max_passage_len
        self.num_tokens, self.pad_id = manifest.num_tokens, manifest.pad_id
        self.starts = open_array(location, TOKEN_STARTS, (self.num_rows + 1,), np.int64)
        self.tokens = {name: open_array(location, name, (self.num_tokens, *tail), dtype)
                       for name, (tail, dtype, _) in TOKEN_ARRAYS.items()}

    def spans(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(first token [n], real tokens [n]) of local rows [n]; a token_starts that does not
        describe rows of 0..p_len tokens inside the arrays is CacheBrokenError."""
        rows = np.asarray(rows, np.int64)
        bounds = read_tokens(self.starts, np.concatenate([rows, rows + 1]),
                             self.location / TOKEN_STARTS)
        first, lengths = bounds[:len(rows)], bounds[len(rows):] - bounds[:len(rows)]
        if len(rows) and (lengths.min() < 0 or lengths.max() > self.p_len or first.min() < 0
                          or (first + lengths).max() > self.num_tokens):
            raise broken(self.location / TOKEN_STARTS,
                         f"rows of {lengths.min()}..{lengths.max()} tokens from token "
                         f"{first.min()}, the manifest says 0..{self.p_len} of "
                         f"{self.num_tokens}")
        return first, lengths

    def rows(self, name: str) -> RaggedRows:
        """The token array `name` (ids, mask, offsets) as rows [num_rows, p_len(, 2)]."""
        return RaggedRows(self, name)

    def stored(self, stem: str, storage: Storage, width: int) -> RaggedStoredArray:
        return RaggedStoredArray(self, stem, storage, width)


class RaggedRows:
    """ids, mask or offsets of a RaggedPart as padded rows (a `row_arrays.RowSource`)."""

    def __init__(self, part: RaggedPart, name: str):
        self.part, self.name = part, name
        tail = TOKEN_ARRAYS[name][0] if name in TOKEN_ARRAYS else ()
        self.shape = (part.num_rows, part.p_len, *tail)
        self.dtype = np.dtype(np.int32)

    def take(self, rows: np.ndarray) -> np.ndarray:
        first, lengths = self.part.spans(rows)
        if self.name == "mask":
            return mask_of(lengths, self.part.p_len)
        _, _, fill = TOKEN_ARRAYS[self.name]
        flat = read_tokens(self.part.tokens[self.name], token_index(first, lengths),
                           self.part.location / self.name)
        return unpack(flat, lengths, self.part.p_len,
                      self.part.pad_id if fill is None else fill, np.int32)


class RaggedStoredArray:
    """One float array [rows, p_len, width] of a RaggedPart in its storage (read-only):
    `read(rows)` decodes those rows' tokens and pads them with zeros."""

    def __init__(self, part: RaggedPart, stem: str, storage: Storage, width: int):
        self.part, self.storage, self.width = part, storage, width
        self.num_rows, self.p_len = part.num_rows, part.p_len
        self.path = part.location / stem
        self.arrays = {name: open_array(part.location, name, (part.num_tokens, *tail), dtype)
                       for name, (tail, dtype) in stored_arrays(stem, storage, width).items()}
        self.stem = stem
        self.pca = read_pca(part.location, stem, storage, width)

    def read(self, indices: Sequence[int]) -> np.ndarray:
        """[len(indices), p_len, width] float32: those rows, decoded (padding slots 0)."""
        first, lengths = self.part.spans(np.asarray(indices, np.int64))
        index = token_index(first, lengths)
        codes = read_tokens(self.arrays[self.stem], index, self.path)
        scale_name = f"{self.stem}.scale"
        scale = (read_tokens(self.arrays[scale_name], index, self.part.location / scale_name)
                 if scale_name in self.arrays else None)
        values = self.storage.decode(codes, scale, self.pca)
        return unpack(values, lengths, self.p_len, 0.0, np.float32)

    def round_trip(self, x: np.ndarray) -> np.ndarray:
        """What this array would hold for values x [..., width] (its storage's round trip)."""
        return self.storage.round_trip(x, self.pca)
