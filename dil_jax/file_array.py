"""An array in a file, read by rows with positional reads: what an open-domain index's readers
use instead of memory maps.

Why not a memory map: pages of a mapped file that a process touches count in its resident
memory (RssFile) for as long as the mapping lives, and the kernel maps them in blocks around each
touched page (fault-around, 64 KiB), so a server reading a few rows per question of a large
`windows.npz` grew towards the file's size. Rows read with `os.pread` go through the kernel's page
cache (shared, reclaimable) and leave nothing resident in the process but the rows copied out.

    FileArray(path, offset, shape, dtype)   a C-order array of `shape` at byte `offset`
    a[rows], a[row], a[start:stop], a[rows, i]   -> numpy (reads those rows only)
    np.asarray(a)                                -> the whole array (one read)
    a.row_range(start, stop)                     -> a FileArray of those rows (reads nothing)
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterator
from pathlib import Path

import numpy as np

# Rows of the whole array read at a time when it is iterated.
_ITER_ROWS = 1 << 16


def _pread_exact(fd: int, size: int, offset: int, path: Path) -> bytes:
    """`size` bytes at `offset` (a large read may come back in parts); OSError if the file
    ends first."""
    parts, done = [], 0
    while done < size:
        part = os.pread(fd, size - done, offset + done)
        if not part:
            raise OSError(f"{path}: ends at byte {offset + done}, {size - done} bytes short "
                          "(truncated?)")
        parts.append(part)
        done += len(part)
    return b"".join(parts)


class RowReader:
    """Row indexing over `_range(start, stop)` (rows start .. stop - 1, one read): a[rows],
    a[row], a[start:stop], a[rows, i], np.asarray(a), iteration; what FileArray and the
    windows file's padded-back rows (`index.windows.RaggedRows`) share. Subclasses set `shape`
    and `dtype` and name themselves in errors (`_name`)."""

    shape: tuple[int, ...]
    dtype: np.dtype
    _name = "an array"

    def _range(self, start: int, stop: int) -> np.ndarray:
        raise NotImplementedError

    def __len__(self) -> int:
        return self.shape[0]

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        whole = self._range(0, len(self))
        return whole if dtype is None else whole.astype(dtype)

    def __iter__(self) -> Iterator[np.ndarray]:
        for start in range(0, len(self), _ITER_ROWS):
            yield from self._range(start, min(start + _ITER_ROWS, len(self)))

    def __getitem__(self, key):
        row_key, rest = (key[0], key[1:]) if isinstance(key, tuple) else (key, ())
        if isinstance(row_key, (int, np.integer)):
            return self.take(np.asarray([row_key]))[(0,) + rest]
        if isinstance(row_key, slice):
            start, stop, step = row_key.indices(len(self))
            rows = (self._range(start, max(start, stop)) if step == 1
                    else self.take(np.arange(start, stop, step)))
        else:
            rows = self.take(np.asarray(row_key, np.int64))
        return rows[(slice(None),) + rest]

    def take(self, rows: np.ndarray) -> np.ndarray:
        """[len(rows), ...] those rows, in order (negative ones count from the end); one read
        per run of consecutive rows."""
        rows = np.asarray(rows, np.int64).reshape(-1)
        rows = np.where(rows < 0, rows + len(self), rows)
        if rows.size and (rows.min() < 0 or rows.max() >= len(self)):
            raise IndexError(f"row out of range for {self._name} of {len(self)} rows")
        out = np.empty((len(rows),) + self.shape[1:], self.dtype)
        breaks = np.flatnonzero(np.diff(rows) != 1) + 1
        for begin, end in zip(np.concatenate([[0], breaks]),
                              np.concatenate([breaks, [len(rows)]]), strict=True):
            if end > begin:
                out[begin:end] = self._range(int(rows[begin]), int(rows[begin]) + end - begin)
        return out


class FileArray(RowReader):
    """A read-only C-order array [shape] stored in the file at `path` from byte `offset`
    (module docstring). The file stays open while the array lives."""

    def __init__(self, path: Path, offset: int, shape: tuple[int, ...], dtype):
        self.path, self.offset = Path(path), int(offset)
        self.shape, self.dtype = tuple(int(n) for n in shape), np.dtype(dtype)
        self.ndim = len(self.shape)
        self.row_bytes = int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize
        self._fd = os.open(self.path, os.O_RDONLY)
        # Closed with the array (or at exit, while `os` is still there: not a __del__).
        weakref.finalize(self, os.close, self._fd)

    @property
    def _name(self) -> str:
        return str(self.path)

    def row_range(self, start: int, stop: int) -> FileArray:
        """Rows start .. stop - 1 as a FileArray of their own (a shard's rows): nothing read,
        where `a[start:stop]` reads them."""
        if not 0 <= start <= stop <= len(self):
            raise IndexError(f"rows {start}..{stop} of {self.path} of {len(self)} rows")
        return FileArray(self.path, self.offset + start * self.row_bytes,
                         (stop - start,) + self.shape[1:], self.dtype)

    def _range(self, start: int, stop: int) -> np.ndarray:
        """Rows start .. stop - 1, one read."""
        count = stop - start
        data = _pread_exact(self._fd, count * self.row_bytes,
                            self.offset + start * self.row_bytes, self.path)
        return np.frombuffer(data, self.dtype).reshape((count,) + self.shape[1:]).copy()


def npy_rows(path: Path) -> FileArray:
    """The .npy file at `path`, read by rows (`FileArray`); ValueError when it is not a C-order
    array file."""
    with Path(path).open("rb") as stream:
        version = np.lib.format.read_magic(stream)
        read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                       else np.lib.format.read_array_header_2_0)
        shape, fortran_order, dtype = read_header(stream)
        offset = stream.tell()
    if fortran_order and len(shape) > 1:
        raise ValueError(f"{path}: a Fortran-order array cannot be read by rows")
    array = FileArray(path, offset, shape, dtype)
    if os.path.getsize(path) < offset + len(array) * array.row_bytes:
        raise ValueError(f"{path}: shorter than its header says (truncated?)")
    return array
