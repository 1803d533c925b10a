"""Arrays whose rows are kept in several parts (the shards of a passage cache), read by global
row: `RowArray` and `gather_rows`, which read only the rows asked for from each part's memory
map. Row i of the whole is local row i - starts[s] of part s, where starts[s] <= i <
starts[s + 1]."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np


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
    """One array of a cache whose rows are kept in several memory-mapped parts (shards), indexed
    by global row: `a[rows]`, `a[row, i, j]`, `a[start:stop]`. Only the rows asked for are read.

    parts: [rows_i, ...] arrays (memory maps); starts: [num_parts] global row of each first row.
    """

    def __init__(self, parts: Sequence[np.ndarray], starts: np.ndarray):
        self.parts, self.starts = list(parts), np.asarray(starts, np.int64)
        self.shape = (sum(len(part) for part in self.parts),) + tuple(self.parts[0].shape[1:])
        self.dtype = self.parts[0].dtype
        self.ndim = len(self.shape)

    def __len__(self) -> int:
        return self.shape[0]

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        return np.asarray(self[:], dtype)

    def __getitem__(self, key) -> np.ndarray:
        row_key, rest = (key[0], key[1:]) if isinstance(key, tuple) else (key, ())
        if isinstance(row_key, (int, np.integer)):
            (shard,), (local,) = _locate(self.starts, len(self), np.asarray([row_key]))
            return self.parts[shard][(local,) + rest]
        rows = (np.arange(len(self))[row_key] if isinstance(row_key, slice)
                else np.asarray(row_key, np.int64))
        return self.take(rows)[(slice(None),) + rest]

    def take(self, rows: np.ndarray) -> np.ndarray:
        """[len(rows), ...] those global rows, in order."""
        return gather_rows(self.starts, len(self), rows, lambda s, local: self.parts[s][local],
                       self.shape[1:], self.dtype)


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
