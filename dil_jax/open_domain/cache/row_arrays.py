"""Arrays whose rows are kept in several parts (the shards of a passage cache), read by global
row: `RowArray` and `gather_rows`, which read only the rows asked for from each part. Row i of
the whole is local row i - starts[s] of part s, where starts[s] <= i < starts[s + 1].

A part is a `RowSource`: anything with a shape, a dtype and `take(rows)` (a memory-mapped
`.npy` of a padded cache through `NumpyRows`, a ragged store's token array through
`dil_jax.open_domain.cache.ragged_store.RaggedRows`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np


class RowSource(Protocol):
    """Rows [shape[0], ...] read by local row."""

    shape: tuple[int, ...]
    dtype: np.dtype

    def take(self, rows: np.ndarray) -> np.ndarray:
        """[len(rows), *shape[1:]] those rows, in order."""


class NumpyRows:
    """A RowSource over an array (a read-only memory map: only the rows taken are read)."""

    def __init__(self, array: np.ndarray):
        self.array = array
        self.shape, self.dtype = tuple(array.shape), array.dtype

    def take(self, rows: np.ndarray) -> np.ndarray:
        return np.asarray(self.array[np.asarray(rows, np.int64)])


def _locate(starts: np.ndarray, num_rows: int, rows: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray]:
    """(shard, local row) of global rows [n] (negative ones count from the end), for shards
    holding rows starts[i] .. starts[i + 1] - 1. An empty shard repeats the next one's start;
    side="right" then picks the shard that holds the row."""
    rows = np.asarray(rows, np.int64)
    rows = np.where(rows < 0, rows + num_rows, rows)
    if rows.size and (rows.min() < 0 or rows.max() >= num_rows):
        raise IndexError(f"row out of range for a cache of {num_rows} rows")
    shard = np.searchsorted(starts, rows, side="right") - 1
    return shard, rows - starts[shard]


class RowArray:
    """One array of a cache whose rows are kept in several parts (shards), indexed by global
    row: `a[rows]`, `a[row, i, j]`, `a[start:stop]`. Only the rows asked for are read.

    parts: RowSources [rows_i, ...] (an array is read through `NumpyRows`: its own `take`
    flattens); starts: [num_parts] global row of each first row.
    """

    def __init__(self, parts: Sequence[RowSource | np.ndarray], starts: np.ndarray):
        self.parts = [NumpyRows(part) if isinstance(part, np.ndarray) else part
                      for part in parts]
        self.starts = np.asarray(starts, np.int64)
        self.shape = (sum(part.shape[0] for part in self.parts),) + tuple(self.parts[0].shape[1:])
        self.dtype = self.parts[0].dtype
        self.ndim = len(self.shape)

    def __len__(self) -> int:
        return self.shape[0]

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        return np.asarray(self[:], dtype)

    def __getitem__(self, key) -> np.ndarray:
        row_key, rest = (key[0], key[1:]) if isinstance(key, tuple) else (key, ())
        if isinstance(row_key, (int, np.integer)):
            return self.take(np.asarray([row_key]))[(0,) + rest]
        rows = (np.arange(len(self))[row_key] if isinstance(row_key, slice)
                else np.asarray(row_key, np.int64))
        return self.take(rows)[(slice(None),) + rest]

    def take(self, rows: np.ndarray) -> np.ndarray:
        """[len(rows), ...] those global rows, in order."""
        return gather_rows(self.starts, len(self), rows,
                           lambda s, local: self.parts[s].take(local), self.shape[1:],
                           self.dtype)


def gather_rows(starts: np.ndarray, num_rows: int, rows: np.ndarray,
                read: Callable[[int, np.ndarray], np.ndarray], tail: tuple[int, ...],
                dtype) -> np.ndarray:
    """[len(rows), *tail] rows gathered shard by shard: read(shard, local rows) -> their values."""
    shard, local = _locate(starts, num_rows, rows)
    if len(starts) == 1:
        return np.asarray(read(0, local))
    out = np.empty((len(local),) + tuple(tail), dtype)
    for s in np.unique(shard):
        chosen = shard == s
        out[chosen] = read(int(s), local[chosen])
    return out
